#pragma once
// Dot products and axpy on the CPU, with AVX2/FMA/F16C versions picked at run
// time (the build does not assume -march=native) and plain loops as fallback.
// Used where OpenBLAS is not the right tool: one-row GEMMs (decode) straight
// on f16/bf16 weights, and the per-position loops of paged attention.
//
// Summation order differs from a sequential loop (8 lanes), well within f32
// rounding for the lengths used here. Thread-safe (pure functions).

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

// sum_i a[i] * b[i].
float dot_f32(const float* a, const float* b, size_t n);
// sum_i x[i] * f32(w[i]) for w in f32, f16 or bf16 (w_dtype), e.g. a weight row.
float dot_weights(const float* x, const void* w, DType w_dtype, size_t n);
// y[i] += alpha * x[i].
void axpy(float alpha, const float* x, float* y, size_t n);

// "avx2+fma+f16c" or "generic": which implementation the dispatch picked.
const char* vector_dot_implementation();

}  // namespace pagoda::kernels
