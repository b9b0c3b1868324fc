// The tensor-core fp8 GEMV (fp8_mma_gemv.h).
//
// mma.sync m16n8k32 e4m3 fragments (PTX ISA, "Matrix fragments for mma.m16n8k32"), lane (g, t) = (lane / 4,
// lane % 4): A regs 0 / 2 hold row g, k columns 4t..4t+3 / 16+4t..16+4t+3; regs 1 / 3 the same of row g + 8;
// B regs 0 / 1 hold column g (activation row g), k rows 4t..4t+3 / 16+4t..16+4t+3; D holds rows g and g + 8,
// columns 2t and 2t + 1. A step is 64 k-bytes of 16 weight rows; lane (g, t) loads the 16 bytes at
// 16t of the step from rows g and g + 8 (vectors wa, wb) and of activation row g (xv). The step's first mma
// takes their first 8 bytes (A = wa.x, wb.x, wa.y, wb.y; B = xv.x, xv.y), the second their last 8: logical k
// column 4t + e is then byte 16t + e (or 16t + 8 + e) for every row of A and every column of B alike, a
// permutation of the step's k that the dot products do not see.

#include "pagoda/backend/cuda/fp8_mma_gemv.h"

#include <iterator>

#include <cuda_bf16.h>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

using kernels::cuda::device::load_global_streaming;
using kernels::cuda::device::mma_e4m3_16832;

constexpr int kRows = 16;       // weight rows per block: the mma's m
constexpr int kStepBytes = 64;  // k bytes per warp step: 4 lanes x 16 bytes
// kWarps: warps per block, the 16 rows' steps dealt round-robin to them; kUnroll: steps a warp has in flight
// per buffer (two buffers: 2 x kUnroll x 2 x 16 bytes a lane). Fp8MmaGemvShape picks them.

__device__ __forceinline__ void store(__nv_bfloat16* y, float v) { *y = __float2bfloat16(v); }
__device__ __forceinline__ void store(float* y, float v) { *y = v; }

template <typename Out, int kWarps, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) fp8_mma_gemv_kernel(const uint8_t* __restrict__ xq,
                                                                   const float* __restrict__ x_scales, int32_t m,
                                                                   const uint8_t* __restrict__ w,
                                                                   const float* __restrict__ w_scales, int32_t n,
                                                                   int32_t k, Out* __restrict__ y) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int32_t row0 = static_cast<int32_t>(blockIdx.x) * kRows;
  // Rows past n are computed from the last row and not stored.
  const uint8_t* wa = w + static_cast<int64_t>(min(row0 + g, n - 1)) * k + 16 * t;
  const uint8_t* wb = w + static_cast<int64_t>(min(row0 + g + 8, n - 1)) * k + 16 * t;
  const bool has_x = g < m;
  const uint8_t* xr = xq + static_cast<int64_t>(has_x ? g : 0) * k + 16 * t;
  const int32_t steps = k / kStepBytes;
  constexpr int32_t kStride = kUnroll * kWarps;  // steps between a warp's consecutive buffers

  uint4 a0[kUnroll], b0[kUnroll], a1[kUnroll], b1[kUnroll];
  auto load = [&](uint4 (&va)[kUnroll], uint4 (&vb)[kUnroll], int32_t s0) {
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int32_t s = s0 + j * kWarps;
      if (s < steps) {
        va[j] = load_global_streaming(wa + static_cast<int64_t>(s) * kStepBytes);
        vb[j] = load_global_streaming(wb + static_cast<int64_t>(s) * kStepBytes);
      }
    }
  };
  // Two accumulators: the step's two mmas do not wait on each other.
  float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto compute = [&](const uint4 (&va)[kUnroll], const uint4 (&vb)[kUnroll], int32_t s0) {
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int32_t s = s0 + j * kWarps;
      if (s >= steps) break;
      const uint4 xv = has_x ? __ldg(reinterpret_cast<const uint4*>(xr + static_cast<int64_t>(s) * kStepBytes))
                             : make_uint4(0u, 0u, 0u, 0u);
      mma_e4m3_16832(c0, va[j].x, vb[j].x, va[j].y, vb[j].y, xv.x, xv.y);
      mma_e4m3_16832(c1, va[j].z, vb[j].z, va[j].w, vb[j].w, xv.z, xv.w);
    }
  };

  // The first buffer's weights depend on no earlier kernel: loaded before the PDL wait (pdl.cuh).
  int32_t s0 = warp;
  load(a0, b0, s0);
  pdl_wait();
  pdl_launch_dependents();
  // Two buffers in turn: the next buffer's loads are issued before the current one's mmas.
  for (; s0 < steps; s0 += 2 * kStride) {
    load(a1, b1, s0 + kStride);
    compute(a0, b0, s0);
    load(a0, b0, s0 + 2 * kStride);
    compute(a1, b1, s0 + kStride);
  }

  __shared__ float partial[kWarps][kRows][8];
  partial[warp][g][2 * t] = c0[0] + c1[0];
  partial[warp][g][2 * t + 1] = c0[1] + c1[1];
  partial[warp][g + 8][2 * t] = c0[2] + c1[2];
  partial[warp][g + 8][2 * t + 1] = c0[3] + c1[3];
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < kRows * m) {
    const int row = static_cast<int>(threadIdx.x) / kRows, r = static_cast<int>(threadIdx.x) % kRows;
    const int32_t col = row0 + r;
    if (col < n) {
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) v += partial[i][r][row];
      store(y + static_cast<int64_t>(row) * n + col, v * (x_scales[row] * w_scales[col]));
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename Out, int kWarps, int kUnroll>
cudaError_t launch(const uint8_t* xq, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                   int32_t n, int32_t k, Out* y, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows)), block(kWarps * 32);
  return launch_pdl(fp8_mma_gemv_kernel<Out, kWarps, kUnroll>, grid, block, 0, stream, xq, x_scales, m, w, w_scales,
                    n, k, y);
}

