#include "pagoda/backend/cuda/kv_attention_mass.h"

#include <math.h>

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
constexpr float kLn2 = 0.693147180559945309f;

// Block-wide reduction of `group` values per thread (sum or max) into out[0, group); ends with a barrier.
template <bool kMax>
__device__ void block_reduce(float (&v)[kMaxGroup], int group, float* scratch, float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    float x = v[g];
    for (int offset = 16; offset > 0; offset /= 2) {
      const float o = __shfl_xor_sync(0xffffffffu, x, offset);
      x = kMax ? fmaxf(x, o) : x + o;
    }
    if (lane == 0) scratch[warp * kMaxGroup + g] = x;
  }
  __syncthreads();
  if (threadIdx.x < group) {
    float r = scratch[threadIdx.x];
    for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, scratch[w * kMaxGroup + threadIdx.x]) : r + scratch[w * kMaxGroup + threadIdx.x];
    out[threadIdx.x] = r;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    kv_mass_from_scores_kernel(const float* scores, int64_t score_stride, int32_t num_q_heads, int32_t num_kv_heads,
                               int32_t layer_index, const KvScoreItem* items, const KvScoreSequence* sequences) {
  __shared__ float scratch[kWarps * kMaxGroup];
  __shared__ float max_of[kMaxGroup], sum_of[kMaxGroup], terms_of[kMaxGroup];
  const KvScoreItem item = items[blockIdx.x];
  if (item.sequence < 0) return;  // a graph's padding slot (the whole CTA leaves before any barrier)
  const int head = static_cast<int>(blockIdx.y);
  const int group = num_q_heads / num_kv_heads;
  const KvScoreSequence seq = sequences[item.sequence];
  const float* rows = scores + (static_cast<int64_t>(item.row) * num_q_heads + static_cast<int64_t>(head) * group) * score_stride;
  int hole_begin = 0, hole_end = 0;
  if (seq.head_kept != nullptr) {
    hole_begin = seq.head_kept[static_cast<int64_t>(layer_index) * num_kv_heads + head];
    hole_end = seq.compacted_length;
  }
  const int n = item.query_index + 1;
  auto in_hole = [&](int pos) { return pos >= hole_begin && pos < hole_end; };

  // The maxima (natural-log units: the pass's).
  float v[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) v[g] = -INFINITY;
  for (int pos = threadIdx.x; pos < n; pos += kThreads) {
    if (in_hole(pos)) continue;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) v[g] = fmaxf(v[g], rows[g * score_stride + pos] * kLn2);
  }
  block_reduce<true>(v, group, scratch, max_of);
  // S = sum exp(s - m), T = sum exp(s - m) (s - m): the entropy is log S - T / S.
  float t[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) v[g] = t[g] = 0.0f;
  for (int pos = threadIdx.x; pos < n; pos += kThreads) {
    if (in_hole(pos)) continue;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) {
        const float x = rows[g * score_stride + pos] * kLn2 - max_of[g];
        const float e = expf(x);
        v[g] += e;
        t[g] += e * x;
      }
  }
  block_reduce<false>(v, group, scratch, sum_of);
  block_reduce<false>(t, group, scratch, terms_of);
  float* mass = seq.mass + (static_cast<int64_t>(layer_index) * num_kv_heads + head) * seq.capacity;
  for (int pos = threadIdx.x; pos < n; pos += kThreads) {
    if (in_hole(pos)) continue;
    float p = 0.0f;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) p += expf(rows[g * score_stride + pos] * kLn2 - max_of[g]) / sum_of[g];
    atomicAdd(mass + pos, p);
  }
  if (threadIdx.x == 0) {
    double entropy = 0.0;
    const int attended = n - max(0, min(hole_end, n) - hole_begin);
    if (attended > 1) {
      const double log_n = log(static_cast<double>(attended));
      for (int g = 0; g < group; ++g) {
        const double h = log(static_cast<double>(sum_of[g])) - static_cast<double>(terms_of[g]) / sum_of[g];
        entropy += h / log_n;
      }
    }
    atomicAdd(seq.entropy + static_cast<int64_t>(layer_index) * num_kv_heads + head, entropy);
  }
}

}  // namespace

cudaError_t kv_attention_mass_from_scores(const float* scores, int64_t score_stride, int32_t num_q_heads,
                                          int32_t num_kv_heads, int32_t layer_index, const KvScoreItem* items,
                                          int32_t num_items, const KvScoreSequence* sequences, cudaStream_t stream) {
  if (num_items <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 || num_q_heads / num_kv_heads > kMaxGroup ||
      score_stride <= 0 || scores == nullptr || items == nullptr || sequences == nullptr)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(num_kv_heads));
  kv_mass_from_scores_kernel<<<grid, kThreads, 0, stream>>>(scores, score_stride, num_q_heads, num_kv_heads,
                                                            layer_index, items, sequences);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
