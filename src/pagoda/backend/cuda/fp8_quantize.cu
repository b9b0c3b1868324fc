// fp8 activation quantization and the fp8 GEMM's scaling epilogue (fp8_ops.h).

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/fp8_convert.cuh"
#include "pagoda/backend/cuda/fp8_ops.h"

namespace pagoda::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 128;

__device__ uint8_t to_fp8(float v, float scale) { return fp8_e4m3_at_scale(v, scale); }

__global__ void quantize_fp8_per_token_kernel(const __nv_bfloat16* x, int32_t k, uint8_t* q, float* scales) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* in = x + row * k;
  float amax = 0.0f;
  for (int32_t c = threadIdx.x; c < k; c += kThreads) amax = fmaxf(amax, fabsf(__bfloat162float(in[c])));
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  __shared__ float warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float scale = amax / 448.0f;
  if (threadIdx.x == 0) scales[row] = scale;
  uint8_t* out = q + row * k;
  for (int32_t c = threadIdx.x; c < k; c += kThreads) out[c] = to_fp8(__bfloat162float(in[c]), scale);
}

// One block of 128 threads per (row, group): thread t owns column g * 128 + t.
__global__ void quantize_fp8_group128_kernel(const __nv_bfloat16* x, int32_t m, int32_t k, uint8_t* q,
                                             float* scales, int32_t scale_stride) {
  const int64_t row = blockIdx.x;
  const int32_t group = blockIdx.y;
  const int32_t c = group * kGroup + threadIdx.x;
  const bool inside = c < k;
  if (row >= m) {  // padding rows
    if (inside) q[row * k + c] = 0;
    if (threadIdx.x == 0) scales[static_cast<int64_t>(group) * scale_stride + row] = 0.0f;
    return;
  }
  const float v = inside ? __bfloat162float(x[row * k + c]) : 0.0f;
  float amax = fabsf(v);
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  __shared__ float warp_max[kGroup / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = fmaxf(fmaxf(warp_max[0], warp_max[1]), fmaxf(warp_max[2], warp_max[3]));
  const float scale = amax / 448.0f;
  if (threadIdx.x == 0) scales[static_cast<int64_t>(group) * scale_stride + row] = scale;
  if (inside) q[row * k + c] = to_fp8(v, scale);
}

__global__ void quantize_fp8_static_kernel(const __nv_bfloat16* x, int32_t k, const float* input_scale, uint8_t* q,
                                           float* scales) {
  const int64_t row = blockIdx.x;
  const float scale = *input_scale;
  if (threadIdx.x == 0) scales[row] = scale;
  for (int32_t c = threadIdx.x; c < k; c += kThreads) q[row * k + c] = to_fp8(__bfloat162float(x[row * k + c]), scale);
}

__global__ void fp8_apply_outer_scales_kernel(const float* d, const float* x_scales, const float* w_scales,
                                              int32_t m, int32_t n, __nv_bfloat16* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(m) * n) return;
  const int64_t r = i / n, c = i % n;
  y[i] = __float2bfloat16(d[i] * x_scales[r] * w_scales[c]);
}

}  // namespace

cudaError_t fp8_apply_outer_scales(const float* d, const float* x_scales, const float* w_scales, int32_t m,
                                   int32_t n, __nv_bfloat16* y, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(m) * n;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  fp8_apply_outer_scales_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(d, x_scales, w_scales, m, n,
                                                                                       y);
  return cudaGetLastError();
}

cudaError_t quantize_fp8_per_token(const __nv_bfloat16* x, int32_t m, int32_t k, uint8_t* q, float* scales,
                                   cudaStream_t stream) {
  if (m <= 0 || k <= 0) return cudaSuccess;
  quantize_fp8_per_token_kernel<<<m, kThreads, 0, stream>>>(x, k, q, scales);
  return cudaGetLastError();
}

cudaError_t quantize_fp8_per_token_group128(const __nv_bfloat16* x, int32_t m, int32_t padded_m, int32_t k,
                                            uint8_t* q, float* scales, int32_t scale_stride, cudaStream_t stream) {
  if (padded_m <= 0 || k <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(padded_m), static_cast<unsigned>((k + kGroup - 1) / kGroup));
  quantize_fp8_group128_kernel<<<grid, kGroup, 0, stream>>>(x, m, k, q, scales, scale_stride);
  return cudaGetLastError();
}

cudaError_t quantize_fp8_static(const __nv_bfloat16* x, int32_t m, int32_t k, const float* input_scale, uint8_t* q,
                                float* scales, cudaStream_t stream) {
  if (m <= 0 || k <= 0) return cudaSuccess;
  quantize_fp8_static_kernel<<<m, kThreads, 0, stream>>>(x, k, input_scale, q, scales);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
