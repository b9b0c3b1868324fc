// Per-row sampling on the GPU (sampling.h): thresholds by radix select over
// the logits' order-preserving keys (sampling_select.h), Gumbel-max over the
// survivors.
//
// A token survives when it passes three cuts, each "key > K, or key == K and
// id < cut_id": min-p (a key threshold, no id cut), top-k and top-p. The passes
// over a row, for temperature + top-p: (1) max, its first id and the raw
// log-sum-exp, online; (2) the top-p total and a histogram of the top 12 key
// bits weighted by fixed-point mass; (3, 4) the next 10 and the last 10 bits,
// reading only the tokens inside the chosen bucket; (5, only when several tokens
// tie at the threshold and only some are kept) the id cut, in id order with an
// early exit; (6) Gumbel-max, drawing noise only for survivors. Top-k counts
// its first histogram during pass 1 and refines like top-p.
#include <cfloat>
#include <climits>
#include <cmath>

#include "pagoda/backend/cuda/sampling.h"
#include "pagoda/backend/cuda/sampling_select.h"

namespace pagoda::cuda {
namespace {

namespace sel = sampling_select;
using sel::KeyCut;
using sel::order_key;
using sel::passes;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Shared memory of one CTA (about 33 KB): a radix histogram whose 64-bit
// bucket values are kept as two 32-bit halves (shared-memory atomics are native
// for 32-bit integers only; the carry out of the low half is detected from the
// old value the atomic returns), plus reduction scratch.
struct Scratch {
  uint32_t hist_lo[sel::kMaxBuckets];
  uint32_t hist_hi[sel::kMaxBuckets];
  uint64_t warp_u64[kWarps];
  double warp_f64[kWarps];
  float warp_value[kWarps];
  int32_t warp_i32[kWarps];
  int32_t found_id;
  int32_t found_bucket;
  uint64_t found_above;
  uint64_t found_at;
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

__device__ __forceinline__ float clean(float v) { return sel::clean_logit(v); }

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

// Sum over the block; every thread gets the total. Fixed order of addition, so
// every thread (and every run) sees the same bits.
template <typename T>
__device__ T block_sum(T v, T* shared /* [kWarps] */) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T s = 0;
  for (int w = 0; w < kWarps; ++w) s += shared[w];
  __syncthreads();
  return s;
}

// One cleaned logit into a thread's running max (its first id) and sum of exp(l - max): the sum is
// rescaled when the max grows, so one pass gives the raw log-sum-exp (pass 1 of sampling and scoring).
__device__ __forceinline__ void online_max_sum(float v, int32_t i, float& max, int32_t& max_id, double& sum) {
  if (v > max) {
    sum = sum * static_cast<double>(expf(max - v)) + 1.0;
    max = v;
    max_id = i;
  } else {
    if (v == max && i < max_id) max_id = i;
    if (v != -INFINITY) sum += static_cast<double>(expf(v - max));
  }
}

// Best (value, id) over the block: larger value, then smaller id.
__device__ __forceinline__ void keep_better(float& best, int32_t& best_id, float value, int32_t id) {
  if (value > best || (value == best && id < best_id)) {
    best = value;
    best_id = id;
  }
}
__device__ void block_best(float& best, int32_t& best_id, Scratch& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(kFullMask, best, offset);
    const int32_t other_id = __shfl_xor_sync(kFullMask, best_id, offset);
    keep_better(best, best_id, other, other_id);
  }
  if (lane == 0) {
    s.warp_value[warp] = best;
    s.warp_i32[warp] = best_id;
  }
  __syncthreads();
  best = s.warp_value[0];
  best_id = s.warp_i32[0];
  for (int w = 1; w < kWarps; ++w) keep_better(best, best_id, s.warp_value[w], s.warp_i32[w]);
  __syncthreads();
}

__device__ void clear_histogram(Scratch& s, int buckets) {
  for (int b = threadIdx.x; b < buckets; b += kThreads) {
    s.hist_lo[b] = 0;
    s.hist_hi[b] = 0;
  }
}
__device__ __forceinline__ void histogram_add(Scratch& s, uint32_t bucket, uint64_t amount) {
  const uint32_t lo = static_cast<uint32_t>(amount);
  uint32_t hi = static_cast<uint32_t>(amount >> 32);
  if (lo != 0) {
    const uint32_t old = atomicAdd(&s.hist_lo[bucket], lo);
    if (old + lo < old) ++hi;  // the low half wrapped: carry into the high half
  }
  if (hi != 0) atomicAdd(&s.hist_hi[bucket], hi);
}
__device__ __forceinline__ uint64_t histogram_value(const Scratch& s, int bucket) {
  return (static_cast<uint64_t>(s.hist_hi[bucket]) << 32) | s.hist_lo[bucket];
}

struct Crossing {
  int32_t bucket;
  uint64_t above;  // measure strictly above the bucket (incl. the caller's `above`)
  uint64_t at;     // measure inside the bucket
};

// The parallel form of sel::find_crossing_bucket: each thread owns
// buckets / kThreads consecutive buckets; a suffix scan over threads gives the
// measure above each thread's range; the one thread whose range holds the
// crossing walks it. Integer sums: the answer does not depend on the order.
__device__ Crossing find_crossing(Scratch& s, int buckets, uint64_t target, uint64_t above) {
  const int per = buckets / kThreads;
  const int first = threadIdx.x * per;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t local = 0;
  for (int j = 0; j < per; ++j) local += histogram_value(s, first + j);
  uint64_t suffix = local;  // this lane's and every higher lane's buckets
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint64_t other = __shfl_down_sync(kFullMask, suffix, offset);
    if (lane + offset < 32) suffix += other;
  }
  if (lane == 0) s.warp_u64[warp] = suffix;
  if (threadIdx.x == 0) {  // unreachable fallback: keep everything
    s.found_bucket = 0;
    s.found_above = above;
    s.found_at = 0;
  }
  __syncthreads();
  uint64_t start = above + (suffix - local);
  for (int w = warp + 1; w < kWarps; ++w) start += s.warp_u64[w];
  if (start < target && target - start <= local) {
    uint64_t acc = start;
    for (int j = per - 1; j >= 0; --j) {
      const uint64_t h = histogram_value(s, first + j);
      if (h >= target - acc) {
        s.found_bucket = first + j;
        s.found_above = acc;
        s.found_at = h;
        break;
      }
      acc += h;
    }
  }
  __syncthreads();
  const Crossing c{s.found_bucket, s.found_above, s.found_at};
  __syncthreads();
  return c;
}

