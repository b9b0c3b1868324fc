#pragma once
// A weight-streaming fp8 GEMV on tensor cores for decode-sized steps (1 ... kFp8MmaGemvMaxRows rows):
//   y [m, n] = (xq [m, k] * x_scales[m]) . (w [n, k] * w_scales[n])^T, f32 accumulation,
// with xq the activations quantized to e4m3 per row (the fp8 GEMM's input: add_rmsnorm_fp8, silu_mul_fp8,
// quantize_fp8_per_token) and w e4m3 weights as nn.Linear stores them, one scale per output channel (a
// per-tensor scale as n equal values). The arithmetic of Fp8Gemm::linear at any m, in another summation
// order: a decode step of 1-8 rows computes what a batched step computes for the same rows.
//
// Why: the weight-only GEMV (gemv.h) widens every e4m3 weight to f32 and multiplies it by every activation
// row on CUDA cores, so its time grows with m (2x at 8 rows what it is at 1), and cuBLASLt's tiled GEMMs do
// not stream the weights at a few rows. Here each warp's mma.sync m16n8k32 (e4m3 x e4m3 -> f32) takes 16
// weight rows x 32 bytes straight from the 16-byte loads, and the (up to 8) activation rows are the mma's
// n = 8 columns: one load and one mma per 32 weight bytes a thread, whatever m is. At 1-2 rows the
// weight-only GEMV is still the faster of the two on an H100 (docs/BENCHMARKS.md, "fp8 GEMV on tensor
// cores"), so the CUDA model runs this one from 3 rows (kFp8MmaGemvDefaultRows bounds it above).
//
// Layout (fp8_mma_gemv.cu): a block of warps (Fp8MmaGemvShape) owns 16 weight rows; the rows' k is cut into 64-byte steps
// dealt round-robin to the warps. In a step, lane (g, t) (g = lane / 4, t = lane % 4) loads bytes
// [64 s + 16 t, +16) of rows g and g + 8 and of activation row g (zeros for g >= m): the mma's k order is a
// permutation of the step's 64 bytes that A and B share, so the 16-byte loads are its fragments as they come.
// The warps' partial sums meet in shared memory; the scales apply once per output.
//
// Requirements (fp8_mma_gemv_supported): 1 <= m <= kFp8MmaGemvMaxRows, k % 64 == 0, xq and w 16-byte
// aligned (rows of k bytes then stay aligned); n >= 1. Anything else is cudaErrorInvalidValue. Deterministic
// (a fixed summation order per shape). Launched with programmatic dependent launch (pdl.cuh): the first
// steps' weight loads run ahead of the PDL wait. No allocation, no synchronization: CUDA-graph capturable.
// Thread safety: plain launches on the caller's stream.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace pagoda::cuda {

inline constexpr int32_t kFp8MmaGemvMaxRows = 8;
// The CUDA model's default: steps of up to this many rows (past the weight-only GEMV's) take this GEMV for
// their quantized fp8 projections and the e4m3 lm_head (PAGODA_FP8_MMA_GEMV_ROWS overrides it; 0 = cuBLASLt).
inline constexpr int32_t kFp8MmaGemvDefaultRows = 8;

bool fp8_mma_gemv_supported(int32_t m, int32_t k, const void* xq, const void* w);

// Block shapes: warps per block (the 16 rows' 64-byte k steps dealt round-robin to them) and steps each warp
// has in flight per buffer (two buffers). Every shape gives its own fixed summation order. Measured on an
// H100 with 4 x 4 and 4 x 2 as well (docs/BENCHMARKS.md, "fp8 GEMV on tensor cores"): 8 x 4 fastest but
// where its grid needs one wave and a bit (2 blocks an SM) and 8 x 2's fits in one (3 an SM).
struct Fp8MmaGemvShape {
  int32_t warps, unroll;
};
inline constexpr Fp8MmaGemvShape kFp8MmaGemvShapes[] = {{8, 4}, {8, 2}};
// The default: shape 1 when ceil(n / 16) blocks fit the device's SMs at once with it but not with shape 0, else 0.
inline constexpr int32_t kFp8MmaGemvAutoShape = -1;

// y: [m, n] bf16 (f32_output false) or f32 (the lm_head's logits). shape: kFp8MmaGemvAutoShape or an index of
// kFp8MmaGemvShapes (anything else is cudaErrorInvalidValue).
cudaError_t fp8_mma_gemv(const uint8_t* xq, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                         int32_t n, int32_t k, void* y, bool f32_output, cudaStream_t stream,
                         int32_t shape = kFp8MmaGemvAutoShape);

}  // namespace pagoda::cuda
