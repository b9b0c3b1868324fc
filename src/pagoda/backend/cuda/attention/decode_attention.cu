// Decode attention over the paged cache: one new token per sequence.
//
// One CTA = (one split of one sequence) x (q_heads_per_cta query heads of one
// GQA group), so each K/V vector loaded serves every query head of the tile.
// Each of the 4 warps walks its own tiles of positions through a private
// 3-stage cp.async pipeline (16-byte copies, zero-filled past the end), so up
// to 2 x 8 KB per warp are in flight without any CTA barrier in the loop.
// Inside a warp, kLanesPerToken lanes share one position (each holds 16 of
// its head_dim elements as two 16-byte chunks), dot products are reduced with
// xor shuffles and every lane group keeps its own online-softmax state; the
// groups, then the warps, are merged at the end. Splits of a long sequence
// write (o, log2-sum-exp) to the workspace and merge_splits_kernel combines
// them.

#include <cuda_bf16.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/attention_launch_internal.h"
#include "pagoda/backend/cuda/attention/decode_split_merge.cuh"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

constexpr int kDecodeWarps = 4;
constexpr int kDecodeStages = 3;
constexpr int kStageBytesPerWarp = 8192;  // K + V of one warp tile

template <int kHeadDim>
struct DecodeShape {
  static constexpr int kChunks = kHeadDim / 8;              // 16-byte chunks per vector
  static constexpr int kLanesPerToken = kChunks / 2;        // each lane holds two chunks
  static constexpr int kTokensPerStep = 32 / kLanesPerToken;
  static constexpr int kTileTokens = kStageBytesPerWarp / (kHeadDim * 2 * 2);
  static constexpr int kStepsPerTile = kTileTokens / kTokensPerStep;  // 4 for every head_dim
  static constexpr int kCopiesPerLane = kTileTokens * kChunks / 32;   // per K (and per V)
  static constexpr int kStageChunks = kTileTokens * kChunks * 2;      // uint4 per stage
};

template <int kHeadDim, int kHeads>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_attention_kernel(const AttentionDescriptor d, const __nv_bfloat16* __restrict__ q,
                            __nv_bfloat16* __restrict__ out) {
  using S = DecodeShape<kHeadDim>;
  extern __shared__ uint4 smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = lane / S::kLanesPerToken;
  const int sub = lane % S::kLanesPerToken;
  // Odd lane groups read their two chunks in the other order so that the 8
  // lanes of a shared-memory phase never hit the same banks (head_dim 64).
  const bool swapped = group & 1;
  const int chunk_first = swapped ? sub + S::kLanesPerToken : sub;
  const int chunk_second = swapped ? sub : sub + S::kLanesPerToken;

  allow_merge_launch();
  DecodeWorkItem w = load_decode_work_item(d, blockIdx.y, blockIdx.x, kHeads);
  if (w.sequence < 0) return;  // unused item of a graph-mode plan
  load_decode_holes(d, w);
  const int kv_begin = w.kv_begin, kv_end = w.kv_end, q_head0 = w.q_head0, token = w.token;
  const int32_t* table = w.table;
  const auto* key = static_cast<const __nv_bfloat16*>(d.key);
  const auto* value = static_cast<const __nv_bfloat16*>(d.value);
  const int64_t head_offset = int64_t{w.kv_head} * kHeadDim;

  // Query vectors, pre-scaled so that scores come out in log2 units.
  float qf[kHeads][16];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const uint4* row = reinterpret_cast<const uint4*>(
        q + (int64_t{token} * d.num_q_heads + q_head0 + h) * kHeadDim);
    bf16x8_to_float(row[chunk_first], qf[h]);
    bf16x8_to_float(row[chunk_second], qf[h] + 8);
#pragma unroll
    for (int e = 0; e < 16; ++e) qf[h][e] *= d.scale_log2;
  }

  float m[kHeads], l[kHeads], acc[kHeads][16];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = kNoScore;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[h][e] = 0.0f;
  }

  uint4* warp_smem = smem + warp * kDecodeStages * S::kStageChunks;
  const int num_tiles = (kv_end - kv_begin + S::kTileTokens - 1) / S::kTileTokens;
  const int my_tiles = warp < num_tiles ? (num_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;

  auto issue_tile = [&](int my_index) {
    uint4* stage = warp_smem + (my_index % kDecodeStages) * S::kStageChunks;
    const int pos0 = kv_begin + (warp + my_index * kDecodeWarps) * S::kTileTokens;
#pragma unroll
    for (int k = 0; k < S::kCopiesPerLane; ++k) {
      const int idx = lane + 32 * k;
      const int t = idx / S::kChunks;
      const int c = idx % S::kChunks;
      const int pos = pos0 + t;
      const bool valid = w.live(pos);  // past the end or in a hole: zero-filled, never read
      const int block = valid ? __ldg(table + (pos >> d.log2_block_size)) : 0;  // ld.global.nc: w.table is a generic pointer
      const int64_t offset = int64_t{block} * d.block_stride +
                             int64_t{pos & (d.block_size - 1)} * d.token_stride + head_offset +
                             c * 8;
      cp_async_16(stage + t * S::kChunks + c, key + offset, valid);
      cp_async_16(stage + S::kTileTokens * S::kChunks + t * S::kChunks + c, value + offset, valid);
    }
  };

#pragma unroll
  for (int s = 0; s < kDecodeStages - 1; ++s) {
    if (s < my_tiles) issue_tile(s);
    cp_async_commit();
  }

  for (int i = 0; i < my_tiles; ++i) {
    if (i + kDecodeStages - 1 < my_tiles) issue_tile(i + kDecodeStages - 1);
    cp_async_commit();
    cp_async_wait<kDecodeStages - 1>();
    __syncwarp();

    const uint4* stage = warp_smem + (i % kDecodeStages) * S::kStageChunks;
    const uint4* stage_v = stage + S::kTileTokens * S::kChunks;
    const int pos0 = kv_begin + (warp + i * kDecodeWarps) * S::kTileTokens;

    float s[S::kStepsPerTile][kHeads];
#pragma unroll
    for (int u = 0; u < S::kStepsPerTile; ++u) {
      const int t = group + u * S::kTokensPerStep;
      float kf[16];
      bf16x8_to_float(stage[t * S::kChunks + chunk_first], kf);
      bf16x8_to_float(stage[t * S::kChunks + chunk_second], kf + 8);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; ++e) dot = fmaf(qf[h][e], kf[e], dot);
        s[u][h] = dot;
      }
    }
