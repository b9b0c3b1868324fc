#pragma once
// exp(x) of 8 f32 lanes with AVX2 + FMA, shared by the CPU kernels that need a
// vector exp (the tiled attention's softmax tiles, the gated MLP's silu).
//
// Cephes' expf: x clamped to [-87, 88.38], n = floor(x / ln 2 + 1/2), r = x - n ln 2
// (ln 2 in two parts so r is exact), a degree-6 polynomial in r, and 2^n built in the
// exponent bits. Relative error about 2e-7 over the clamped range; exp(-inf) and
// anything below -87 give exp(-87) (~1.6e-38), not 0: callers that need an exact 0
// mask it themselves. Pure function, thread-safe.
//
// The function carries target("avx2,fma"): call it only from functions compiled for
// AVX2 + FMA (or a superset), chosen at run time by the caller's CPU check.

#include <immintrin.h>

namespace pagoda::kernels {

__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

}  // namespace pagoda::kernels
