#pragma once
// A weight matrix as the checkpoint holds it: a typed view (usually into an
// mmapped safetensors file) that backends read or upload. Not owning.

#include <cstddef>

#include "pagoda/core/dtype.h"

namespace pagoda {

// A row-major [rows, cols] matrix as PyTorch's nn.Linear stores it:
// rows = output features, cols = input features.
struct WeightMatrix {
  // kF32, kF16 or kBF16 as in the checkpoint; kInt8 or kInt4 once the CPU
  // backend has block-quantized it (--quantization, backend/cpu/kernels/quant_dot.h:
  // rows of 32-weight blocks, not one element per dtype_bits).
  DType dtype = DType::kF32;
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
};

}  // namespace pagoda
