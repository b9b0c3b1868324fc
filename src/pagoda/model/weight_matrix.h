#pragma once
// A weight matrix as the checkpoint holds it: a typed view (usually into an
// mmapped safetensors file) that backends read or upload. Not owning.

#include <cstddef>

#include "pagoda/core/dtype.h"

namespace pagoda {

// A row-major [rows, cols] matrix as PyTorch's nn.Linear stores it:
// rows = output features, cols = input features.
struct WeightMatrix {
  DType dtype = DType::kF32;  // kF32, kF16 or kBF16
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
};

}  // namespace pagoda