#pragma unroll
    for (int offset = S::kLanesPerToken / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int u = 0; u < S::kStepsPerTile; ++u)
#pragma unroll
        for (int h = 0; h < kHeads; ++h) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], offset);
    }
#pragma unroll
    for (int u = 0; u < S::kStepsPerTile; ++u) {
      if (!w.live(pos0 + group + u * S::kTokensPerStep)) {
#pragma unroll
        for (int h = 0; h < kHeads; ++h) s[u][h] = -INFINITY;
      }
    }
    // Token eviction's scores (AttentionDescriptor::scores; off: one uniform branch per tile): every
    // lane of a token holds its whole score after the shuffles; lane sub 0 writes the live ones.
    if (d.scores != nullptr && sub == 0) {
#pragma unroll
      for (int u = 0; u < S::kStepsPerTile; ++u) {
        const int pos = pos0 + group + u * S::kTokensPerStep;
        if (!w.live(pos)) continue;
#pragma unroll
        for (int h = 0; h < kHeads; ++h)
          d.scores[(int64_t{w.token} * d.num_q_heads + w.q_head0 + h) * d.score_stride + pos] = s[u][h];
      }
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float tile_max = s[0][h];
#pragma unroll
      for (int u = 1; u < S::kStepsPerTile; ++u) tile_max = fmaxf(tile_max, s[u][h]);
      const float m_new = fmaxf(m[h], tile_max);
      const float correction = exp2f(m[h] - m_new);
      m[h] = m_new;
      l[h] *= correction;
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[h][e] *= correction;
#pragma unroll
      for (int u = 0; u < S::kStepsPerTile; ++u) {
        s[u][h] = exp2f(s[u][h] - m_new);  // now a probability weight
        l[h] += s[u][h];
      }
    }
#pragma unroll
    for (int u = 0; u < S::kStepsPerTile; ++u) {
      const int t = group + u * S::kTokensPerStep;
      float vf[16];
      bf16x8_to_float(stage_v[t * S::kChunks + chunk_first], vf);
      bf16x8_to_float(stage_v[t * S::kChunks + chunk_second], vf + 8);
#pragma unroll
      for (int h = 0; h < kHeads; ++h)
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[h][e] = fmaf(s[u][h], vf[e], acc[h][e]);
    }
    __syncwarp();
  }

  // Merge the lane groups of this warp. The partner at xor kLanesPerToken has
  // the other chunk order, so its halves are exchanged crosswise.
