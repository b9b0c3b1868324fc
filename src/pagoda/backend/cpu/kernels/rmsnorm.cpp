#include "pagoda/backend/cpu/kernels/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

void rmsnorm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps) {
  ThreadPool::global().parallel_for(rows, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      float* yr = out + r * dim;
      // Sum in double: the row mean is the one place where f32 rounding would pile up.
      double sum_sq = 0.0;
      for (size_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
      const float inv_rms = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
      for (size_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv_rms);
    }
  }, /*min_chunk=*/std::max<size_t>(1, 16384 / (dim + 1)));
}

}  // namespace pagoda::kernels