struct Threshold {
  uint32_t key;    // the largest key K whose measure at or above it reaches the target
  uint64_t above;  // measure of the keys > K
  uint64_t at;     // measure of the keys == K
};

// Radix select of the threshold key. The first level's histogram must already
// be in `s` (the caller builds it in a pass that does other work too); the
// others read only the tokens inside the bucket chosen so far.
// measure(v, key, id) is a token's count or mass (0: not counted).
template <typename Measure>
__device__ Threshold select_threshold(const float* row, int32_t vocab, uint64_t target, Measure measure, Scratch& s) {
  uint32_t prefix = 0;
  uint64_t above = 0, at = 0;
  for (int level = 0; level < sel::kNumRadixLevels; ++level) {
    const sel::RadixLevel radix = sel::radix_level(level);
    const int buckets = 1 << radix.bits;
    if (level > 0) {
      clear_histogram(s, buckets);
      __syncthreads();
      const int high = radix.shift + radix.bits;
      const uint32_t want = prefix;
      for_each_logit(row, vocab, [&](float raw, int32_t i) {
        const float v = clean(raw);
        const uint32_t key = order_key(v);
        if ((key >> high) != want) return;
        const uint64_t m = measure(v, key, i);
        if (m != 0) histogram_add(s, (key >> radix.shift) & (buckets - 1), m);
      });
      __syncthreads();
    }
    const Crossing c = find_crossing(s, buckets, target, above);
    prefix = (prefix << radix.bits) | static_cast<uint32_t>(c.bucket);
    above = c.above;
    at = c.at;
  }
  return {prefix, above, at};
}