#pragma unroll
  for (int offset = S::kLanesPerToken; offset < 32; offset *= 2) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[h], offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[h], offset);
      const float m_new = fmaxf(m[h], m_other);
      const float mine = exp2f(m[h] - m_new);
      const float theirs = exp2f(m_other - m_new);
      m[h] = m_new;
      l[h] = l[h] * mine + l_other * theirs;
      float other[16];
#pragma unroll
      for (int e = 0; e < 16; ++e)
        other[e] = __shfl_xor_sync(0xffffffffu, acc[h][offset == S::kLanesPerToken ? (e ^ 8) : e],
                                   offset);
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[h][e] = acc[h][e] * mine + other[e] * theirs;
    }
  }

  // Merge the warps through shared memory (the stages are free now).
  __syncthreads();
  const WarpPartials<kDecodeWarps, kHeads, kHeadDim> partials(reinterpret_cast<float*>(smem));
  if (group == 0) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float* dst = partials.acc_row(warp, h);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        dst[chunk_first * 8 + e] = acc[h][e];
        dst[chunk_second * 8 + e] = acc[h][8 + e];
      }
      if (sub == 0) {
        partials.m[warp * kHeads + h] = m[h];
        partials.l[warp * kHeads + h] = l[h];
      }
    }
  }
  __syncthreads();
  write_decode_result(d, w, partials, out);
}

// The split merge: one warp per (sequence, query head), kMergeWarps heads per
// CTA, each lane owning kHeadDim / 32 consecutive elements. The splits'
// log2-sum-exps are read one per lane (32 splits per pass) and reduced with
// shuffles, so a long sequence's many splits cost a few dependent loads rather
// than one per split; the partial rows are then summed in split order, four
// splits' loads in flight at a time (the same sums, in the same order, as one
// thread per element would form). A sequence with one split returns at once
// (the decode kernel wrote its rows), so the grid is sequences x heads / 4 CTAs
// of which most exit at large batches.
constexpr int kMergeWarps = 4;
constexpr int kMergeUnroll = 4;

// kCols consecutive floats (2, 4 or 8; the row offset keeps them 8- or 16-byte aligned) as vector loads.
template <int kCols>
__device__ __forceinline__ void load_merge_cols(const float* src, float (&dst)[kCols]) {
  if constexpr (kCols % 4 == 0) {
#pragma unroll
    for (int c = 0; c < kCols; c += 4) {
      const float4 v = *reinterpret_cast<const float4*>(src + c);
      dst[c] = v.x, dst[c + 1] = v.y, dst[c + 2] = v.z, dst[c + 3] = v.w;
    }
  } else {
    static_assert(kCols == 2, "head_dim 64, 128 or 256");
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x, dst[1] = v.y;
  }
}

template <int kHeadDim>
__global__ void merge_splits_kernel(const AttentionDescriptor d, __nv_bfloat16* __restrict__ out) {
  constexpr int kCols = kHeadDim / 32;
  const int sequence = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int q_head = blockIdx.y * kMergeWarps + threadIdx.x / 32;
  const int first = d.split_start[sequence];
  const int last = d.split_start[sequence + 1];
  // The decode grid's partials are complete. Every CTA waits, also those with nothing to merge, so that this
  // grid completes only after the decode grid: a kernel launched programmatically after the merge (the o
  // projection's GEMV) waits on this grid alone.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::);  // the o projection's GEMV may stream its weights
  if (last - first <= 1 || q_head >= d.num_q_heads) return;  // one split: written directly by the decode kernel
  const float* partial_o = d.workspace;
  const float* partial_lse = d.workspace + int64_t{d.num_work_items} * d.num_q_heads * kHeadDim;
  const auto lse_of = [&](int i) { return i < last ? partial_lse[int64_t{i} * d.num_q_heads + q_head] : kNoScore; };
  float m_all = kNoScore;
  for (int base = first; base < last; base += 32) m_all = fmaxf(m_all, lse_of(base + lane));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, offset));
  const auto row_of = [&](int i) { return partial_o + (int64_t{i} * d.num_q_heads + q_head) * kHeadDim + lane * kCols; };
  float sum = 0.0f;
  float o[kCols] = {};
  for (int base = first; base < last; base += 32) {
    const float lane_weight = exp2f(lse_of(base + lane) - m_all);  // this lane's split of the pass
    const int count = min(32, last - base);
    for (int s0 = 0; s0 < count; s0 += kMergeUnroll) {
      float rows[kMergeUnroll][kCols];
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) {
        if (s0 + u >= count) break;
        load_merge_cols<kCols>(row_of(base + s0 + u), rows[u]);
      }
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) {
        if (s0 + u >= count) break;
        const float weight = __shfl_sync(0xffffffffu, lane_weight, s0 + u);
        sum += weight;
#pragma unroll
        for (int c = 0; c < kCols; ++c) o[c] += weight * rows[u][c];
      }
    }
  }
  // sum == 0 only when every split lies in a hole: zeros, as the decode kernel writes for an empty range.
  __nv_bfloat16* dst = out + (int64_t{d.query_start[sequence]} * d.num_q_heads + q_head) * kHeadDim + lane * kCols;
