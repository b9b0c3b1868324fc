#pragma once
// RMSNorm as in Llama/Qwen: out[r, i] = x[r, i] / sqrt(mean_i(x[r, :]^2) + eps) * weight[i].
// Shapes: x and out [rows, dim] row-major f32, weight [dim]. out may alias x.
// Runs rows in parallel on ThreadPool::global(); call from one thread at a time.

#include <cstddef>

namespace pagoda::kernels {

void rmsnorm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps);

}  // namespace pagoda::kernels