// The id one past the `need`-th (1-based) token in id order for which
// match(key, id) holds; INT_MAX when fewer match. Tiles of 16 consecutive ids
// per thread, threads in id order, a block scan of the match counts per tile;
// stops at the tile that holds the answer.
template <typename Match>
__device__ int32_t id_after_nth_match(const float* row, int32_t vocab, uint64_t need, Match match, Scratch& s) {
  constexpr int kPerThread = 16;
  constexpr int32_t kTile = kThreads * kPerThread;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) s.found_id = INT_MAX;
  uint64_t seen = 0;  // matches in earlier tiles (same in every thread)
  for (int32_t base = 0; base < vocab && seen < need; base += kTile) {
    const int32_t first = base + static_cast<int32_t>(threadIdx.x) * kPerThread;
    uint32_t flags = 0;  // bit j: id first + j matches
    if ((vocab & 3) == 0 && first + kPerThread <= vocab) {
      const float4* p4 = reinterpret_cast<const float4*>(row + first);
      float4 q[kPerThread / 4];
#pragma unroll
      for (int u = 0; u < kPerThread / 4; ++u) q[u] = __ldg(p4 + u);
#pragma unroll
      for (int u = 0; u < kPerThread / 4; ++u) {
        const float lane_values[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (match(order_key(clean(lane_values[c])), first + 4 * u + c)) flags |= 1u << (4 * u + c);
        }
      }
    } else {
      for (int j = 0; j < kPerThread; ++j) {
        const int32_t id = first + j;
        if (id < vocab && match(order_key(clean(row[id])), id)) flags |= 1u << j;
      }
    }
    const int32_t count = __popc(flags);
    int32_t inclusive = count;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int32_t other = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    if (lane == 31) s.warp_i32[warp] = inclusive;
    __syncthreads();
    uint64_t before = seen + static_cast<uint64_t>(inclusive - count);
    uint64_t tile_total = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += static_cast<uint64_t>(s.warp_i32[w]);
      tile_total += static_cast<uint64_t>(s.warp_i32[w]);
    }
    if (before < need && need <= before + static_cast<uint64_t>(count)) {
      uint32_t rest = flags;
      for (uint64_t k = need - before; k > 1; --k) rest &= rest - 1;  // drop the lowest matches
      s.found_id = first + __ffs(static_cast<int>(rest));  // (bit index) + 1
    }
    __syncthreads();
    seen += tile_total;
  }
  __syncthreads();
  const int32_t result = s.found_id;
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kThreads, 3)
    sample_kernel(const float* __restrict__ logits, int32_t vocab, const GpuSamplingParams* __restrict__ params,
                  int32_t* __restrict__ tokens, float* __restrict__ logprobs, GpuSamplingCuts* __restrict__ cuts) {
  __shared__ Scratch s;
  const int32_t r = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(r) * vocab;
  const GpuSamplingParams p = params[r];
  const bool greedy = !(p.temperature > 0.0f) || p.top_k == 1;
  const bool top_k_on = !greedy && p.top_k > 1 && p.top_k < vocab;

  // Pass 1: max and its first id; the raw sum of exp(l - max), online (each
  // thread rescales its sum when its max grows); top-k's first histogram.
  if (top_k_on) {
    clear_histogram(s, sel::kMaxBuckets);
    __syncthreads();
  }
  float local_max = -INFINITY;
  int32_t local_id = INT_MAX;
  double local_sum = 0.0;
  const int top_shift = sel::radix_level(0).shift;
  for_each_logit(row, vocab, [&](float raw, int32_t i) {
    const float v = clean(raw);
    online_max_sum(v, i, local_max, local_id, local_sum);
    if (top_k_on) atomicAdd(&s.hist_lo[order_key(v) >> top_shift], 1u);
  });
  float max_value = local_max;
  int32_t max_id = local_id;
  block_best(max_value, max_id, s);
  if (max_id == INT_MAX) max_id = 0;
  const double sum_exp = block_sum(
      local_max == -INFINITY ? 0.0 : local_sum * static_cast<double>(expf(local_max - max_value)), s.warp_f64);
  const double log_z = static_cast<double>(max_value) + log(sum_exp);

  auto finish = [&](int32_t token, double z) {
    if (threadIdx.x == 0) {
      tokens[r] = token;
      logprobs[r] = static_cast<float>(static_cast<double>(clean(row[token])) - z);
    }
  };
  if (max_value == -INFINITY || greedy) {
    if (cuts != nullptr && threadIdx.x == 0) {
      const uint32_t max_key = order_key(max_value);
      cuts[r] = GpuSamplingCuts{max_key, max_key, max_id + 1, 0u, 0};
    }
    finish(max_id, max_value == -INFINITY ? static_cast<double>(INFINITY) : log_z);
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  // The CPU sampler's probability up to a constant: exp((l - max) / T).
  auto weight = [&](float v) { return expf((v - max_value) * inv_t); };

  // min-p (and "probability > 0"): the smallest key whose weight passes, by
  // bisection over key values (weight is non-decreasing in the key); reads no
  // memory, so the weight is exp in double like the CPU's: a token whose expf
  // underflows (a cold temperature) still competes, through its log-weight.
  KeyCut base{0u, INT_MAX};
  {
    auto survives_min_p = [&](uint32_t key) {
      const double w = exp(static_cast<double>((sel::key_value(key) - max_value) * inv_t));
      return w > 0.0 && w >= static_cast<double>(p.min_p);
    };
    uint32_t fails = order_key(-INFINITY), holds = order_key(max_value);
    while (holds - fails > 1) {
      const uint32_t mid = fails + (holds - fails) / 2;
      if (survives_min_p(mid)) holds = mid; else fails = mid;
    }
    base.key = holds;
  }

  // top-k by count over all tokens: when fewer than k pass min-p, its key lies
  // below min-p's and the min-p cut alone decides, as on the CPU.
  KeyCut top_k{0u, 0};  // key > 0 holds for every cleaned key: no cut
  if (top_k_on) {
    const uint64_t k = static_cast<uint64_t>(p.top_k);
    const Threshold t = select_threshold(row, vocab, k, [](float, uint32_t, int32_t) { return uint64_t{1}; }, s);
    top_k = KeyCut{t.key, INT_MAX};
    if (t.above + t.at > k) {
      const uint32_t k_key = t.key;
      top_k.id = id_after_nth_match(row, vocab, k - t.above, [&](uint32_t key, int32_t) { return key == k_key; }, s);
    }
  }
  auto survives_k = [&](uint32_t key, int32_t id) { return passes(base, key, id) && passes(top_k, key, id); };

  KeyCut top_p{0u, 0};
  if (p.top_p < 1.0f) {
    const int shift = sel::mass_shift(vocab);
    const double scale = static_cast<double>(uint64_t{1} << shift);
    auto mass = [&](float v) { return sel::to_fixed_mass(weight(v), scale); };
    const uint64_t skip_below = sel::top_p_skip_floor(p.top_p, shift, vocab);
    // Pass 2: the survivors' total mass and the first histogram.
    clear_histogram(s, sel::kMaxBuckets);
    __syncthreads();
    uint64_t local_total = 0;
    for_each_logit(row, vocab, [&](float raw, int32_t i) {
      const float v = clean(raw);
      const uint32_t key = order_key(v);
      if (!survives_k(key, i)) return;
      const uint64_t m = mass(v);
      local_total += m;
      if (m != 0 && m >= skip_below) histogram_add(s, key >> top_shift, m);
    });
    const uint64_t total = block_sum(local_total, s.warp_u64);
    const uint64_t target = sel::top_p_target(total, p.top_p);
    const Threshold t = select_threshold(
        row, vocab, target,
        [&](float v, uint32_t key, int32_t i) -> uint64_t {
          if (!survives_k(key, i)) return 0;
          const uint64_t m = mass(v);
          return m >= skip_below ? m : 0;
        },
        s);
    top_p = KeyCut{t.key, INT_MAX};
    const uint64_t q = mass(sel::key_value(t.key));
    if (q > 0) {
      const uint64_t tied = t.at / q;
      const uint64_t need = sel::tied_tokens_needed(target, t.above, q);
      if (need < tied) {
        const uint32_t p_key = t.key;
        top_p.id = id_after_nth_match(
            row, vocab, need, [&](uint32_t key, int32_t i) { return key == p_key && survives_k(key, i); }, s);
      }
    }
  }
  if (cuts != nullptr && threadIdx.x == 0) cuts[r] = GpuSamplingCuts{base.key, top_k.key, top_k.id, top_p.key, top_p.id};

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
  block_best(best, best_id, s);
  finish(best_id == INT_MAX ? max_id : best_id, log_z);
}

// Prompt scoring (sampling.h, score_rows): pass 1 as the sampler's (max, raw
// log-sum-exp) plus the token's rank and, for top-k, the first radix histogram
// by count; the k-th key (and its id cut among ties) by select_threshold as
// the sampler's top-k; then the k kept tokens gathered in any order and
// sorted by one thread (k <= 20): value down, id up, engine::score_token's order.
__global__ void __launch_bounds__(kThreads, 3)
    score_kernel(const float* __restrict__ logits, int32_t vocab, const GpuScoreRequest* __restrict__ requests,
                 GpuRowScore* __restrict__ scores, const int32_t* __restrict__ sampled) {
  __shared__ Scratch s;
  __shared__ int32_t picked_ids[kMaxScoreTopK];
  __shared__ float picked_values[kMaxScoreTopK];
  __shared__ int32_t picked;
  GpuScoreRequest q = requests[blockIdx.x];
  if (q.token < 0) q.token = sampled[q.row];
  const float* row = logits + static_cast<int64_t>(q.row) * vocab;
  const int32_t k = min(max(q.top_k, 0), min(kMaxScoreTopK, vocab));
  const bool select = k > 0 && k < vocab;
  const uint32_t token_key = order_key(clean(row[q.token]));
  const int top_shift = sel::radix_level(0).shift;
  if (select) clear_histogram(s, sel::kMaxBuckets);
  if (threadIdx.x == 0) picked = 0;
  __syncthreads();
  float local_max = -INFINITY;
  int32_t local_id = INT_MAX;
  double local_sum = 0.0;
  uint64_t local_rank = 0;
  for_each_logit(row, vocab, [&](float raw, int32_t i) {
    const float v = clean(raw);
    online_max_sum(v, i, local_max, local_id, local_sum);
    const uint32_t key = order_key(v);
    local_rank += key >= token_key ? 1 : 0;
    if (select) atomicAdd(&s.hist_lo[key >> top_shift], 1u);
  });
  float max_value = local_max;
  int32_t max_id = local_id;
  block_best(max_value, max_id, s);
  const double sum_exp = block_sum(
      local_max == -INFINITY ? 0.0 : local_sum * static_cast<double>(expf(local_max - max_value)), s.warp_f64);
  const uint64_t rank = block_sum(local_rank, s.warp_u64);
  const double log_z = max_value == -INFINITY ? static_cast<double>(INFINITY)
                                              : static_cast<double>(max_value) + log(sum_exp);

  KeyCut top{0u, 0};  // no cut: every token (k == vocab)
  if (select) {
    const Threshold t = select_threshold(row, vocab, static_cast<uint64_t>(k),
                                         [](float, uint32_t, int32_t) { return uint64_t{1}; }, s);
    top = KeyCut{t.key, INT_MAX};
    if (t.above + t.at > static_cast<uint64_t>(k)) {
      const uint32_t k_key = t.key;
      top.id = id_after_nth_match(row, vocab, static_cast<uint64_t>(k) - t.above,
                                  [&](uint32_t key, int32_t) { return key == k_key; }, s);
    }
  }
  if (k > 0) {
    for_each_logit(row, vocab, [&](float raw, int32_t i) {
      const float v = clean(raw);
      if (!passes(top, order_key(v), i)) return;
      const int32_t slot = atomicAdd(&picked, 1);
      if (slot < kMaxScoreTopK) {
        picked_ids[slot] = i;
        picked_values[slot] = v;
      }
    });
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  GpuRowScore& out = scores[blockIdx.x];
  out.logprob = static_cast<float>(static_cast<double>(clean(row[q.token])) - log_z);
  out.rank = static_cast<int32_t>(rank);
  const int32_t n = min(picked, k);
  for (int32_t a = 1; a < n; ++a) {  // insertion sort: value down, then id up
    const int32_t id = picked_ids[a];
    const float v = picked_values[a];
    int32_t b = a;
    for (; b > 0 && (picked_values[b - 1] < v || (picked_values[b - 1] == v && picked_ids[b - 1] > id)); --b) {
      picked_ids[b] = picked_ids[b - 1];
      picked_values[b] = picked_values[b - 1];
    }
    picked_ids[b] = id;
    picked_values[b] = v;
  }
  out.top_count = n;
  for (int32_t j = 0; j < n; ++j) {
    out.top_tokens[j] = picked_ids[j];
    out.top_logprobs[j] = static_cast<float>(static_cast<double>(picked_values[j]) - log_z);
  }
}

}  // namespace

cudaError_t sample_rows_with_cuts(const float* logits, int32_t rows, int32_t vocab, const GpuSamplingParams* params,
                                  int32_t* tokens, float* logprobs, GpuSamplingCuts* cuts, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, params, tokens, logprobs, cuts);
  return cudaGetLastError();
}