#pragma unroll
  for (int c = 0; c < kCols; ++c) dst[c] = __float2bfloat16(sum > 0.0f ? o[c] / sum : 0.0f);
}

template <int kHeadDim, int kHeads>
cudaError_t launch_decode_variant(const AttentionDescriptor& d, const __nv_bfloat16* q,
                                  __nv_bfloat16* out, cudaStream_t stream) {
  constexpr int smem_bytes = kDecodeWarps * kDecodeStages * kStageBytesPerWarp;
  static_assert(smem_bytes >= WarpPartials<kDecodeWarps, kHeads, kHeadDim>::kFloats * 4,
                "the warp merge reuses the stage memory");
  return launch_split_decode<decode_attention_kernel<kHeadDim, kHeads>, smem_bytes, kDecodeWarps * 32>(
      d, q, out, stream);
}

template <int kHeadDim>
cudaError_t launch_decode_for_dim(const AttentionDescriptor& d, const __nv_bfloat16* q,
                                  __nv_bfloat16* out, cudaStream_t stream) {
  switch (d.q_heads_per_cta) {
    case 1: return launch_decode_variant<kHeadDim, 1>(d, q, out, stream);
    case 2: return launch_decode_variant<kHeadDim, 2>(d, q, out, stream);
    case 4: return launch_decode_variant<kHeadDim, 4>(d, q, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_decode_merge(const AttentionDescriptor& d, void* out, cudaStream_t stream) {
  // A programmatic dependent launch: the merge grid is scheduled while the
  // decode kernel still runs (it calls allow_merge_launch) and waits for its
  // results in griddepcontrol.wait. It neither gained nor lost beyond the
  // run-to-run spread (docs/KERNELS.md); kept because every timing since was
  // taken with it.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(d.num_sequences, (d.num_q_heads + kMergeWarps - 1) / kMergeWarps);
  config.blockDim = dim3(kMergeWarps * 32);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  auto* const bf16_out = static_cast<__nv_bfloat16*>(out);
  switch (d.head_dim) {
    case 64: return cudaLaunchKernelEx(&config, merge_splits_kernel<64>, d, bf16_out);
    case 128: return cudaLaunchKernelEx(&config, merge_splits_kernel<128>, d, bf16_out);
    case 256: return cudaLaunchKernelEx(&config, merge_splits_kernel<256>, d, bf16_out);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t prepare_decode_attention() {
  // A launch with zero work items sets the attribute and enqueues nothing.
  AttentionDescriptor empty;
  for (int head_dim : {64, 128, 256}) {
    for (int heads : {1, 2, 4}) {
      empty.head_dim = head_dim;
      empty.q_heads_per_cta = heads;
      const cudaError_t err = launch_decode_attention(empty, nullptr, nullptr, nullptr);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

cudaError_t launch_decode_attention(const AttentionDescriptor& d, const void* q, void* out,
                                    cudaStream_t stream) {
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  switch (d.head_dim) {
    case 64: return launch_decode_for_dim<64>(d, qb, ob, stream);
    case 128: return launch_decode_for_dim<128>(d, qb, ob, stream);
    case 256: return launch_decode_for_dim<256>(d, qb, ob, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace pagoda::kernels::cuda
