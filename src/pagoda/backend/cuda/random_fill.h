#pragma once
// Deterministic pseudo-random bf16 data made on the GPU, for random weights
// (--load-format random) and for tests and benchmarks that need gigabytes of
// non-zero data without a host round trip. Element i is
// random_uniform_element(seed, i, low, high) of model/random_weights.h, the
// value the CPU computes for the same (seed, i). Enqueued on `stream`; returns
// the launch status.

#include <cuda_runtime.h>

#include <cstdint>

namespace pagoda::cuda {

cudaError_t fill_random_bf16(void* data, int64_t count, float low, float high, uint64_t seed, cudaStream_t stream);

}  // namespace pagoda::cuda
