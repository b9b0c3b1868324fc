// Per-row sampling on the GPU (sampling.h): thresholds by bisection over the
// logits' order-preserving keys, Gumbel-max over the survivors.
//
// A token survives when it passes three cuts, each "key > K, or key == K and
// id < cut_id": min-p (a key threshold, no id cut), top-k and top-p. Counts and
// masses are summed in double so the top-p boundary agrees with the CPU
// sampler's double arithmetic except within ~1e-12 of the target.
#include <cfloat>
#include <climits>
#include <cmath>

#include "pagoda/backend/cuda/sampling.h"

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kProbes = 3;  // thresholds tested per pass: 2 bits of the key per pass

struct Cut {
  uint32_t key;
  int32_t id;  // tokens with key == this key survive when their id < id
};

__host__ __device__ inline uint32_t philox_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                 uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

__host__ __device__ inline uint32_t draw_bits(uint64_t seed, uint64_t step, int32_t token) {
  return philox_first(static_cast<uint32_t>(token), static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                      0x5A6D70u, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// NaN -> -inf, -0 -> +0, then the float's bits made order-preserving as unsigned.
__device__ __forceinline__ float clean(float v) { return isnan(v) ? -INFINITY : v + 0.0f; }
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}
__device__ __forceinline__ bool passes(const Cut& c, uint32_t key, int32_t id) {
  return key > c.key || (key == c.key && id < c.id);
}

// Calls fn(logit, id) for this thread's share of the row. When vocab % 4 == 0
// (every row then starts 16-byte aligned) it loads float4s, four in flight
// per thread: the passes are bound by load latency, not by bandwidth.
template <typename Fn>
__device__ __forceinline__ void for_each_logit(const float* row, int32_t vocab, Fn fn) {
  if ((vocab & 3) != 0) {
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) fn(row[i], i);
    return;
  }
  const float4* row4 = reinterpret_cast<const float4*>(row);
  const int32_t n4 = vocab >> 2;
  int32_t i = threadIdx.x;
  for (; i + 3 * kThreads < n4; i += 4 * kThreads) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldg(row4 + i + u * kThreads);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int32_t id = 4 * (i + u * kThreads);
      fn(v[u].x, id);
      fn(v[u].y, id + 1);
      fn(v[u].z, id + 2);
      fn(v[u].w, id + 3);
    }
  }
  for (; i < n4; i += kThreads) {
    const float4 v = __ldg(row4 + i);
    fn(v.x, 4 * i);
    fn(v.y, 4 * i + 1);
    fn(v.z, 4 * i + 2);
    fn(v.w, 4 * i + 3);
  }
}

// Sums N values over the block; every thread gets the totals. Fixed order, so
// every thread (and every run) sees the same bits.
template <int N, typename T>
__device__ void block_sum(T (&v)[N], T* shared /* [N * kWarps] */) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], offset);
    if (lane == 0) shared[j * kWarps + warp] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    T s = 0;
    for (int w = 0; w < kWarps; ++w) s += shared[j * kWarps + w];
    v[j] = s;
  }
  __syncthreads();
}

// Best (value, id) over the block: larger value, then smaller id.
__device__ __forceinline__ void keep_better(float& best, int32_t& best_id, float value, int32_t id) {
  if (value > best || (value == best && id < best_id)) {
    best = value;
    best_id = id;
  }
}
__device__ void block_best(float& best, int32_t& best_id, float* shared_value, int32_t* shared_id) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int32_t other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    keep_better(best, best_id, other, other_id);
  }
  if (lane == 0) {
    shared_value[warp] = best;
    shared_id[warp] = best_id;
  }
  __syncthreads();
  best = shared_value[0];
  best_id = shared_id[0];
  for (int w = 1; w < kWarps; ++w) keep_better(best, best_id, shared_value[w], shared_id[w]);
  __syncthreads();
}

// Smallest key over the block.
__device__ uint32_t block_min_key(uint32_t key, int32_t* shared /* [kWarps] */) {
  // Flipping the sign bit makes signed order equal unsigned order.
  int32_t v = static_cast<int32_t>(key ^ 0x80000000u);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < kWarps; ++w) v = min(v, shared[w]);
  __syncthreads();
  return static_cast<uint32_t>(v) ^ 0x80000000u;
}

