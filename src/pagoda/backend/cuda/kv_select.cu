#include "pagoda/backend/cuda/kv_select.h"

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kPoolHalf = 3;  // runtime/kv_compression.cpp: a 7-wide neighbourhood
constexpr float kSpanDecay = 0.97f;  // runtime::kKvSpanDecay

// Orders like the float (for non-NaN values; -0 counts as +0, as == does).
__device__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of `flag` over the CTA in thread order; `total` gets the CTA's count.
// Every thread of the CTA must call it (it synchronizes).
__device__ int block_exclusive_count(bool flag, int* warp_sums, int& total) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  if (warp == 0) {
    const int v = lane < kWarps ? warp_sums[lane] : 0;
    int inclusive = v;
    for (int d = 1; d < 32; d <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (lane < kWarps) warp_sums[lane] = inclusive - v;
    if (lane == 31) warp_sums[32] = inclusive;
  }
  __syncthreads();
  const int out = warp_sums[warp] + in_warp;
  total = warp_sums[32];
  __syncthreads();  // warp_sums is reused by the next call
  return out;
}

// Candidate i's cache index: candidates below gap_at are cache indices as they are, the rest sit
// gap_len further (a per-head compacted region's kept tokens, then the tokens after its holes).
__device__ __forceinline__ int32_t cache_index(int32_t i, int32_t gap_at, int32_t gap_len) {
  return i < gap_at ? i : i + gap_len;
}