cudaError_t sample_rows(const float* logits, int32_t rows, int32_t vocab, const GpuSamplingParams* params,
                        int32_t* tokens, float* logprobs, cudaStream_t stream) {
  return sample_rows_with_cuts(logits, rows, vocab, params, tokens, logprobs, nullptr, stream);
}

cudaError_t score_rows(const float* logits, int32_t vocab, const GpuScoreRequest* requests, int32_t count,
                       GpuRowScore* scores, cudaStream_t stream, const int32_t* sampled) {
  if (count == 0) return cudaSuccess;
  score_kernel<<<count, kThreads, 0, stream>>>(logits, vocab, requests, scores, sampled);
  return cudaGetLastError();
}

namespace {
// sampling.h, apply_logit_edits: the host's operations one by one (_rn: never fused into an FMA).
__global__ void apply_logit_edits_kernel(float* __restrict__ logits, int32_t vocab,
                                         const GpuLogitEditRow* __restrict__ rows, GpuLogitEdit* __restrict__ edits) {
  const GpuLogitEditRow p = rows[blockIdx.x];
  float* row = logits + static_cast<int64_t>(p.row) * vocab;
  const bool additive = p.frequency != 0.0f || p.presence != 0.0f;
  for (int32_t e = p.first + static_cast<int32_t>(threadIdx.x); e < p.first + p.count; e += blockDim.x) {
    GpuLogitEdit& t = edits[e];
    if (t.token < 0 || t.token >= vocab) continue;
    float v = row[t.token];
    t.saved = v;
    if (t.flags & kLogitEditBanned) {
      v = -INFINITY;
    } else if (t.flags & kLogitEditBiased) {
      v = __fadd_rn(v, t.bias);
    }
    if (p.repetition != 1.0f && (t.flags & kLogitEditSeen))
      v = v > 0.0f ? __fdiv_rn(v, p.repetition) : __fmul_rn(v, p.repetition);
    if (additive && t.output_count > 0)
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(p.frequency, static_cast<float>(t.output_count)), p.presence));
    row[t.token] = v;
  }
}