// The id one past the `need`-th (1-based) token in id order for which
// match(id) holds; INT_MAX when fewer match. Threads own contiguous id ranges
// so an exclusive scan of their match counts orders the matches by id.
template <typename Match>
__device__ int32_t id_after_nth_match(int32_t vocab, double need, Match match, int32_t* shared /* [kWarps + 1] */) {
  const int32_t chunk = (vocab + kThreads - 1) / kThreads;
  const int32_t begin = min(vocab, static_cast<int32_t>(threadIdx.x) * chunk), end = min(vocab, begin + chunk);
  int32_t count = 0;
  for (int32_t i = begin; i < end; ++i) count += match(i) ? 1 : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t inclusive = count;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int32_t other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) shared[warp] = inclusive;
  if (threadIdx.x == 0) shared[kWarps] = INT_MAX;
  __syncthreads();
  int32_t before = inclusive - count;
  for (int w = 0; w < warp; ++w) before += shared[w];
  const int32_t n = static_cast<int32_t>(need);
  if (before < n && n <= before + count) {
    int32_t seen = before;
    for (int32_t i = begin; i < end; ++i) {
      if (match(i) && ++seen == n) {
        shared[kWarps] = i + 1;
        break;
      }
    }
  }
  __syncthreads();
  const int32_t result = shared[kWarps];
  __syncthreads();
  return result;
}

