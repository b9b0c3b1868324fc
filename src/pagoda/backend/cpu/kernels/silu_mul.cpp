#include "pagoda/backend/cpu/kernels/silu_mul.h"

#include <cmath>

#include "pagoda/backend/cpu/kernels/vector_exp.h"
#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

namespace {

void silu_mul_generic(const float* gate, const float* up, float* out, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* gate, const float* up, float* out, size_t begin,
                                                        size_t end) {
  size_t i = begin;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  silu_mul_generic(gate, up, out, i, end);
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    if (avx2) silu_mul_avx2(gate, up, out, begin, end);
    else silu_mul_generic(gate, up, out, begin, end);
  }, /*min_chunk=*/8192);
}

}  // namespace pagoda::kernels
