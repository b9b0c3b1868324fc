#include "pagoda/kernels/cuda/random_fill.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace pagoda::kernels::cuda {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_bf16_kernel(__nv_bfloat16* data, size_t count, uint64_t seed, float low,
                                        float span) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint64_t bits = splitmix64(seed * 0x100000001b3ull + i);
    const float unit = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = __float2bfloat16(low + span * unit);
  }
}

}  // namespace

cudaError_t launch_fill_random_bf16(void* data, size_t count, uint64_t seed, float low, float high,
                                    cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const size_t blocks = std::min<size_t>((count + 255) / 256, 132 * 64);
  fill_random_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<__nv_bfloat16*>(data), count, seed, low, high - low);
  return cudaGetLastError();
}

}  // namespace pagoda::kernels::cuda
