#include "pagoda/backend/cuda/kv_attention_scores.h"

#include <math.h>

#include "pagoda/backend/cuda/attention/kv_dequant.cuh"

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxGroup = 8;
constexpr int64_t kTargetCtas = 1024;  // enough CTAs of kThreads to fill an H100 / H200 several times over

// Online softmax statistics of one query head: max m, S = sum exp(s - m),
// T = sum exp(s - m) (s - m), so that the entropy is log S - T / S.
struct Stats {
  float m;
  float s;
  float t;
};

__device__ Stats merge(Stats a, Stats b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  const float ea = expf(a.m - m), eb = expf(b.m - m);
  return {m, a.s * ea + b.s * eb, (a.t + (a.m - m) * a.s) * ea + (b.t + (b.m - m) * b.s) * eb};
}

// Dot products of the group's query rows (shared, f32) with the K vector of
// flat slot `slot`, head `head`.
__device__ void dots(const DevicePagedKvLayer& layer, int64_t slot, int head, const float* q_rows, int group,
                     float scale, float* out) {
  const int D = layer.head_dim;
  float acc[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
  const int64_t vector = slot * layer.num_kv_heads + head;
  float k[8];
  for (int i0 = 0; i0 < D; i0 += 8) {
    if (layer.key_dtype == kernels::KvQuant::kNone) {
      const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(layer.key) + vector * D + i0);
      const bf16* b = reinterpret_cast<const bf16*>(&w);
#pragma unroll
      for (int j = 0; j < 8; ++j) k[j] = __bfloat162float(b[j]);
    } else {
      const kernels::KvQuant format = layer.key_dtype;
      const uint8_t* codes = static_cast<const uint8_t*>(layer.key) + vector * kernels::kv_head_data_bytes(D, format);
      kernels::cuda::device::codes8_to_float(codes, i0, format, k);
      const int64_t record_vector = kernels::kv_scale_vector(slot, head, layer.block_size, layer.num_kv_heads);
      const uint32_t record = static_cast<const uint32_t*>(
          layer.key_scale)[record_vector * kernels::kv_scale_groups(D, format) + i0 / kernels::kv_scale_group_size(D, format)];
      const kernels::cuda::device::KvScale s = kernels::cuda::device::decode_scale_record(record, format);
#pragma unroll
      for (int j = 0; j < 8; ++j) k[j] = k[j] * s.scale + s.zero;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= group) break;
      const float* qg = q_rows + g * D + i0;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g] += qg[j] * k[j];
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) out[g] = acc[g] * scale;
}

// The group's query rows of `item` for KV head `head`, as f32, into shared memory (then a barrier).
__device__ void load_q_rows(const bf16* q, int64_t q_row_stride, const KvScoreItem& item, int head, int group, int D,
                            float* q_rows) {
  for (int i = threadIdx.x; i < group * D; i += kThreads)
    q_rows[i] = __bfloat162float(q[item.row * q_row_stride + static_cast<int64_t>(head * group) * D + i]);
  __syncthreads();
}

// The hole [begin, end) of (layer, KV head) in `seq` (empty without per-head holes).
struct Hole {
  int begin = 0;
  int end = 0;
  __device__ bool contains(int pos) const { return pos >= begin && pos < end; }
};
__device__ Hole hole_of(const KvScoreSequence& seq, int layer_index, int num_kv_heads, int head) {
  Hole h;
  if (seq.head_kept != nullptr) {
    h.begin = seq.head_kept[static_cast<int64_t>(layer_index) * num_kv_heads + head];
    h.end = seq.compacted_length;
  }
  return h;
}

// The CTA's split of [0, n): chunks of kThreads positions, every `splits`-th chunk from chunk `split`.
__device__ int first_position(int split) { return split * kThreads + static_cast<int>(threadIdx.x); }
__device__ int position_step(int splits) { return splits * kThreads; }

