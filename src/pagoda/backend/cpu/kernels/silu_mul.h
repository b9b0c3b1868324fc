#pragma once
// The gated MLP activation: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)).
// gate, up, out: n f32 values; out may alias gate or up. Parallel on ThreadPool::global().
// With AVX2 + FMA, 8 lanes at a time with the polynomial exp of vector_exp.h (relative
// error ~2e-7), else std::exp per element.

#include <cstddef>

namespace pagoda::kernels {

void silu_mul(const float* gate, const float* up, float* out, size_t n);

}  // namespace pagoda::kernels
