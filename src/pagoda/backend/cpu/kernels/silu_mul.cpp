#include "pagoda/backend/cpu/kernels/silu_mul.h"

#include <cmath>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }, /*min_chunk=*/8192);
}

}  // namespace pagoda::kernels