// Largest key K in [lo, hi) with measure(K) >= target, where measure(key) is
// non-increasing; measure(lo) >= target > measure(hi) on entry. measure sums
// (count, mass) of the tokens at or above a probe key. On return lo = K and
// at_lo / at_hi hold the (count, mass) at K and at K + 1.
template <typename Contribution>
__device__ void bisect(uint64_t& lo, uint64_t& hi, double target, bool by_mass, double (&at_lo)[2],
                       double (&at_hi)[2], const float* row, int32_t vocab, Contribution contribution,
                       double* shared /* [2 * kProbes * kWarps] */) {
  while (hi - lo > 1) {
    uint64_t probe[kProbes];
#pragma unroll
    for (int j = 0; j < kProbes; ++j) probe[j] = lo + (hi - lo) * (j + 1) / (kProbes + 1);
    double sums[2 * kProbes];
#pragma unroll
    for (int j = 0; j < 2 * kProbes; ++j) sums[j] = 0.0;
    for_each_logit(row, vocab, [&](float raw, int32_t i) {
      const float v = clean(raw);
      const uint32_t key = order_key(v);
      if (key < probe[0]) return;
      const double mass = contribution(v, key, i);  // < 0: not a survivor
      if (mass < 0.0) return;
#pragma unroll
      for (int j = 0; j < kProbes; ++j) {
        if (key >= probe[j]) {
          sums[j] += 1.0;
          sums[kProbes + j] += mass;
        }
      }
    });
    block_sum<2 * kProbes>(sums, shared);
    // Probes ascend, measures descend: move lo up to the last probe that still
    // reaches the target and hi down to the first that does not.
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      const double measure = by_mass ? sums[kProbes + j] : sums[j];
      if (probe[j] <= lo || probe[j] >= hi) continue;
      if (measure >= target) {
        lo = probe[j];
        at_lo[0] = sums[j];
        at_lo[1] = sums[kProbes + j];
      } else {
        hi = probe[j];
        at_hi[0] = sums[j];
        at_hi[1] = sums[kProbes + j];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int32_t vocab,
                                                          const GpuSamplingParams* __restrict__ params,
                                                          int32_t* __restrict__ tokens, float* __restrict__ logprobs) {
  __shared__ double shared_sums[2 * kProbes * kWarps];
  __shared__ float shared_value[kWarps];
  __shared__ int32_t shared_id[kWarps + 1];
  const int32_t r = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(r) * vocab;
  const GpuSamplingParams p = params[r];

  // Max and its first id; then the raw log-sum-exp for the logprob.
  float max_value = -INFINITY;
  int32_t max_id = INT_MAX;
  for_each_logit(row, vocab, [&](float v, int32_t i) { keep_better(max_value, max_id, clean(v), i); });
  block_best(max_value, max_id, shared_value, shared_id);
  if (max_id == INT_MAX) max_id = 0;
  auto finish = [&](int32_t token, double log_z) {
    if (threadIdx.x == 0) {
      tokens[r] = token;
      logprobs[r] = static_cast<float>(static_cast<double>(clean(row[token])) - log_z);
    }
  };
  if (max_value == -INFINITY) {
    finish(max_id, INFINITY);
    return;
  }
  const bool greedy = !(p.temperature > 0.0f) || p.top_k == 1;
  const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;
  // The CPU sampler's probability up to a constant: exp((l - max) / T), computed
  // like it in float then widened.
  auto weight = [&](float v) { return static_cast<double>(expf((v - max_value) * inv_t)); };
  // raw: sum exp(l - max); base: count of min-p survivors and their lowest key.
  double sums[2] = {0.0, 0.0};
  uint32_t lowest_key = UINT_MAX;
  for_each_logit(row, vocab, [&](float raw, int32_t) {
    const float v = clean(raw);
    sums[0] += static_cast<double>(expf(v - max_value));
    if (!greedy) {
      const double w = weight(v);
      if (w > 0.0 && w >= static_cast<double>(p.min_p)) {
        sums[1] += 1.0;
        lowest_key = min(lowest_key, order_key(v));
      }
    }
  });
  block_sum<2>(sums, shared_sums);
  const double log_z = static_cast<double>(max_value) + log(sums[0]);
  if (greedy) {
    finish(max_id, log_z);
    return;
  }
  lowest_key = block_min_key(lowest_key, shared_id);
  const double num_base = sums[1];
  const uint32_t max_key = order_key(max_value);
  const Cut base{lowest_key, INT_MAX};
  Cut top_k{0u, 0};  // key > 0 holds for every non-NaN key: no cut
  Cut top_p{0u, 0};

  if (p.top_k > 0 && static_cast<double>(p.top_k) < num_base) {
    uint64_t lo = lowest_key, hi = static_cast<uint64_t>(max_key) + 1;
    double at_lo[2] = {num_base, 0.0}, at_hi[2] = {0.0, 0.0};
    bisect(lo, hi, static_cast<double>(p.top_k), /*by_mass=*/false, at_lo, at_hi, row, vocab,
           [&](float, uint32_t key, int32_t) { return passes(base, key, 0) ? 0.0 : -1.0; }, shared_sums);
    const uint32_t k_key = static_cast<uint32_t>(lo);
    top_k = Cut{k_key, INT_MAX};
    if (at_lo[0] > static_cast<double>(p.top_k)) {
      // Ties at the k-th value: keep the lowest ids among them.
      const double need = static_cast<double>(p.top_k) - at_hi[0];
      top_k.id = id_after_nth_match(vocab, need, [&](int32_t i) { return order_key(clean(row[i])) == k_key; },
                                    shared_id);
    }
  }

  auto survives_k = [&](uint32_t key, int32_t id) { return passes(base, key, id) && passes(top_k, key, id); };
  if (p.top_p < 1.0f) {
    double total[2] = {0.0, 0.0};  // count, mass of the min-p and top-k survivors
    for_each_logit(row, vocab, [&](float raw, int32_t i) {
      const float v = clean(raw);
      if (survives_k(order_key(v), i)) {
        total[0] += 1.0;
        total[1] += weight(v);
      }
    });
    block_sum<2>(total, shared_sums);
    const double target = static_cast<double>(p.top_p) * total[1];
    uint64_t lo = lowest_key, hi = static_cast<uint64_t>(max_key) + 1;
    double at_lo[2] = {total[0], total[1]}, at_hi[2] = {0.0, 0.0};
    bisect(lo, hi, target, /*by_mass=*/true, at_lo, at_hi, row, vocab,
           [&](float v, uint32_t key, int32_t i) { return survives_k(key, i) ? weight(v) : -1.0; }, shared_sums);
    const uint32_t p_key = static_cast<uint32_t>(lo);
    top_p = Cut{p_key, INT_MAX};
    // The CPU keeps adding tokens (best first, ties by id) until the kept mass
    // reaches the target: all above p_key, then the fewest tied at p_key.
    const double q = weight(key_value(p_key));
    const double tied = at_lo[0] - at_hi[0];
    if (tied > 1.0 && q > 0.0) {
      const double need = fmax(1.0, ceil((target - at_hi[1]) / q));
      if (need < tied) {
        top_p.id = id_after_nth_match(
            vocab, need, [&](int32_t i) { const uint32_t key = order_key(clean(row[i]));
                                          return key == p_key && survives_k(key, i); },
            shared_id);
      }
    }
  }

  // Gumbel-max over the survivors: argmax of (l - max) / T + Gumbel noise.
  float best = -INFINITY;
  int32_t best_id = INT_MAX;
  for_each_logit(row, vocab, [&](float raw, int32_t i) {
    const float v = clean(raw);
    const uint32_t key = order_key(v);
    if (!survives_k(key, i) || !passes(top_p, key, i)) return;
    const float u = (static_cast<float>(draw_bits(p.seed, p.step, i)) + 0.5f) * 2.3283064365386963e-10f;
    const float exponential = -log1pf(-u);  // Exp(1); near 0 stays precise for large Gumbel values
    keep_better(best, best_id, (v - max_value) * inv_t - logf(exponential), i);
  });
  block_best(best, best_id, shared_value, shared_id);
  finish(best_id == INT_MAX ? max_id : best_id, log_z);
}

}  // namespace

cudaError_t sample_rows(const float* logits, int32_t rows, int32_t vocab, const GpuSamplingParams* params,
                        int32_t* tokens, float* logprobs, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, params, tokens, logprobs);
  return cudaGetLastError();
}

double sampling_uniform(uint64_t seed, uint64_t step, int32_t token) {
  return (static_cast<double>(draw_bits(seed, step, token)) + 0.5) * 2.3283064365386963e-10;
}

}  // namespace pagoda::cuda
