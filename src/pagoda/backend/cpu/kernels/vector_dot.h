#pragma once
// Dot products and axpy on the CPU, with AVX-512 (F/BW/VL) and AVX2/FMA/F16C
// versions picked at run time (the build does not assume -march=native) and
// plain loops as fallback.
// Used where OpenBLAS is not the right tool: one-row GEMMs (decode) straight
// on f16/bf16 weights, the per-position loops of paged attention, and the
// widening of f16/bf16 weight tiles for prefill sgemm.
//
// Summation order differs from a sequential loop (AVX2: two 8-lane sums;
// AVX-512: four 16-lane sums), well within f32 rounding for the lengths used
// here; which order a run gets depends on the CPU. Thread-safe (pure
// functions), except select_vector_dot_implementation.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

// sum_i a[i] * b[i].
float dot_f32(const float* a, const float* b, size_t n);
// sum_i x[i] * f32(w[i]) for w in f32, f16 or bf16 (w_dtype), e.g. a weight row.
float dot_weights(const float* x, const void* w, DType w_dtype, size_t n);
// y[i] += alpha * x[i].
void axpy(float alpha, const float* x, float* y, size_t n);
// out[i] = f32(w[i]) for w in f16 or bf16 (w_dtype): exact, as convert_to_f32, 8 at a time
// (the f16/bf16 weight tiles of prefill GEMMs, linear() in matmul.h).
void widen_to_f32(const void* w, DType w_dtype, float* out, size_t n);

// "avx512", "avx2+fma+f16c" or "generic": which implementation the dispatch picked.
const char* vector_dot_implementation();
// For tests and A/B benchmarks: use the named implementation from now on (false,
// and no change, if the name is unknown or the CPU lacks its instructions). Not
// to be called while another thread runs these kernels.
bool select_vector_dot_implementation(std::string_view name);

}  // namespace pagoda::kernels
