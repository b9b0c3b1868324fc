#pragma once
// The arithmetic of the GPU sampler's thresholds (sampling.cu), shared by the
// kernel and by the host so tests can check it and emulate the kernel's radix
// passes on the CPU. Plain C++17; every function is host and device callable,
// pure and deterministic.
//
// Keys: a logit's float bits made order-preserving as unsigned (NaN treated as
// -inf and -0 as +0 first), so "larger logit" is "larger key" and a threshold
// on logits is a threshold on 32-bit keys, found by radix select: a histogram
// over the top 12 key bits, then 10 more bits inside the chosen bucket, then
// the last 10 (radix_level).
//
// Masses: a token's weight w = exp((logit - max) / T) in (0, 1] (float, like
// the kernel) as fixed point, round(w * 2^shift) with shift = 64 - bit_width(vocab)
// so a whole row's sum fits in 64 bits. Integer sums are exact and independent
// of the order of addition: the top-p threshold is the same whatever the thread
// layout or atomics order, and every run of the same row agrees bit for bit.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PAGODA_SAMPLING_FN __host__ __device__ inline
#else
#define PAGODA_SAMPLING_FN inline
#endif

namespace pagoda::cuda::sampling_select {

// Radix select levels: (first key bit, bit count), high bits first.
struct RadixLevel {
  int shift;
  int bits;
};
constexpr int kNumRadixLevels = 3;
constexpr int kMaxBuckets = 1 << 12;
PAGODA_SAMPLING_FN constexpr RadixLevel radix_level(int level) {
  return level == 0 ? RadixLevel{20, 12} : level == 1 ? RadixLevel{10, 10} : RadixLevel{0, 10};
}

PAGODA_SAMPLING_FN uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
PAGODA_SAMPLING_FN float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

// NaN -> -inf, -0 -> +0 (so equal logits have equal keys).
PAGODA_SAMPLING_FN float clean_logit(float v) { return v != v ? -INFINITY : v + 0.0f; }

PAGODA_SAMPLING_FN uint32_t order_key(float cleaned) {
  const uint32_t b = float_bits(cleaned);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
PAGODA_SAMPLING_FN float key_value(uint32_t key) {
  return bits_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// A cut keeps a token when key > cut.key, or key == cut.key and id < cut.id
// (ties at the threshold go to the lowest ids, the CPU sampler's stable order).
struct KeyCut {
  uint32_t key;
  int32_t id;
};
PAGODA_SAMPLING_FN bool passes(const KeyCut& cut, uint32_t key, int32_t id) {
  return key > cut.key || (key == cut.key && id < cut.id);
}

// Fixed-point scale: 2^shift with vocab * 2^shift < 2^64 (shift 47 for 128,256).
PAGODA_SAMPLING_FN int mass_shift(int32_t vocab) {
  int width = 0;
  for (uint32_t v = static_cast<uint32_t>(vocab); v != 0; v >>= 1) ++width;
  return 64 - width;
}
// round(w * 2^shift) for w in [0, 1]; monotone in w. `scale` is 2^shift.
PAGODA_SAMPLING_FN uint64_t to_fixed_mass(float w, double scale) {
  return static_cast<uint64_t>(static_cast<double>(w) * scale + 0.5);
}

// ceil(total * top_p), exactly (top_p's 24-bit significand times a 64-bit
// total in 128 bits), at least 1: the mass the kept tokens must reach.
PAGODA_SAMPLING_FN uint64_t top_p_target(uint64_t total, float top_p) {
  const uint32_t b = float_bits(top_p);
  const int exponent = static_cast<int>((b >> 23) & 0xFFu);
  const uint32_t significand = exponent == 0 ? (b & 0x7FFFFFu) : ((b & 0x7FFFFFu) | 0x800000u);
  const int down = exponent == 0 ? 149 : 150 - exponent;  // top_p = significand * 2^-down
  const unsigned __int128 product = static_cast<unsigned __int128>(total) * significand;
  uint64_t target;
  if (down >= 128) {
    target = product != 0 ? 1 : 0;
  } else if (down <= 0) {
    target = static_cast<uint64_t>(product << -down);
  } else {
    const unsigned __int128 whole = product >> down;
    const bool rest = (product - (whole << down)) != 0;
    target = static_cast<uint64_t>(whole) + (rest ? 1 : 0);
  }
  return target == 0 ? 1 : target;
}

// Tokens whose fixed-point mass is below this floor cannot be at or above the
// top-p threshold, so the histograms skip them (their mass still counts in the
// total). Why: the row's maximum always survives with mass 2^shift, so
// total >= 2^shift, and every skipped token together holds less than
// vocab * floor <= (1 - top_p) * 2^shift - 2 <= total - target; the tokens at
// or above the first unskipped key therefore already reach the target.
PAGODA_SAMPLING_FN uint64_t top_p_skip_floor(float top_p, int shift, int32_t vocab) {
  const double slack = (1.0 - static_cast<double>(top_p)) * static_cast<double>(uint64_t{1} << shift) - 2.0;
  if (!(slack > 0.0)) return 0;
  return static_cast<uint64_t>(slack / static_cast<double>(vocab) * 0.999);
}

// Of the `tied` tokens of mass q at the threshold key (q > 0), the CPU keeps
// the fewest (lowest ids first) that bring the kept mass from `above` (the
// mass strictly above the key, < target) to the target.
PAGODA_SAMPLING_FN uint64_t tied_tokens_needed(uint64_t target, uint64_t above, uint64_t q) {
  return (target - above + q - 1) / q;
}

// Where a non-increasing cumulative measure first reaches `target`, scanning a
// histogram's buckets from the top: the bucket b with
// above + sum(hist[b+1..]) < target <= above + sum(hist[b..]); on return
// `above` holds above + sum(hist[b+1..]). Host version (the kernel scans in
// parallel to the same answer); -1 when the histogram never reaches the target.
PAGODA_SAMPLING_FN int find_crossing_bucket(const uint64_t* hist, int buckets, uint64_t target, uint64_t& above) {
  for (int b = buckets - 1; b >= 0; --b) {
    if (above + hist[b] >= target) return b;
    above += hist[b];
  }
  return -1;
}

}  // namespace pagoda::cuda::sampling_select
