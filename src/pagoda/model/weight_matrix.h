#pragma once
// A weight matrix as the checkpoint holds it: a typed view (usually into an
// mmapped safetensors file) that backends read or upload. Not owning.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/model/fp8_config.h"

namespace pagoda {

// The scales of an fp8 (kFP8E4M3) matrix, w[r][c] = fp8[r][c] * scale(r, c)
// (model/fp8_config.h), and how the layer quantizes its input activations.
// The activation part stays set when the weights are dequantized to f32 (the
// CPU reference then still emulates the fp8 activations).
struct Fp8MatrixScales {
  Fp8WeightScale layout = Fp8WeightScale::kTensor;
  // f32 multipliers, not owning: 1 (kTensor), rows (kChannel), or
  // ceil(rows / block_rows) x ceil(cols / block_cols) row-major (kBlock).
  const float* scales = nullptr;
  int32_t block_rows = 0, block_cols = 0;
  Fp8Activation activation = Fp8Activation::kNone;
  int32_t activation_group = 0;  // kDynamicGroup: columns per scale
  float input_scale = 0.0f;      // kStaticTensor: the checkpoint's input_scale (> 0)
};

// A row-major [rows, cols] matrix as PyTorch's nn.Linear stores it:
// rows = output features, cols = input features.
struct WeightMatrix {
  // kF32, kF16 or kBF16 as in the checkpoint; kFP8E4M3 (one byte per weight,
  // scaled by fp8.scales) from an FP8 checkpoint or --quantization fp8; kInt8
  // or kInt4 once the CPU backend has block-quantized it (--quantization,
  // backend/cpu/kernels/quant_dot.h: rows of 32-weight blocks, not one element
  // per dtype_bits).
  DType dtype = DType::kF32;
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  Fp8MatrixScales fp8 = {};
  // kInt8 / kInt4 only: the rows are regrouped in four-row panels for the
  // decode GEMV (backend/cpu/kernels/quant_panels.h), same bytes per matrix.
  bool quant_panels = false;
};

}  // namespace pagoda
