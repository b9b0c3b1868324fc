#pragma once
// The arithmetic of fp8 (float8_e4m3fn) weight matrices that every backend
// shares: dequantizing rows with their scales (the f32 reference of an FP8
// checkpoint), quantizing f32 rows to fp8 with one scale per row
// (--quantization fp8), and rounding activations to fp8 the way the layer's
// scheme does (model/fp8_config.h), so the CPU reference sees what an fp8
// tensor-core GEMM sees.
//
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>

#include "pagoda/model/weight_matrix.h"

namespace pagoda {

inline constexpr float kFp8E4M3Max = 448.0f;

// Rows [r0, r1) of w (dtype kFP8E4M3) into f32: out[(r - r0) * cols + c] = fp8[r][c] * scale(r, c).
void dequantize_fp8_rows(const WeightMatrix& w, size_t r0, size_t r1, float* out);

// One row of cols f32 values to fp8 bytes with the scale amax / 448 (returned;
// 0 for an all-zero row, whose bytes are then 0).
float quantize_fp8_row(const float* src, size_t cols, uint8_t* dst);

// Rounds the m x k activations x in place to what the layer's fp8 input
// holds, dequantized: per token (amax / 448), per token and group of
// s.activation_group columns, or with the static s.input_scale (clamped at
// +-448 * input_scale). kNone leaves x as it is.
void fake_quantize_fp8_activations(float* x, size_t m, size_t k, const Fp8MatrixScales& s);

}  // namespace pagoda
