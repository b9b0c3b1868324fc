#pragma once
// The launcher of the per-token fp8 activation quantization (fp8_quantize.cu),
// apart from fp8_gemm.h so the .cu file needs only CUDA headers (C++17).
// Contract: see quantize_fp8_per_token in fp8_gemm.h.

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

}  // namespace pagoda::cuda
