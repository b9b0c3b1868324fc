#include "pagoda/backend/cpu/kernels/decode_attention_tile.h"

#include <immintrin.h>

#include <limits>

#include "pagoda/backend/cpu/kernels/cpu_features.h"

namespace pagoda::kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool cpu_has_avx2_fma_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  }();
  return has;
}

#define PAGODA_AVX2T __attribute__((target("avx2,fma,f16c")))

template <int kKind>
PAGODA_AVX2T inline __m256 load8(const void* v, size_t c) {
  if constexpr (kKind == 0) {
    return _mm256_loadu_ps(static_cast<const float*>(v) + 8 * c);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(v) + 8 * c));
    if constexpr (kKind == 1) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    else return _mm256_cvtph_ps(raw);
  }
}

template <int kKind>
PAGODA_AVX2T void scores8(const float* const* q, size_t G, const void* const* keys, size_t head_dim, float scale,
                          float* s) {
  const size_t chunks = head_dim / 8;
  for (size_t j = 0; j < kDecodeTileKeys; ++j) {
    const void* k = keys[j];
    if (k == nullptr) {
      for (size_t g = 0; g < G; ++g) s[g * kDecodeTileKeys + j] = kNegInf;
      continue;
    }
    size_t g = 0;
    for (; g + 4 <= G; g += 4) {
      const float *q0 = q[g], *q1 = q[g + 1], *q2 = q[g + 2], *q3 = q[g + 3];
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (size_t c = 0; c < chunks; ++c) {
        const __m256 kv = load8<kKind>(k, c);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + 8 * c), kv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + 8 * c), kv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + 8 * c), kv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + 8 * c), kv, a3);
      }
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      alignas(16) float sums[4];
      _mm_store_ps(sums, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)),
                                    _mm_set1_ps(scale)));
      for (size_t r = 0; r < 4; ++r) s[(g + r) * kDecodeTileKeys + j] = sums[r];
    }
    for (; g < G; ++g) {
      __m256 a = _mm256_setzero_ps();
      for (size_t c = 0; c < chunks; ++c) a = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + 8 * c), load8<kKind>(k, c), a);
      __m128 lo = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
      lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
      s[g * kDecodeTileKeys + j] = _mm_cvtss_f32(lo) * scale;
    }
  }
}

// kRows rows of acc over 32 floats (four 8-lane chunks from c), the n live keys.
template <int kKind, int kRows>
PAGODA_AVX2T inline void accumulate8_rows(const float* p, const uint8_t* live, size_t n, const void* const* values,
                                          size_t c, size_t head_dim, float* acc) {
  __m256 r[kRows][4];
  for (int g = 0; g < kRows; ++g)
    for (int i = 0; i < 4; ++i) r[g][i] = _mm256_loadu_ps(acc + g * head_dim + 8 * (c + i));
  for (size_t x = 0; x < n; ++x) {
    const size_t j = live[x];
    const __m256 v0 = load8<kKind>(values[j], c), v1 = load8<kKind>(values[j], c + 1);
    const __m256 v2 = load8<kKind>(values[j], c + 2), v3 = load8<kKind>(values[j], c + 3);
    for (int g = 0; g < kRows; ++g) {
      const __m256 b = _mm256_broadcast_ss(p + g * kDecodeTileKeys + j);
      r[g][0] = _mm256_fmadd_ps(b, v0, r[g][0]);
      r[g][1] = _mm256_fmadd_ps(b, v1, r[g][1]);
      r[g][2] = _mm256_fmadd_ps(b, v2, r[g][2]);
      r[g][3] = _mm256_fmadd_ps(b, v3, r[g][3]);
    }
  }
  for (int g = 0; g < kRows; ++g)
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(acc + g * head_dim + 8 * (c + i), r[g][i]);
}

template <int kKind>
PAGODA_AVX2T void accumulate8(const float* p, size_t G, const void* const* values, size_t head_dim, float* acc) {
  uint8_t live[kDecodeTileKeys];
  size_t n = 0;
  for (size_t j = 0; j < kDecodeTileKeys; ++j)
    if (values[j] != nullptr) live[n++] = static_cast<uint8_t>(j);
  if (n == 0) return;
  for (size_t c = 0; c + 4 <= head_dim / 8; c += 4) {  // head_dim % 32 == 0 (decode_tile_supported)
    size_t g = 0;
    for (; g + 2 <= G; g += 2)
      accumulate8_rows<kKind, 2>(p + g * kDecodeTileKeys, live, n, values, c, head_dim, acc + g * head_dim);
    for (; g < G; ++g)
      accumulate8_rows<kKind, 1>(p + g * kDecodeTileKeys, live, n, values, c, head_dim, acc + g * head_dim);
  }
}

int kind_of(DType dtype) { return dtype == DType::kBF16 ? 1 : dtype == DType::kF16 ? 2 : 0; }

}  // namespace

bool decode_tile_supported(DType key_dtype, DType value_dtype, size_t head_dim) {
  const auto plain = [](DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; };
  return plain(key_dtype) && plain(value_dtype) && head_dim % 32 == 0 && head_dim > 0 && cpu_has_avx2_fma_f16c();
}

void decode_tile_scores(const float* const* q, size_t G, const void* const* keys, DType key_dtype, size_t head_dim,
                        float scale, float* s) {
  switch (kind_of(key_dtype)) {
    case 1: return scores8<1>(q, G, keys, head_dim, scale, s);
    case 2: return scores8<2>(q, G, keys, head_dim, scale, s);
    default: return scores8<0>(q, G, keys, head_dim, scale, s);
  }
}

void decode_tile_accumulate(const float* p, size_t G, const void* const* values, DType value_dtype, size_t head_dim,
                            float* acc) {
  switch (kind_of(value_dtype)) {
    case 1: return accumulate8<1>(p, G, values, head_dim, acc);
    case 2: return accumulate8<2>(p, G, values, head_dim, acc);
    default: return accumulate8<0>(p, G, values, head_dim, acc);
  }
}

}  // namespace pagoda::kernels
