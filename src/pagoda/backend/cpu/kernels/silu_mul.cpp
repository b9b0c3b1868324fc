#include "pagoda/backend/cpu/kernels/silu_mul.h"

// GCC 12 warns "'__Y' may be used uninitialized" inside the AVX-512 intrinsics'
// headers (their _mm512_undefined_* sources, GCC bug 105593): not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

namespace {

#define PAGODA_AVX512 __attribute__((target("avx512f")))

// exp(x) of 16 lanes: Cephes' expf (range reduction by ln 2 in two parts, degree-6
// polynomial, 2^n built in the exponent bits), relative error about 2e-7 over the
// clamped range [-87, 88.38] (the same scheme as the tiled attention's 8-lane exp).
PAGODA_AVX512 inline __m512 exp_avx512(__m512 x) {
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

void silu_mul_generic(const float* gate, const float* up, float* out, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

PAGODA_AVX512 void silu_mul_avx512(const float* gate, const float* up, float* out, size_t begin, size_t end) {
  size_t i = begin;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  silu_mul_generic(gate, up, out, i, end);
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    if (avx512) silu_mul_avx512(gate, up, out, begin, end);
    else silu_mul_generic(gate, up, out, begin, end);
  }, /*min_chunk=*/8192);
}

}  // namespace pagoda::kernels