__global__ void restore_logit_edits_kernel(float* __restrict__ logits, int32_t vocab,
                                           const GpuLogitEditRow* __restrict__ rows,
                                           const GpuLogitEdit* __restrict__ edits) {
  const GpuLogitEditRow p = rows[blockIdx.x];
  float* row = logits + static_cast<int64_t>(p.row) * vocab;
  for (int32_t e = p.first + static_cast<int32_t>(threadIdx.x); e < p.first + p.count; e += blockDim.x) {
    const GpuLogitEdit& t = edits[e];
    if (t.token >= 0 && t.token < vocab) row[t.token] = t.saved;
  }
}
constexpr int kLogitEditThreads = 256;
}  // namespace

cudaError_t apply_logit_edits(float* logits, int32_t vocab, const GpuLogitEditRow* rows, int32_t count,
                              GpuLogitEdit* edits, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  apply_logit_edits_kernel<<<count, kLogitEditThreads, 0, stream>>>(logits, vocab, rows, edits);
  return cudaGetLastError();
}

cudaError_t restore_logit_edits(float* logits, int32_t vocab, const GpuLogitEditRow* rows, int32_t count,
                                const GpuLogitEdit* edits, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  restore_logit_edits_kernel<<<count, kLogitEditThreads, 0, stream>>>(logits, vocab, rows, edits);
  return cudaGetLastError();
}

double sampling_uniform(uint64_t seed, uint64_t step, int32_t token) {
  return (static_cast<double>(draw_bits(seed, step, token)) + 0.5) * 2.3283064365386963e-10;
}

namespace {
__global__ void patch_deferred_tokens_kernel(int32_t* token_ids, const int32_t* pairs, int32_t count,
                                             const int32_t* sampled) {
  const int32_t k = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k < count) token_ids[pairs[2 * k]] = sampled[pairs[2 * k + 1]];
}
}  // namespace

cudaError_t patch_deferred_tokens(int32_t* token_ids, const int32_t* pairs, int32_t count, const int32_t* sampled,
                                  cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  patch_deferred_tokens_kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(token_ids, pairs, count,
                                                                                            sampled);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
