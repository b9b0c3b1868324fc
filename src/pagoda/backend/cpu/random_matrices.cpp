#include "pagoda/backend/cpu/random_matrices.h"

#include "pagoda/core/thread_pool.h"

namespace pagoda {

WeightMatrix RandomMatrices::make(RandomMatrix kind, int32_t layer, int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  auto data = std::make_unique<float[]>(n);
  const uint64_t stream = random_matrix_stream(seed_, kind, layer);
  float* out = data.get();
  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      out[i] = random_uniform_element(stream, i, -kRandomWeightHalfWidth, kRandomWeightHalfWidth);
  }, 1 << 16);
  WeightMatrix m{DType::kF32, data.get(), static_cast<size_t>(rows), static_cast<size_t>(cols)};
  owned_.push_back(std::move(data));
  return m;
}

}  // namespace pagoda
