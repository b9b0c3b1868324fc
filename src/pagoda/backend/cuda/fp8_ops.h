#pragma once
// The launchers of the fp8 kernels (fp8_quantize.cu): activation quantization
// (per token, per token and 128-column group, static) and the scaling epilogue,
// apart from fp8_gemm.h so the .cu file needs only CUDA headers (C++17).
// Used by Fp8Gemm (fp8_gemm.h) and the CUDA model's fp8 projections.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace pagoda::cuda {

// q [m, k] fp8 e4m3 bytes and scales [m] f32 from x [m, k] bf16 (row-major,
// contiguous): scales[r] = amax(x[r, :]) / 448, q = fp8(x / scale) rounded to
// nearest even and saturated at +-448; an all-zero row gets scale 0 and zero
// bytes. One block per row. Enqueues on stream; returns cudaGetLastError().
cudaError_t quantize_fp8_per_token(const __nv_bfloat16* x, int32_t m, int32_t k, uint8_t* q, float* scales,
                                   cudaStream_t stream);

// As quantize_fp8_per_token with one scale per token and 128-column group (the
// last group may be shorter): scales[g * scale_stride + r] for g < ceil(k / 128),
// r < m (token fastest: cuBLASLt's VEC128_32F layout for the B operand). Rows
// m <= r < padded_m (padded_m >= m) get zero bytes and scale 0 without reading x.
cudaError_t quantize_fp8_per_token_group128(const __nv_bfloat16* x, int32_t m, int32_t padded_m, int32_t k,
                                            uint8_t* q, float* scales, int32_t scale_stride, cudaStream_t stream);

// Static activations: q = fp8(x / *input_scale) (saturated), scales[r] =
// *input_scale for every row (input_scale: one f32 on the device, > 0).
cudaError_t quantize_fp8_static(const __nv_bfloat16* x, int32_t m, int32_t k, const float* input_scale, uint8_t* q,
                                float* scales, cudaStream_t stream);

// The norm and the SiLU with quantize_fp8_per_token fused in (rmsnorm.cu, elementwise.cu): q and scales
// byte for byte as add_rmsnorm / silu_mul (cuda_ops.h) into bf16, then quantize_fp8_per_token of that, without
// the bf16 round trip through memory. add_rmsnorm_fp8 updates residual as add_rmsnorm does (delta may be null:
// then it is rmsnorm of residual); q [rows, dim] or [rows, intermediate], scales [rows].
cudaError_t add_rmsnorm_fp8(float* residual, const __nv_bfloat16* delta, const float* weight, int32_t rows,
                            int32_t dim, float eps, uint8_t* q, float* scales, cudaStream_t stream);
cudaError_t silu_mul_fp8(const __nv_bfloat16* gate_up, int32_t rows, int32_t intermediate, uint8_t* q, float* scales,
                         cudaStream_t stream);

// The epilogue of an fp8 GEMM run with unit scales into f32: y[r, c] =
// bf16(d[r * n + c] * x_scales[r] * w_scales[c]) for r < m, c < n (d and y
// row-major [m, n]; x_scales [m] per token, w_scales [n] per output channel).
cudaError_t fp8_apply_outer_scales(const float* d, const float* x_scales, const float* w_scales, int32_t m,
                                   int32_t n, __nv_bfloat16* y, cudaStream_t stream);

}  // namespace pagoda::cuda
