#pragma once
// Fills device memory with deterministic pseudo-random bf16 values, for tests
// and benchmarks that need gigabytes of non-zero data without a host round
// trip. Value i depends only on (seed, i): uniform in [low, high).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pagoda::kernels::cuda {

cudaError_t launch_fill_random_bf16(void* data, size_t count, uint64_t seed, float low, float high,
                                    cudaStream_t stream);

}  // namespace pagoda::kernels::cuda
