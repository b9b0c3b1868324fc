#pragma once
// The recipe of `--load-format random`, written once for every backend: which
// matrices a config has, and the value of every element. Matrices are uniform
// in [-a, a) with a = 0.02 * sqrt(3) (standard deviation 0.02, transformers'
// initializer_range), norms 1 and biases 0. Element i of a matrix is a pure
// function of (seed, matrix, i): a splitmix64 hash, 24 bits of it as a unit
// float, then low + span * unit in f32. The CPU backend evaluates it on the
// host in f32, the CUDA backend in a kernel and rounds to bf16, so both make
// the same model (up to that rounding) whatever the thread or block counts.
//
// Thread safety: plain functions. Host + device (the CUDA fill includes it).

#include <cstdint>

#if defined(__CUDACC__)
#define PAGODA_RANDOM_HD __host__ __device__ __forceinline__
#else
#define PAGODA_RANDOM_HD inline
#endif

namespace pagoda {

// One random matrix of a model: its kind and layer (-1 for embed / lm_head).
enum class RandomMatrix : uint32_t {
  kEmbedTokens = 1,
  kLmHead,
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kGateProj,
  kUpProj,
  kDownProj,
  // DeepSeek (MLA + MoE). Routed experts draw with random_expert_key(layer, expert) as their layer.
  kMlaQAProj,
  kMlaQBProj,
  kMlaKvAProj,
  kMlaKvBProj,
  kMoeRouter,
  kMoeExpertGate,
  kMoeExpertUp,
  kMoeExpertDown,
  kMoeSharedGate,
  kMoeSharedUp,
  kMoeSharedDown,
};

// The `layer` argument of a routed expert's matrices: distinct for every (layer, expert).
PAGODA_RANDOM_HD int32_t random_expert_key(int32_t layer, int32_t expert) { return layer * 65536 + expert; }

constexpr float kRandomWeightHalfWidth = 0.02f * 1.7320508f;

PAGODA_RANDOM_HD uint64_t random_weight_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The stream of one matrix: every matrix of every layer draws from its own.
PAGODA_RANDOM_HD uint64_t random_matrix_stream(uint64_t seed, RandomMatrix matrix, int32_t layer) {
  return random_weight_mix(seed ^ random_weight_mix((static_cast<uint64_t>(matrix) << 32) ^
                                                    static_cast<uint64_t>(static_cast<uint32_t>(layer + 1))));
}

// Element i of a stream, uniform in [low, high).
PAGODA_RANDOM_HD float random_uniform_element(uint64_t stream, uint64_t i, float low, float high) {
  const uint64_t bits = random_weight_mix(stream * 0x100000001b3ull ^ i);
  const float unit = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1), exact
  // Two roundings on both sides: the device must not fuse them into an FMA.
#if defined(__CUDA_ARCH__)
  return __fadd_rn(low, __fmul_rn(high - low, unit));
#else
  return low + (high - low) * unit;
#endif
}

}  // namespace pagoda
