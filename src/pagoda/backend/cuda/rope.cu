// Rotary embedding: one thread per (token, head, pair). sincosf (not the fast
// intrinsics): angles reach position * 1 radian, where __sinf loses accuracy.
#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

namespace {

__global__ void rope_kernel(bf16* __restrict__ x, int64_t row_stride, const int32_t* __restrict__ positions,
                            int32_t num_tokens, int32_t num_heads, int32_t half,
                            const float* __restrict__ inv_freq) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * num_heads * half) return;
  const int32_t pair = static_cast<int32_t>(i % half);
  const int64_t head_item = i / half;
  const int32_t h = static_cast<int32_t>(head_item % num_heads);
  const int64_t t = head_item / num_heads;
  const float angle = static_cast<float>(positions[t]) * inv_freq[pair];
  float s, c;
  sincosf(angle, &s, &c);
  bf16* v = x + t * row_stride + static_cast<int64_t>(h) * 2 * half;
  const float a = __bfloat162float(v[pair]);
  const float b = __bfloat162float(v[pair + half]);
  v[pair] = __float2bfloat16(a * c - b * s);
  v[pair + half] = __float2bfloat16(b * c + a * s);
}

}  // namespace

cudaError_t rope(bf16* x, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t num_heads,
                 int32_t head_dim, const float* inv_freq, cudaStream_t stream) {
  const int32_t half = head_dim / 2;
  const int64_t n = static_cast<int64_t>(num_tokens) * num_heads * half;
  if (n == 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, row_stride, positions, num_tokens,
                                                                          num_heads, half, inv_freq);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
