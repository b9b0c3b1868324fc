#pragma once
// Weight-streaming GEMV for decode-sized batches: y [m, n] = x [m, k] . w [n, k]^T for m = 1 ... kGemvMaxRows,
// x bf16 activations (row-major, contiguous), w the weights as nn.Linear stores them, f32 accumulation.
// At a few rows a projection is a read of its weights; cuBLAS(Lt) picks tiled GEMM kernels that do not
// reach HBM bandwidth there, so these kernels stream each weight row once with 128-bit loads that bypass L1
// (a block owns kGemvRowsPerBlock output columns and splits k across its threads, so even n = 4096 keeps
// every SM busy and the bytes in flight high) and reuse each loaded weight for every activation row.
//
// Weights:
//   gemv_bf16: bf16 weights, output bf16 (projections) or f32 (logits).
//   gemv_fp8: e4m3 weights with their f32 scales, output bf16. Weight-only: the activations stay bf16 (the
//     fp8 GEMM quantizes them per token; here the product is the dequantized weights' at bf16 inputs), so
//     the CUDA model uses it for dynamic activation schemes only: a static input_scale is part of the
//     checkpoint's arithmetic and keeps the quantize + fp8 GEMM path.
//     block_stride == 0: scales [n], one per output channel (a per-tensor scale as n equal values);
//     block_stride > 0: 128x128 blocks, scales [ceil(n / 128)][block_stride] (k-block fastest), the layout
//     of Fp8Gemm::linear_block128 (block_stride = fp8_block_weight_scale_stride(k)).
//     depth (kGemvFp8Depths: 1, 2 or 4; anything else is cudaErrorInvalidValue) picks the load shape: 1 the
//     direct kernel; 2 and 4 give each thread 2x / 4x the 16-byte weight loads per trip with fewer threads
//     per block (gemv.cu), all issued before any math. Every depth is deterministic (a fixed summation
//     order per depth; depths differ from each other by f32 rounding only). The CUDA model takes it from
//     PAGODA_GEMV_FP8_DEPTH (default kGemvDefaultFp8Depth).
//   gemv_fp8_logits: gemv_fp8's arithmetic (the direct kernel) with f32 output: an e4m3 lm_head.
//
// The MLP's gate_up projection with its activation (gemv_bf16_silu, gemv_fp8_silu): w is the [2 x
// intermediate, k] gate_up weight (gate rows first, then up rows; fp8 scales over its 2 x intermediate rows)
// and act [m, intermediate] = silu(x . gate^T) * (x . up^T), bit for bit what gemv_bf16 / gemv_fp8 and then
// silu_mul (cuda_ops.h) write, in one launch: each block reduces a gate row and its up row side by side.
// (A residual add + RMSNorm epilogue done by the grid's last block was measured slower than the separate
// norm and removed: docs/BENCHMARKS.md, "GEMV epilogues".)
//
// Requirements (gemv_supported): 1 <= m <= kGemvMaxRows; k % 8 == 0 (bf16) or k % 16 == 0 (fp8); x and w
// 16-byte aligned. Anything else is the GEMM's. Launches return cudaErrorInvalidValue for unsupported
// shapes and otherwise cudaGetLastError(); no synchronization, no allocation: CUDA-graph capturable.
// Launched with programmatic dependent launch (pdl.cuh): a GEMV's blocks may start while the kernel ahead
// runs and stream weights until their PDL wait; the kernel ahead lets them start early by calling
// pdl_launch_dependents (the norms, silu_mul and the decode attention do).
// Thread safety: plain launches on the caller's stream.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace pagoda::cuda {

inline constexpr int32_t kGemvMaxRows = 8;
inline constexpr int32_t kGemvRowsPerBlock = 4;  // fp8 weights at 1-2 activation rows: 2x

// Default dispatch thresholds of the CUDA model (rows up to which a projection runs as a GEMV), measured
// on the H200 at the Llama-3-8B shapes (docs/BENCHMARKS.md, "Weight-streaming GEMV"): the GEMV wins at 1
// and 2 rows (fp8 also saves the activation quantization), breaks even with cuBLASLt at 4 and loses at 8,
// where every weight feeds 8 multiply-adds on CUDA cores. PAGODA_GEMV_MAX_ROWS (0 ... 8) overrides both.
inline constexpr int32_t kGemvDefaultMaxRowsBf16 = 2;
inline constexpr int32_t kGemvDefaultMaxRowsFp8 = 2;
// fp8 GEMV load depth (gemv_fp8): the direct kernel until the deeper ones are measured faster.
inline constexpr int32_t kGemvDefaultFp8Depth = 1;
inline constexpr int32_t kGemvFp8Depths[] = {1, 2, 4};

bool gemv_supported(int32_t m, int32_t k, bool fp8_weights, const void* x, const void* w);

cudaError_t gemv_bf16(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t n, int32_t k, void* y,
                      bool f32_output, cudaStream_t stream);

cudaError_t gemv_fp8(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales, int32_t block_stride,
                     int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream,
                     int32_t depth = kGemvDefaultFp8Depth);

cudaError_t gemv_fp8_logits(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales,
                            int32_t block_stride, int32_t n, int32_t k, float* y, cudaStream_t stream);

cudaError_t gemv_bf16_silu(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t intermediate,
                           int32_t k, __nv_bfloat16* act, cudaStream_t stream);

cudaError_t gemv_fp8_silu(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales,
                          int32_t block_stride, int32_t intermediate, int32_t k, __nv_bfloat16* act,
                          cudaStream_t stream, int32_t depth = kGemvDefaultFp8Depth);

}  // namespace pagoda::cuda
