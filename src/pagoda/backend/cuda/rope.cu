// Rotary embedding: one thread per (token, head, pair). sincosf (not the fast
// intrinsics): angles reach position * 1 radian, where __sinf loses accuracy.
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/pdl.cuh"
#include "pagoda/backend/cuda/rope_pair.cuh"

namespace pagoda::cuda {

namespace {

// q_out != nullptr: heads h < q_heads are also written to q_out [num_tokens, q_heads * 2 * half].
__global__ void rope_kernel(bf16* __restrict__ x, int64_t row_stride, const int32_t* __restrict__ positions,
                            int32_t num_tokens, int32_t num_heads, int32_t half,
                            const float* __restrict__ inv_freq, bf16* __restrict__ q_out, int32_t q_heads) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * num_heads * half) {
    pdl_wait();  // every thread of a programmatic launch waits before it exits (pdl.cuh)
    return;
  }
  const int32_t pair = static_cast<int32_t>(i % half);
  const int64_t head_item = i / half;
  const int32_t h = static_cast<int32_t>(head_item % num_heads);
  const int64_t t = head_item / num_heads;
  // Positions and frequencies are the step's inputs, written before the step's first kernel: the angle
  // is computed while the kernel ahead (a programmatic launch, pdl.cuh) may still run.
  const float angle = static_cast<float>(positions[t]) * inv_freq[pair];
  float s, c;
  sincosf(angle, &s, &c);
  pdl_launch_dependents();
  pdl_wait();
  bf16* v = x + t * row_stride + static_cast<int64_t>(h) * 2 * half;
  const float a = __bfloat162float(v[pair]);
  const float b = __bfloat162float(v[pair + half]);
  bf16 lo, hi;
  rope_pair(a, b, s, c, lo, hi);
  v[pair] = lo;
  v[pair + half] = hi;
  if (q_out != nullptr && h < q_heads) {
    bf16* o = q_out + (t * q_heads + h) * 2 * half;
    o[pair] = lo;
    o[pair + half] = hi;
  }
}

}  // namespace

cudaError_t rope(bf16* x, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t num_heads,
                 int32_t head_dim, const float* inv_freq, cudaStream_t stream) {
  const int32_t half = head_dim / 2;
  const int64_t n = static_cast<int64_t>(num_tokens) * num_heads * half;
  if (n == 0) return cudaSuccess;
  return launch_pdl(rope_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, x, row_stride,
                    positions, num_tokens, num_heads, half, inv_freq, nullptr, 0);
}

cudaError_t rope_qk(bf16* qkv, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t num_q_heads,
                    int32_t num_kv_heads, int32_t head_dim, const float* inv_freq, bf16* q_out, cudaStream_t stream) {
  const int32_t half = head_dim / 2;
  const int32_t heads = num_q_heads + num_kv_heads;
  const int64_t n = static_cast<int64_t>(num_tokens) * heads * half;
  if (n == 0) return cudaSuccess;
  return launch_pdl(rope_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, qkv, row_stride,
                    positions, num_tokens, heads, half, inv_freq, q_out, num_q_heads);
}

}  // namespace pagoda::cuda