// One head's choice, run by a whole CTA: scores s are indexed by cache index, out gets the kept
// cache indices (ascending), key is the head's scratch (at least its middle's length).
__device__ void select_head(const float* s, const KvSelectShape& shape, int32_t gap_at, int32_t gap_len, uint32_t* key,
                            int32_t* out) {
  const int32_t n = shape.num_valid;
  const int32_t middle_begin = shape.sinks, middle_end = n - shape.recent;
  const int32_t middle = middle_end - middle_begin;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < shape.sinks; i += kThreads)
    out[i] = cache_index(i, gap_at, gap_len);
  for (int32_t r = static_cast<int32_t>(threadIdx.x); r < shape.recent; r += kThreads)
    out[shape.sinks + shape.take + r] = cache_index(middle_end + r, gap_at, gap_len);
  if (shape.take <= 0) return;
  if (shape.take >= middle) {
    for (int32_t j = static_cast<int32_t>(threadIdx.x); j < middle; j += kThreads)
      out[shape.sinks + j] = cache_index(middle_begin + j, gap_at, gap_len);
    return;
  }
  for (int32_t j = static_cast<int32_t>(threadIdx.x); j < middle; j += kThreads) {
    const int32_t i = middle_begin + j;
    float v = s[cache_index(i, gap_at, gap_len)];
    if (shape.pooled) {
      // The CPU's arithmetic: a float sum in candidate order, divided by the count.
      const int32_t a = max(0, i - kPoolHalf), b = min(n, i + kPoolHalf + 1);
      float sum = 0.0f;
      for (int32_t k = a; k < b; ++k) sum = __fadd_rn(sum, s[cache_index(k, gap_at, gap_len)]);
      v = __fdiv_rn(sum, static_cast<float>(b - a));
    }
    key[j] = shape.span > 0 ? __float_as_uint(v) : order_key(v);
  }
  if (shape.span > 0) {
    // runtime::kv_span_scores over the pooled floats held in `key`: chunks from the last down, so
    // a chunk reads lower indices no one has rewritten yet; within a chunk all reads come first.
    __syncthreads();
    for (int32_t base = ((middle - 1) / kThreads) * kThreads; base >= 0; base -= kThreads) {
      const int32_t j = base + static_cast<int32_t>(threadIdx.x);
      float best = 0.0f;
      if (j < middle) {
        best = __uint_as_float(key[j]);
        float weight = 1.0f;
        for (int32_t k = 1; k <= shape.span && k <= j; ++k) {
          weight = __fmul_rn(weight, kSpanDecay);
          best = fmaxf(best, __fmul_rn(weight, __uint_as_float(key[j - k])));
        }
      }
      __syncthreads();
      if (j < middle) key[j] = order_key(best);
      __syncthreads();
    }
  }
  __shared__ int hist[256];
  __shared__ int chosen_digit, remaining, digit_count;
  __shared__ int warp_sums[33];
  uint32_t prefix = 0, mask = 0;
  int want = shape.take;  // rank from the top still to place
  __syncthreads();
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = static_cast<int>(threadIdx.x); d < 256; d += kThreads) hist[d] = 0;
    __syncthreads();
    for (int32_t j = static_cast<int32_t>(threadIdx.x); j < middle; j += kThreads) {
      const uint32_t v = key[j];
      if ((v & mask) == prefix) atomicAdd(&hist[(v >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, d = 255;
      for (; d > 0 && above + hist[d] < want; --d) above += hist[d];
      chosen_digit = d;
      remaining = want - above;
      digit_count = hist[d];
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(chosen_digit) << shift;
    mask |= 255u << shift;
    want = remaining;
    __syncthreads();  // thread 0 rewrites the shared picks next pass
  }
  // Keys above the threshold are kept; of those equal to it, the last `want` (the CPU's tie rule).
  const uint32_t threshold = prefix;
  const int equal_total = digit_count, equal_skip = equal_total - want;
  int equal_seen = 0, kept_seen = 0;
  for (int32_t base = 0; base < middle; base += kThreads) {
    const int32_t j = base + static_cast<int32_t>(threadIdx.x);
    const uint32_t v = j < middle ? key[j] : 0u;
    const bool equal = j < middle && v == threshold;
    int equal_count = 0, kept_count = 0;
    const int equal_before = equal_seen + block_exclusive_count(equal, warp_sums, equal_count);
    const bool keep = j < middle && (v > threshold || (equal && equal_before >= equal_skip));
    const int kept_before = kept_seen + block_exclusive_count(keep, warp_sums, kept_count);
    if (keep) out[shape.sinks + kept_before] = cache_index(middle_begin + j, gap_at, gap_len);
    equal_seen += equal_count;
    kept_seen += kept_count;
  }
}

__global__ void __launch_bounds__(kThreads)
    kv_select_kernel(const float* scores, int64_t score_stride, KvSelectShape shape, uint32_t* keys, int32_t* kept) {
  const int64_t head = blockIdx.x;
  const int64_t middle = static_cast<int64_t>(shape.num_valid) - shape.sinks - shape.recent;
  // Streaming passes no scratch (it takes nothing by score): no key is read or written then.
  select_head(scores + head * score_stride, shape, shape.num_valid, 0, keys == nullptr ? nullptr : keys + head * middle,
              kept + head * static_cast<int64_t>(shape.kept));
}

__global__ void __launch_bounds__(kThreads)
    kv_select_heads_kernel(const float* scores, int64_t score_stride, const KvSelectHead* heads, int32_t max_middle,
                           int32_t row_stride, uint32_t* keys, int32_t* kept) {
  const int64_t head = blockIdx.x;
  const KvSelectHead h = heads[head];
  select_head(scores + head * score_stride, h.shape, h.gap_at, h.gap_len,
              keys == nullptr ? nullptr : keys + head * static_cast<int64_t>(max_middle),
              kept + head * static_cast<int64_t>(row_stride));
}

__global__ void kv_build_moves_kernel(const int32_t* kept, int64_t total, int32_t kept_per_head, int32_t num_kv_heads,
                                      const int32_t* old_table, const int32_t* new_table, int32_t block_size,
                                      const float* mass, int64_t mass_stride, bool carry, KvVectorMove* moves,
                                      float* new_mass) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t head = t / kept_per_head;
  const int32_t k = static_cast<int32_t>(t % kept_per_head);
  const int32_t src = kept[t];
  KvVectorMove mv;
  mv.src_slot = static_cast<int64_t>(old_table[src / block_size]) * block_size + src % block_size;
  mv.dst_slot = static_cast<int64_t>(new_table[k / block_size]) * block_size + k % block_size;
  mv.head = static_cast<int32_t>(head % num_kv_heads);
  mv.unused = 0;
  moves[t] = mv;
  if (new_mass != nullptr) new_mass[t] = carry ? mass[head * mass_stride + src] : 0.0f;
}

// Row h holds head_kept[h] kept indices; the rest of its row_stride entries become skipped moves.
__global__ void kv_build_moves_ragged_kernel(const int32_t* kept, int64_t total, int32_t row_stride,
                                             const int32_t* head_kept, int32_t num_kv_heads, const int32_t* old_table,
                                             const int32_t* new_table, int32_t block_size, KvVectorMove* moves) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t head = t / row_stride;
  const int32_t k = static_cast<int32_t>(t % row_stride);
  KvVectorMove mv;
  mv.unused = 0;
  if (k >= head_kept[head]) {
    mv.src_slot = 0;
    mv.dst_slot = 0;
    mv.head = -1;  // kv_move_vectors skips it: the slot stays a hole
  } else {
    const int32_t src = kept[t];
    mv.src_slot = static_cast<int64_t>(old_table[src / block_size]) * block_size + src % block_size;
    mv.dst_slot = static_cast<int64_t>(new_table[k / block_size]) * block_size + k % block_size;
    mv.head = static_cast<int32_t>(head % num_kv_heads);
  }
  moves[t] = mv;
}

}  // namespace

