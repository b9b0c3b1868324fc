#include "pagoda/backend/cpu/kernels/decode_attention_tile.h"

// GCC 12 warns that the AVX-512 intrinsics' internal _mm512_undefined_*() operands are (or "may be") used
// uninitialized once inlined here: a false positive of the header, not of this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <limits>

namespace pagoda::kernels {

namespace {

#define PAGODA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool cpu_has_avx512_f_bw_vl() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

// Elements [16c, 16c + 16) of a K or V vector as f32.
template <int kKind>  // 0 f32, 1 bf16, 2 f16
PAGODA_AVX512 inline __m512 load16(const void* v, size_t c) {
  if constexpr (kKind == 0) {
    return _mm512_loadu_ps(static_cast<const float*>(v) + 16 * c);
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(v) + 16 * c));
    if constexpr (kKind == 1) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    else return _mm512_cvtph_ps(raw);
  }
}

PAGODA_AVX512 inline __m256 fold(__m512 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

template <int kKind>
PAGODA_AVX512 void scores(const float* const* q, size_t G, const void* const* keys, size_t head_dim, float scale,
                          float* s) {
  const size_t chunks = head_dim / 16;
  for (size_t j = 0; j < kDecodeTileKeys; ++j) {
    const void* k = keys[j];
    if (k == nullptr) {
      for (size_t g = 0; g < G; ++g) s[g * kDecodeTileKeys + j] = kNegInf;
      continue;
    }
    size_t g = 0;
    for (; g + 4 <= G; g += 4) {  // four rows per pass, their sums reduced together
      const float *q0 = q[g], *q1 = q[g + 1], *q2 = q[g + 2], *q3 = q[g + 3];
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
      for (size_t c = 0; c < chunks; ++c) {
        const __m512 kv = load16<kKind>(k, c);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + 16 * c), kv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + 16 * c), kv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + 16 * c), kv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q3 + 16 * c), kv, a3);
      }
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(fold(a0), fold(a1)), _mm256_hadd_ps(fold(a2), fold(a3)));
      alignas(16) float sums[4];
      _mm_store_ps(sums, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)),
                                    _mm_set1_ps(scale)));
      for (size_t r = 0; r < 4; ++r) s[(g + r) * kDecodeTileKeys + j] = sums[r];
    }
    for (; g < G; ++g) {
      __m512 a = _mm512_setzero_ps();
      for (size_t c = 0; c < chunks; ++c) a = _mm512_fmadd_ps(_mm512_loadu_ps(q[g] + 16 * c), load16<kKind>(k, c), a);
      s[g * kDecodeTileKeys + j] = _mm512_reduce_add_ps(a) * scale;
    }
  }
}

// kRows rows of acc, one 16-float chunk c, over the n live keys.
template <int kKind, int kRows>
PAGODA_AVX512 inline void accumulate_rows(const float* p, const uint8_t* live, size_t n, const void* const* values,
                                          size_t c, size_t head_dim, float* acc) {
  __m512 r[kRows];
  for (int g = 0; g < kRows; ++g) r[g] = _mm512_loadu_ps(acc + g * head_dim + 16 * c);
  for (size_t i = 0; i < n; ++i) {
    const size_t j = live[i];
    const __m512 v = load16<kKind>(values[j], c);
    for (int g = 0; g < kRows; ++g) r[g] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * kDecodeTileKeys + j]), v, r[g]);
  }
  for (int g = 0; g < kRows; ++g) _mm512_storeu_ps(acc + g * head_dim + 16 * c, r[g]);
}

template <int kKind>
PAGODA_AVX512 void accumulate(const float* p, size_t G, const void* const* values, size_t head_dim, float* acc) {
  uint8_t live[kDecodeTileKeys];
  size_t n = 0;
  for (size_t j = 0; j < kDecodeTileKeys; ++j)
    if (values[j] != nullptr) live[n++] = static_cast<uint8_t>(j);
  if (n == 0) return;
  const size_t chunks = head_dim / 16;
  for (size_t c = 0; c < chunks; ++c) {
    size_t g = 0;
    for (; g + 4 <= G; g += 4)
      accumulate_rows<kKind, 4>(p + g * kDecodeTileKeys, live, n, values, c, head_dim, acc + g * head_dim);
    for (; g < G; ++g)
      accumulate_rows<kKind, 1>(p + g * kDecodeTileKeys, live, n, values, c, head_dim, acc + g * head_dim);
  }
}

int kind_of(DType dtype) { return dtype == DType::kBF16 ? 1 : dtype == DType::kF16 ? 2 : 0; }

}  // namespace

bool decode_tile_supported(DType key_dtype, DType value_dtype, size_t head_dim) {
  const auto plain = [](DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; };
  return plain(key_dtype) && plain(value_dtype) && head_dim % 16 == 0 && head_dim > 0 && cpu_has_avx512_f_bw_vl();
}

void decode_tile_scores(const float* const* q, size_t G, const void* const* keys, DType key_dtype, size_t head_dim,
                        float scale, float* s) {
  switch (kind_of(key_dtype)) {
    case 1: return scores<1>(q, G, keys, head_dim, scale, s);
    case 2: return scores<2>(q, G, keys, head_dim, scale, s);
    default: return scores<0>(q, G, keys, head_dim, scale, s);
  }
}

void decode_tile_accumulate(const float* p, size_t G, const void* const* values, DType value_dtype, size_t head_dim,
                            float* acc) {
  switch (kind_of(value_dtype)) {
    case 1: return accumulate<1>(p, G, values, head_dim, acc);
    case 2: return accumulate<2>(p, G, values, head_dim, acc);
    default: return accumulate<0>(p, G, values, head_dim, acc);
  }
}

}  // namespace pagoda::kernels