// Pass 1: per (item, KV head, split) the online softmax statistics of the group's query heads over
// the split's positions, into stats[((item * heads + head) * splits + split) * kMaxGroup + g].
__global__ void __launch_bounds__(kThreads)
    kv_score_stats_kernel(const bf16* q, int64_t q_row_stride, int32_t num_q_heads, float scale,
                          DevicePagedKvLayer layer, int32_t layer_index, const int32_t* block_tables,
                          const KvScoreItem* items,
                          const KvScoreSequence* sequences, int32_t splits, Stats* stats) {
  extern __shared__ float shared[];
  const int D = layer.head_dim;
  const int group = num_q_heads / layer.num_kv_heads;
  float* q_rows = shared;                                         // [group][D]
  Stats* partial = reinterpret_cast<Stats*>(q_rows + group * D);  // [warps][group]

  const KvScoreItem item = items[blockIdx.x];
  if (item.sequence < 0) return;  // a graph's padding slot (the whole CTA leaves before any barrier)
  const int head = static_cast<int>(blockIdx.y), split = static_cast<int>(blockIdx.z);
  const KvScoreSequence seq = sequences[item.sequence];
  const int32_t* table = block_tables + seq.table_offset;
  load_q_rows(q, q_row_stride, item, head, group, D, q_rows);

  const int n = item.query_index + 1;
  const int bs = layer.block_size;
  Stats st[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) st[g] = {-INFINITY, 0.0f, 0.0f};
  float s[kMaxGroup];
  const Hole hole = hole_of(seq, layer_index, layer.num_kv_heads, head);
  for (int pos = first_position(split); pos < n; pos += position_step(splits)) {
    if (hole.contains(pos)) continue;  // never read: a hole's slot holds nothing of this head
    const int64_t slot = static_cast<int64_t>(table[pos / bs]) * bs + pos % bs;
    dots(layer, slot, head, q_rows, group, scale, s);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) st[g] = merge(st[g], Stats{s[g], 1.0f, 0.0f});
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    for (int offset = 16; offset > 0; offset /= 2) {
      const Stats o{__shfl_xor_sync(0xffffffffu, st[g].m, offset), __shfl_xor_sync(0xffffffffu, st[g].s, offset),
                    __shfl_xor_sync(0xffffffffu, st[g].t, offset)};
      st[g] = merge(st[g], o);
    }
    if (lane == 0) partial[warp * group + g] = st[g];
  }
  __syncthreads();
  if (threadIdx.x < group) {
    Stats r = partial[threadIdx.x];
    for (int w = 1; w < kThreads / 32; ++w) r = merge(r, partial[w * group + threadIdx.x]);
    const int64_t cell = (static_cast<int64_t>(blockIdx.x) * gridDim.y + head) * splits + split;
    stats[cell * kMaxGroup + threadIdx.x] = r;
  }
}

// Pass 2: the splits' statistics merged (in split order, the same in every CTA of the head), then
// each of the split's positions' probability, summed over the group, added into the mass; split 0
// adds the heads' normalized entropies.
__global__ void __launch_bounds__(kThreads)
    kv_score_mass_kernel(const bf16* q, int64_t q_row_stride, int32_t num_q_heads, float scale,
                         DevicePagedKvLayer layer, int32_t layer_index, const int32_t* block_tables,
                         const KvScoreItem* items, const KvScoreSequence* sequences, int32_t splits,
                         const Stats* stats) {
  extern __shared__ float shared[];
  const int D = layer.head_dim;
  const int group = num_q_heads / layer.num_kv_heads;
  float* q_rows = shared;  // [group][D]
  __shared__ Stats total[kMaxGroup];

  const KvScoreItem item = items[blockIdx.x];
  if (item.sequence < 0) return;
  const int head = static_cast<int>(blockIdx.y), split = static_cast<int>(blockIdx.z);
  const KvScoreSequence seq = sequences[item.sequence];
  const int32_t* table = block_tables + seq.table_offset;
  if (threadIdx.x < group) {
    const int64_t cells = (static_cast<int64_t>(blockIdx.x) * gridDim.y + head) * splits;
    Stats r = stats[cells * kMaxGroup + threadIdx.x];
    for (int z = 1; z < splits; ++z) r = merge(r, stats[(cells + z) * kMaxGroup + threadIdx.x]);
    total[threadIdx.x] = r;
  }
  load_q_rows(q, q_row_stride, item, head, group, D, q_rows);  // its barrier publishes `total` too

  const int n = item.query_index + 1;
  const int bs = layer.block_size;
  float s[kMaxGroup];
  float* mass = seq.mass + (static_cast<int64_t>(layer_index) * layer.num_kv_heads + head) * seq.capacity;
  const Hole hole = hole_of(seq, layer_index, layer.num_kv_heads, head);
  for (int pos = first_position(split); pos < n; pos += position_step(splits)) {
    if (hole.contains(pos)) continue;
    const int64_t slot = static_cast<int64_t>(table[pos / bs]) * bs + pos % bs;
    dots(layer, slot, head, q_rows, group, scale, s);
    float p = 0.0f;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) p += expf(s[g] - total[g].m) / total[g].s;
    atomicAdd(mass + pos, p);
  }
  if (split == 0 && threadIdx.x == 0) {
    double entropy = 0.0;
    // The indices attended: [0, n) less the part of the hole below n.
    const int attended = n - max(0, min(hole.end, n) - hole.begin);
    if (attended > 1) {
      const double log_n = log(static_cast<double>(attended));
      for (int g = 0; g < group; ++g) {
        const double h = log(static_cast<double>(total[g].s)) - static_cast<double>(total[g].t) / total[g].s;
        entropy += h / log_n;
      }
    }
    atomicAdd(seq.entropy + static_cast<int64_t>(layer_index) * layer.num_kv_heads + head, entropy);
  }
}

}  // namespace

