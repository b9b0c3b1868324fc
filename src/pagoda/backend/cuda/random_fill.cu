// Reproducible random data made on the GPU: a splitmix64 hash of (seed, index)
// per element, so no host memory or transfer is needed for an 8B model's
// weights or a benchmark's gigabytes of KV.
#include "pagoda/backend/cuda/random_fill.h"

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/model/random_weights.h"

namespace pagoda::cuda {

namespace {

__global__ void fill_random_bf16_kernel(bf16* __restrict__ x, int64_t n, float low, float high, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = __float2bfloat16(random_uniform_element(seed, static_cast<uint64_t>(i), low, high));
  }
}

__global__ void fill_constant_kernel(float* __restrict__ x, int64_t n, float value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = value;
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

cudaError_t fill_random_bf16(void* x, int64_t n, float low, float high, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_random_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<bf16*>(x), n, low, high, seed);
  return cudaGetLastError();
}

cudaError_t fill_constant(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_constant_kernel<<<grid_for(n), 256, 0, stream>>>(x, n, value);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
