#pragma once
// Owned f32 matrices filled with model/random_weights.h's values, for the CPU
// backend's --load-format random models (llama family and DeepSeek).
//
// Thread safety: fills on ThreadPool::global(); one caller at a time.

#include <cstdint>
#include <memory>
#include <vector>

#include "pagoda/model/random_weights.h"
#include "pagoda/model/weight_matrix.h"

namespace pagoda {

class RandomMatrices {
 public:
  // The matrices' memory is appended to `owned`, which must outlive them.
  RandomMatrices(uint64_t seed, std::vector<std::unique_ptr<float[]>>& owned) : seed_(seed), owned_(owned) {}
  // A [rows, cols] f32 matrix; element i is random_uniform_element of (seed, kind, layer)'s stream.
  WeightMatrix make(RandomMatrix kind, int32_t layer, int64_t rows, int64_t cols);

 private:
  uint64_t seed_;
  std::vector<std::unique_ptr<float[]>>& owned_;
};

}  // namespace pagoda