int32_t kv_attention_scores_splits(int32_t num_items, int32_t num_kv_heads) {
  const int64_t ctas = static_cast<int64_t>(num_items > 0 ? num_items : 1) * (num_kv_heads > 0 ? num_kv_heads : 1);
  const int64_t splits = (kTargetCtas + ctas - 1) / ctas;
  return static_cast<int32_t>(splits < 1 ? 1 : (splits > kMaxScoreSplits ? kMaxScoreSplits : splits));
}

size_t kv_attention_scores_scratch_bytes(int32_t num_items, int32_t num_kv_heads, int32_t splits) {
  if (num_items <= 0 || num_kv_heads <= 0 || splits <= 0) return 0;
  return static_cast<size_t>(num_items) * static_cast<size_t>(num_kv_heads) * static_cast<size_t>(splits) *
         kMaxGroup * sizeof(Stats);
}

cudaError_t kv_attention_scores(const bf16* q, int64_t q_row_stride, int32_t num_q_heads, float scale,
                                const DevicePagedKvLayer& layer, int32_t layer_index, const int32_t* block_tables,
                                const KvScoreItem* items, int32_t num_items, const KvScoreSequence* sequences,
                                int32_t splits, void* scratch, cudaStream_t stream) {
  if (num_items <= 0) return cudaSuccess;
  if (layer.num_kv_heads <= 0 || num_q_heads % layer.num_kv_heads != 0 ||
      num_q_heads / layer.num_kv_heads > kMaxGroup || layer.head_dim % 8 != 0 || splits < 1 ||
      splits > kMaxScoreSplits || scratch == nullptr)
    return cudaErrorInvalidValue;
  if (layer.key_dtype != kernels::KvQuant::kNone && layer.key_scale == nullptr) return cudaErrorInvalidValue;
  const int group = num_q_heads / layer.num_kv_heads;
  const size_t q_bytes = static_cast<size_t>(group) * layer.head_dim * sizeof(float);
  const size_t smem = q_bytes + static_cast<size_t>(kThreads / 32) * group * sizeof(Stats);
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(layer.num_kv_heads),
                  static_cast<unsigned>(splits));
  Stats* stats = static_cast<Stats*>(scratch);
  kv_score_stats_kernel<<<grid, kThreads, smem, stream>>>(q, q_row_stride, num_q_heads, scale, layer, layer_index,
                                                          block_tables, items, sequences, splits, stats);
  kv_score_mass_kernel<<<grid, kThreads, q_bytes, stream>>>(q, q_row_stride, num_q_heads, scale, layer, layer_index,
                                                            block_tables, items, sequences, splits, stats);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