// The automatic shape: shape 1 (shallower buffers, a smaller register share: more blocks an SM) where the
// grid fits the SMs at once with it but not with shape 0, so that it runs as one wave instead of one and a
// bit (the Llama-3-8B qkv: 384 blocks against 2 x 132 slots of shape 0 and 3 x 132 of shape 1 on an H100);
// shape 0 otherwise, one wave or many (o, down, gate_up, lm_head measured at or ahead with it).
template <int kShape>
int32_t grid_slots() {
  int device = 0, sms = 0, per_sm = 0;
  constexpr Fp8MmaGemvShape shape = kFp8MmaGemvShapes[kShape];
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, fp8_mma_gemv_kernel<__nv_bfloat16, shape.warps, shape.unroll>, shape.warps * 32, 0) != cudaSuccess) {
    cudaGetLastError();  // clear it: no slots known, shape 0 then
    return 0;
  }
  return sms * per_sm;
}

int32_t automatic_shape(int32_t n) {
  static const int32_t slots0 = grid_slots<0>(), slots1 = grid_slots<1>();
  const int32_t blocks = (n + kRows - 1) / kRows;
  return blocks > slots0 && blocks <= slots1 ? 1 : 0;
}

template <typename Out>
cudaError_t launch_shape(int32_t shape, const uint8_t* xq, const float* x_scales, int32_t m, const uint8_t* w,
                         const float* w_scales, int32_t n, int32_t k, Out* y, cudaStream_t stream) {
  static_assert(std::size(kFp8MmaGemvShapes) == 2, "one case per shape");
  if (shape == kFp8MmaGemvAutoShape) shape = automatic_shape(n);
  switch (shape) {
    case 0:
      return launch<Out, kFp8MmaGemvShapes[0].warps, kFp8MmaGemvShapes[0].unroll>(xq, x_scales, m, w, w_scales, n, k,
                                                                                  y, stream);
    case 1:
      return launch<Out, kFp8MmaGemvShapes[1].warps, kFp8MmaGemvShapes[1].unroll>(xq, x_scales, m, w, w_scales, n, k,
                                                                                  y, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool fp8_mma_gemv_supported(int32_t m, int32_t k, const void* xq, const void* w) {
  return m >= 1 && m <= kFp8MmaGemvMaxRows && k > 0 && k % kStepBytes == 0 && aligned16(xq) && aligned16(w);
}

cudaError_t fp8_mma_gemv(const uint8_t* xq, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                         int32_t n, int32_t k, void* y, bool f32_output, cudaStream_t stream, int32_t shape) {
  if (n <= 0 || x_scales == nullptr || w_scales == nullptr || y == nullptr || !fp8_mma_gemv_supported(m, k, xq, w))
    return cudaErrorInvalidValue;
  if (f32_output) return launch_shape(shape, xq, x_scales, m, w, w_scales, n, k, static_cast<float*>(y), stream);
  return launch_shape(shape, xq, x_scales, m, w, w_scales, n, k, static_cast<__nv_bfloat16*>(y), stream);
}

}  // namespace pagoda::cuda
