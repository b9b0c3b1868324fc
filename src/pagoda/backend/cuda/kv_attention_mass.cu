#include "pagoda/backend/cuda/kv_attention_mass.h"

#include <math.h>

namespace pagoda::cuda {
namespace {

// One CTA per (item, KV head) reads its group's rows twice: a long row (tens of thousands of positions) is
// latency bound, so the CTA is as wide as it can be and the statistics take one online pass, not two.
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
constexpr float kLn2 = 0.693147180559945309f;

// Softmax statistics of some scores x (log2 units) relative to their maximum m:
// s = sum 2^(x - m), t = sum 2^(x - m) (x - m). Empty: m = -inf, s = t = 0.
struct Stats {
  float m, s, t;
};

__device__ __forceinline__ Stats merge(Stats a, Stats b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  Stats r{m, 0.0f, 0.0f};
  if (a.s > 0.0f) {
    const float d = a.m - m, f = exp2f(d);
    r.s += a.s * f;
    r.t += f * (a.t + a.s * d);
  }
  if (b.s > 0.0f) {
    const float d = b.m - m, f = exp2f(d);
    r.s += b.s * f;
    r.t += f * (b.t + b.s * d);
  }
  return r;
}

// Adds one score x to a thread's statistics.
__device__ __forceinline__ void add(Stats& a, float x) {
  if (x > a.m) {
    const float d = a.m - x;  // -inf for an empty a: f = 0 and the old terms vanish
    const float f = exp2f(d);
    a.t = a.s > 0.0f ? f * (a.t + a.s * d) : 0.0f;
    a.s = a.s * f + 1.0f;
    a.m = x;
  } else {
    const float d = x - a.m, e = exp2f(d);
    a.s += e;
    a.t += e * d;
  }
}

__global__ void __launch_bounds__(kThreads)
    kv_mass_from_scores_kernel(const float* scores, int64_t score_stride, int32_t num_q_heads, int32_t num_kv_heads,
                               int32_t layer_index, const KvScoreItem* items, const KvScoreSequence* sequences) {
  __shared__ Stats partial[kWarps][kMaxGroup];
  __shared__ float max_of[kMaxGroup], inv_sum_of[kMaxGroup];
  __shared__ Stats total[kMaxGroup];
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

  // Pass 1: each query head's maximum, sum and entropy terms, online.
  Stats st[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) st[g] = Stats{-INFINITY, 0.0f, 0.0f};
  for (int pos = threadIdx.x; pos < n; pos += kThreads) {
    if (in_hole(pos)) continue;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) add(st[g], rows[g * score_stride + pos]);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    Stats x = st[g];
    for (int offset = 16; offset > 0; offset /= 2) {
      const Stats o{__shfl_xor_sync(0xffffffffu, x.m, offset), __shfl_xor_sync(0xffffffffu, x.s, offset),
                    __shfl_xor_sync(0xffffffffu, x.t, offset)};
      x = merge(x, o);
    }
    if (lane == 0) partial[warp][g] = x;
  }
  __syncthreads();
  if (threadIdx.x < group) {
    Stats r = partial[0][threadIdx.x];
    for (int w = 1; w < kWarps; ++w) r = merge(r, partial[w][threadIdx.x]);
    total[threadIdx.x] = r;
    max_of[threadIdx.x] = r.m;
    inv_sum_of[threadIdx.x] = r.s > 0.0f ? 1.0f / r.s : 0.0f;
  }
  __syncthreads();
  // Pass 2: the probabilities, summed over the group, into the mass.
  float* mass = seq.mass + (static_cast<int64_t>(layer_index) * num_kv_heads + head) * seq.capacity;
  for (int pos = threadIdx.x; pos < n; pos += kThreads) {
    if (in_hole(pos)) continue;
    float p = 0.0f;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < group) p += exp2f(rows[g * score_stride + pos] - max_of[g]) * inv_sum_of[g];
    atomicAdd(mass + pos, p);
  }
  if (threadIdx.x == 0) {
    // Natural-log entropy: H = ln S - T ln 2 / S (t is in log2 units).
    double entropy = 0.0;
    const int attended = n - max(0, min(hole_end, n) - hole_begin);
    if (attended > 1) {
      const double log_n = log(static_cast<double>(attended));
      for (int g = 0; g < group; ++g) {
        const double sum = total[g].s;
        const double h = log(sum) - static_cast<double>(total[g].t) * static_cast<double>(kLn2) / sum;
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