KvSelectShape kv_select_shape(int32_t num_heads, int32_t num_valid, int32_t budget, int32_t sink_tokens,
                              int32_t window, bool streaming, bool pooled, int32_t span) {
  KvSelectShape s;
  s.num_heads = num_heads;
  s.num_valid = num_valid < 0 ? 0 : num_valid;
  s.pooled = pooled;
  s.span = pooled && span > 0 ? span : 0;
  if (s.num_valid == 0) return s;
  if (budget >= s.num_valid) {  // everything
    s.sinks = s.num_valid;
    s.kept = s.num_valid;
    return s;
  }
  budget = budget < 0 ? 0 : budget;
  s.sinks = sink_tokens < budget ? sink_tokens : budget;
  const int32_t rest = budget - s.sinks;
  s.recent = streaming ? rest : (window < rest ? window : rest);
  const int32_t middle = s.num_valid - s.recent - s.sinks;
  const int32_t by_score = budget - s.sinks - s.recent;
  s.take = by_score > 0 && middle > 0 ? (by_score < middle ? by_score : middle) : 0;
  s.kept = s.sinks + s.take + s.recent;
  return s;
}

size_t kv_select_scratch_bytes(const KvSelectShape& shape) {
  const int64_t middle = static_cast<int64_t>(shape.num_valid) - shape.sinks - shape.recent;
  return middle > 0 ? static_cast<size_t>(shape.num_heads) * static_cast<size_t>(middle) * sizeof(uint32_t) : 0;
}

cudaError_t kv_select_kept(const float* scores, int64_t score_stride, const KvSelectShape& shape, void* scratch,
                           int32_t* kept, cudaStream_t stream) {
  if (shape.num_heads <= 0 || shape.kept <= 0) return cudaSuccess;
  if (shape.sinks < 0 || shape.recent < 0 || shape.take < 0 || shape.kept != shape.sinks + shape.take + shape.recent ||
      shape.sinks + shape.recent > shape.num_valid || score_stride < shape.num_valid ||
      (shape.take > 0 && scratch == nullptr))
    return cudaErrorInvalidValue;
  kv_select_kernel<<<static_cast<unsigned>(shape.num_heads), kThreads, 0, stream>>>(
      scores, score_stride, shape, static_cast<uint32_t*>(scratch), kept);
  return cudaGetLastError();
}

cudaError_t kv_build_moves(const int32_t* kept, int32_t num_heads, int32_t kept_per_head, int32_t num_kv_heads,
                           const int32_t* old_table, const int32_t* new_table, int32_t block_size, const float* mass,
                           int64_t mass_stride, bool carry, KvVectorMove* moves, float* new_mass,
                           cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(num_heads) * kept_per_head;
  if (total <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || block_size <= 0) return cudaErrorInvalidValue;
  constexpr int kBuildThreads = 256;
  const unsigned grid = static_cast<unsigned>((total + kBuildThreads - 1) / kBuildThreads);
  kv_build_moves_kernel<<<grid, kBuildThreads, 0, stream>>>(kept, total, kept_per_head, num_kv_heads, old_table,
                                                            new_table, block_size, mass, mass_stride, carry, moves,
                                                            new_mass);
  return cudaGetLastError();
}

size_t kv_select_heads_scratch_bytes(int32_t num_heads, int32_t max_middle) {
  return num_heads > 0 && max_middle > 0
             ? static_cast<size_t>(num_heads) * static_cast<size_t>(max_middle) * sizeof(uint32_t)
             : 0;
}

cudaError_t kv_select_kept_heads(const float* scores, int64_t score_stride, const KvSelectHead* heads,
                                 int32_t num_heads, int32_t max_middle, int32_t row_stride, void* scratch,
                                 int32_t* kept, cudaStream_t stream) {
  if (num_heads <= 0 || row_stride <= 0) return cudaSuccess;
  if (heads == nullptr || kept == nullptr || max_middle < 0 || (max_middle > 0 && scratch == nullptr))
    return cudaErrorInvalidValue;
  kv_select_heads_kernel<<<static_cast<unsigned>(num_heads), kThreads, 0, stream>>>(
      scores, score_stride, heads, max_middle, row_stride, static_cast<uint32_t*>(scratch), kept);
  return cudaGetLastError();
}

cudaError_t kv_build_moves_ragged(const int32_t* kept, int32_t num_heads, int32_t row_stride, const int32_t* head_kept,
                                  int32_t num_kv_heads, const int32_t* old_table, const int32_t* new_table,
                                  int32_t block_size, KvVectorMove* moves, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(num_heads) * row_stride;
  if (total <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || block_size <= 0 || head_kept == nullptr) return cudaErrorInvalidValue;
  constexpr int kBuildThreads = 256;
  const unsigned grid = static_cast<unsigned>((total + kBuildThreads - 1) / kBuildThreads);
  kv_build_moves_ragged_kernel<<<grid, kBuildThreads, 0, stream>>>(kept, total, row_stride, head_kept, num_kv_heads,
                                                                   old_table, new_table, block_size, moves);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
