#pragma once
// The linear layer y = x · W^T + bias on the CPU, for weights kept in their file
// dtype (f32, f16 or bf16, usually a zero-copy view into an mmapped checkpoint).
// f32 weights go straight to OpenBLAS sgemm. With more than 4 input rows, f16/bf16
// weights take the AVX512-BF16 GEMM where the CPU has it (bf16_gemm.h: activations
// rounded to bf16, f16 weights to bf16, f32 accumulation): the default there;
// PAGODA_CPU_BF16_GEMM=0 or set_bf16_gemm_enabled(false) picks the f32-exact path
// below. Otherwise f16/bf16 and block-quantized int8/int4 weights
// (--quantization, quant_dot.h) are converted to f32 a tile of rows at a time (a
// few MB, so the activations are repacked by sgemm once per tile, not once per few
// rows) and each tile goes through sgemm, so no full f32 copy is ever made. With at
// most 4 input rows (decode)
// the weights are read directly: f32/f16/bf16 by SIMD dot products
// (vector_dot.h), int8/int4 by integer dot products against the activations
// quantized per block of 32 (quant_dot.h).
//
// Threading: output columns are split across ThreadPool::global(); OpenBLAS is
// pinned to one thread per call so the two pools never oversubscribe the cores.
// Call from one thread at a time.

#include <cstddef>

#include "pagoda/model/weight_matrix.h"

namespace pagoda::kernels {

// y[m, w.rows] = x[m, w.cols] · w^T (+ bias[w.rows] when bias != nullptr).
// x, y, bias: f32, row-major, y must not alias x.
void linear(const float* x, size_t m, const WeightMatrix& w, const float* bias, float* y);

}  // namespace pagoda::kernels
