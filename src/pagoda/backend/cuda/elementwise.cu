// Small elementwise ops of the MLP and projections: SiLU-mul and bias add.
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

// Two outputs per thread through bf16x2 loads when the width allows it.
__global__ void silu_mul_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int32_t rows,
                                int32_t intermediate) {
  pdl_launch_dependents();  // the down projection's GEMV streams its first weights meanwhile (pdl.cuh)
  pdl_wait();               // launched programmatically: the kernel ahead may still run
  const int32_t pairs = intermediate / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * pairs) return;
  const int64_t r = i / pairs;
  const int32_t p = static_cast<int32_t>(i % pairs);
  const bf16* row = gate_up + r * 2 * intermediate;
  const float2 g = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(row)[p]);
  const float2 u = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(row + intermediate)[p]);
  const float2 y = make_float2(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y);
  reinterpret_cast<__nv_bfloat162*>(out + r * intermediate)[p] = __float22bfloat162_rn(y);
}

__global__ void silu_mul_scalar_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int32_t rows,
                                       int32_t intermediate) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * intermediate) return;
  const int64_t r = i / intermediate;
  const int32_t c = static_cast<int32_t>(i % intermediate);
  const float g = __bfloat162float(gate_up[r * 2 * intermediate + c]);
  const float u = __bfloat162float(gate_up[r * 2 * intermediate + intermediate + c]);
  out[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
}

__global__ void add_bias_kernel(bf16* __restrict__ x, int64_t row_stride, int32_t rows, int32_t cols,
                                const float* __restrict__ bias) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * cols) return;
  const int64_t r = i / cols;
  const int32_t c = static_cast<int32_t>(i % cols);
  bf16& v = x[r * row_stride + c];
  v = __float2bfloat16(__bfloat162float(v) + bias[c]);
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

cudaError_t silu_mul(const bf16* gate_up, bf16* out, int32_t rows, int32_t intermediate, cudaStream_t stream) {
  if (rows == 0 || intermediate == 0) return cudaSuccess;
  if (intermediate % 2 == 0) {
    const int64_t n = static_cast<int64_t>(rows) * (intermediate / 2);
    return launch_pdl(silu_mul_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, stream, gate_up, out, rows,
                      intermediate);
  }
  const int64_t n = static_cast<int64_t>(rows) * intermediate;
  return launch_pdl(silu_mul_scalar_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, stream, gate_up, out, rows,
                    intermediate);
}

cudaError_t add_bias(bf16* x, int64_t row_stride, int32_t rows, int32_t cols, const float* bias,
                     cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n == 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, row_stride, rows, cols, bias);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
