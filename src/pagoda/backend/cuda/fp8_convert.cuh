#pragma once
// One value to fp8 e4m3 at a per-token scale, shared by the standalone quantize kernels (fp8_quantize.cu) and
// the norm / SiLU kernels that write their output as fp8 directly (rmsnorm.cu, elementwise.cu): all of them
// must produce the same bytes for the same bf16 input.

#include <cstdint>

#include <cuda_fp8.h>

namespace pagoda::cuda {

__device__ __forceinline__ uint8_t fp8_e4m3_at_scale(float v, float scale) {
  // The division (not a reciprocal product) matches the CPU reference bit for bit.
  const float q = scale > 0.0f ? __fdiv_rn(v, scale) : 0.0f;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// The per-token scale of a row whose largest |value| is amax (the quantize kernels' formula).
__device__ __forceinline__ float fp8_per_token_scale(float amax) { return amax / 448.0f; }

// Max over the block of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets the result.
__device__ __forceinline__ float fp8_block_max(float value) {
  __shared__ float partial[32];
  __shared__ float total;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = (blockDim.x + 31) / 32;
    float v = lane < num_warps ? partial[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

}  // namespace pagoda::cuda
