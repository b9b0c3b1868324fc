// Weight-streaming GEMV for m <= kGemvMaxRows rows (gemv.h).
//
// A block of kTh threads owns kR consecutive weight rows (output columns; fp8 at 1-2 activation rows:
// twice kGemvRowsPerBlock). Each thread walks the 16-byte chunks c = tid, tid + kTh, ... of those rows,
// kChunks chunks per trip, all of a trip's kChunks x kR 128-bit weight loads issued before any math, and
// multiplies each chunk against the matching activations of all m rows (read through L1/L2: every block
// reads the same x). Partial sums are reduced with warp shuffles, then across warps in shared memory.
// Weight loads skip L1 (read once). Launched with programmatic dependent launch (pdl.cuh): the first trip's
// weight loads run ahead of the PDL wait.
//
// The direct shape is kTh = 128, kChunks = 2. The fp8 depth variants (gemv_fp8 with depth 2 or 4) keep a
// trip's k span (kTh x kChunks chunks) and the rows per block, and give each thread 2x / 4x the chunks per
// trip with 1/2 / 1/4 of the threads: 2x / 4x the weight bytes in flight per thread. At depth 4 and 1-2
// activation rows the block keeps kGemvRowsPerBlock rows (eight rows x eight chunks would not fit the
// registers), which is 2x the direct kernel's per-thread bytes there.
//
// Epilogues (Epi):
// - kSiluMul (gemv_*_silu): the block's kR weight rows are kR / 2 gate rows and the matching up rows of a
//   [2n, k] gate_up weight, and it writes SiLU(gate) * up for those n columns, each sum rounded to bf16
//   first as the separate silu_mul kernel reads it: the GEMV + silu_mul's result bit for bit, in one launch
//   (the same chunks, partial sums and reduction per weight row as the plain kernel).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/backend/cuda/activation.cuh"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

constexpr int kThreads = 128;
// Rows (output columns) per block: fp8 chunks hold twice the elements of bf16 ones, so at k = 4096 a
// 4-row fp8 block is a single load trip per thread; at 1-2 activation rows fp8 blocks take 8 rows, which
// keeps a block's bytes in flight and lifetime those of a bf16 block (its activations stay in registers).
template <int M, bool kFp8, int kDepth = 1>
constexpr int rows_per_block() {
  return kFp8 && M <= 2 && kDepth < 4 ? 2 * kGemvRowsPerBlock : kGemvRowsPerBlock;
}

using kernels::cuda::device::bf16x8_to_float;
using kernels::cuda::device::load_global_streaming;

__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float* f) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i] & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i] >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo));
    const float2 b = __half22float2(__half2(hi));
    f[4 * i] = a.x;
    f[4 * i + 1] = a.y;
    f[4 * i + 2] = b.x;
    f[4 * i + 3] = b.y;
  }
}

__device__ __forceinline__ void store(__nv_bfloat16* y, float v) { *y = __float2bfloat16(v); }
__device__ __forceinline__ void store(float* y, float v) { *y = v; }

enum class Epi { kStore, kSiluMul };  // what a block does with its sums (the file comment)

// kFp8: weights e4m3 (16 per chunk) else bf16 (8 per chunk). block_stride > 0: 128x128 block scales applied
// per chunk (a chunk never straddles a 128-column block: 16 divides 128); == 0 with scales: per-row scales
// applied at the end; scales null (bf16): none.
template <int M, bool kFp8, typename Out, int kDepth = 1, Epi kEpi = Epi::kStore,
          int kR = rows_per_block<M, kFp8, kDepth>(), int kTh = kThreads / kDepth, int kChunks = 2 * kDepth>
__global__ void __launch_bounds__(kTh) gemv_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                                                        const float* __restrict__ scales, int32_t block_stride,
                                                        int32_t n, int32_t k, Out* __restrict__ y) {
  constexpr bool kSilu = kEpi == Epi::kSiluMul;
  constexpr int kElems = kFp8 ? 16 : 8;
  constexpr int kRowBytesPerElem = kFp8 ? 1 : 2;
  const int32_t chunks = k / kElems;
  constexpr int kCols = kSilu ? kR / 2 : kR;  // output columns per block
  static_assert(!kSilu || kR % 2 == 0, "gate and up rows in pairs");
  static_assert(kEpi == Epi::kStore || std::is_same_v<Out, __nv_bfloat16>, "the epilogues write bf16");
  const int32_t n0 = static_cast<int32_t>(blockIdx.x) * kCols;
  const uint4* rows[kR];
  const float* block_scales[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    // Columns past n are computed from the last one and not stored; with kSilu rows kCols... are the up
    // rows, n further on.
    const int32_t row = (kSilu && r >= kCols ? n : 0) + min(n0 + r % kCols, n - 1);
    rows[r] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * k * kRowBytesPerElem);
    block_scales[r] = (kFp8 && block_stride > 0) ? scales + static_cast<int64_t>(row / 128) * block_stride : nullptr;
  }
  float acc[M][kR];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[m][r] = 0.0f;

  // kR == kGemvRowsPerBlock: weights converted once per chunk, then each activation row's chunk is loaded
  // and used for every weight row (holding all M rows' activations instead would not fit the registers at
  // M = 8 with fp8 chunks). Wider blocks (fp8, M <= 2) hold the activations and convert one weight row at
  // a time instead (8 rows' converted chunks would not fit).
  static_assert(M * kR <= kTh, "the final reduction gives one thread per output");
  constexpr int kWarps = kTh / 32;
  auto consume_x_resident = [&](const uint4 (&wc)[kR], int32_t c) {
    float xf[M][kElems];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4* xr =
          reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * k + static_cast<int64_t>(c) * kElems);
      bf16x8_to_float(__ldg(xr), xf[m]);
      if constexpr (kFp8) bf16x8_to_float(__ldg(xr + 1), xf[m] + 8);
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float wf[kElems];
      if constexpr (kFp8) {
        fp8x16_to_float(wc[r], wf);
      } else {
        bf16x8_to_float(wc[r], wf);
      }
      const float sr = (kFp8 && block_stride > 0) ? __ldg(block_scales[r] + (c * kElems) / 128) : 1.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kElems; ++e) dot = fmaf(xf[m][e], wf[e], dot);
        acc[m][r] = fmaf(dot, sr, acc[m][r]);
      }
    }
  };
  auto consume_w_resident = [&](const uint4 (&wc)[kR], int32_t c) {
    float wf[kR][kElems];
    float s[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if constexpr (kFp8) {
        fp8x16_to_float(wc[r], wf[r]);
      } else {
        bf16x8_to_float(wc[r], wf[r]);
      }
      s[r] = (kFp8 && block_stride > 0) ? __ldg(block_scales[r] + (c * kElems) / 128) : 1.0f;
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[kElems];
      const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * k + static_cast<int64_t>(c) * kElems);
      bf16x8_to_float(__ldg(xr), xf);
      if constexpr (kFp8) bf16x8_to_float(__ldg(xr + 1), xf + 8);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kElems; ++e) dot = fmaf(xf[e], wf[r][e], dot);
        acc[m][r] = fmaf(dot, s[r], acc[m][r]);
      }
    }
  };

  // The first trip's weight loads depend on no earlier kernel: issued before the PDL wait, they overlap
  // the kernel ahead (pdl.cuh); x is read only after it.
  int32_t c0 = static_cast<int32_t>(threadIdx.x);
  uint4 wv[kChunks][kR];
  auto load_trip = [&](int32_t c) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (c + j * kTh < chunks) {
#pragma unroll
        for (int r = 0; r < kR; ++r) wv[j][r] = load_global_streaming(rows[r] + c + j * kTh);
      }
    }
  };
  load_trip(c0);
  pdl_wait();
  pdl_launch_dependents();
  for (; c0 < chunks; c0 += kChunks * kTh) {
    if (c0 != static_cast<int32_t>(threadIdx.x)) load_trip(c0);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int32_t c = c0 + j * kTh;
      if (j > 0 && c >= chunks) break;
      if constexpr (kR > kGemvRowsPerBlock) {
        consume_x_resident(wv[j], c);
      } else {
        consume_w_resident(wv[j], c);
      }
    }
  }

  __shared__ float partial[kWarps][M * kR];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == 0) partial[warp][m * kR + r] = v;
    }
  __syncthreads();
  if constexpr (kSilu) {
    if (threadIdx.x < M * kCols) {
      const int m = static_cast<int>(threadIdx.x) / kCols, j = static_cast<int>(threadIdx.x) % kCols;
      const int32_t col = n0 + j;
      if (col < n) {
        float gate = 0.0f, up = 0.0f;
#pragma unroll
        for (int i = 0; i < kWarps; ++i) {
          gate += partial[i][m * kR + j];
          up += partial[i][m * kR + kCols + j];
        }
        if (kFp8 && block_stride == 0) {
          gate *= scales[col];
          up *= scales[n + col];
        }
        const float g = __bfloat162float(__float2bfloat16(gate)), u = __bfloat162float(__float2bfloat16(up));
        store(y + static_cast<int64_t>(m) * n + col, silu_mul_value(g, u));
      }
    }
    return;
  }
  if (threadIdx.x < M * kR) {
    const int m = static_cast<int>(threadIdx.x) / kR, r = static_cast<int>(threadIdx.x) % kR;
    const int32_t col = n0 + r;
    if (col < n) {
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) v += partial[i][threadIdx.x];
      if (kFp8 && block_stride == 0) v *= scales[col];
      store(y + static_cast<int64_t>(m) * n + col, v);
    }
  }
}

// n: output columns (with kSiluMul the weights have 2n rows).
template <bool kFp8, typename Out, int kDepth, Epi kEpi = Epi::kStore>
cudaError_t launch(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales, int32_t block_stride,
                   int32_t n, int32_t k, Out* y, cudaStream_t stream) {
  auto grid = [n](int rows) {
    const int cols = kEpi == Epi::kSiluMul ? rows / 2 : rows;
    return dim3(static_cast<unsigned>((n + cols - 1) / cols));
  };
  switch (m) {
#define PAGODA_GEMV_CASE(M)                                                                                    \
  case M:                                                                                                      \
    return launch_pdl(gemv_kernel<M, kFp8, Out, kDepth, kEpi>, grid(rows_per_block<M, kFp8, kDepth>()),        \
                      dim3(kThreads / kDepth), 0, stream, x, w, scales, block_stride, n, k, y);
    PAGODA_GEMV_CASE(1)
    PAGODA_GEMV_CASE(2)
    PAGODA_GEMV_CASE(3)
    PAGODA_GEMV_CASE(4)
    PAGODA_GEMV_CASE(5)
    PAGODA_GEMV_CASE(6)
    PAGODA_GEMV_CASE(7)
    PAGODA_GEMV_CASE(8)
#undef PAGODA_GEMV_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool fp8_args_ok(int32_t m, int32_t n, int32_t k, const void* x, const uint8_t* w, const float* scales,
                 int32_t block_stride) {
  if (n <= 0 || scales == nullptr || block_stride < 0 || !gemv_supported(m, k, true, x, w)) return false;
  return block_stride == 0 || block_stride >= (k + 127) / 128;
}

template <Epi kEpi>
cudaError_t launch_fp8_depth(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales,
                             int32_t block_stride, int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream,
                             int32_t depth) {
  if (!fp8_args_ok(m, n, k, x, w, scales, block_stride)) return cudaErrorInvalidValue;
  switch (depth) {
    case 1:
      return launch<true, __nv_bfloat16, 1, kEpi>(x, m, w, scales, block_stride, n, k, y, stream);
    case 2:
      return launch<true, __nv_bfloat16, 2, kEpi>(x, m, w, scales, block_stride, n, k, y, stream);
    case 4:
      return launch<true, __nv_bfloat16, 4, kEpi>(x, m, w, scales, block_stride, n, k, y, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool gemv_supported(int32_t m, int32_t k, bool fp8_weights, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % (fp8_weights ? 16 : 8) == 0 && aligned16(x) && aligned16(w);
}

cudaError_t gemv_bf16(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t n, int32_t k, void* y,
                      bool f32_output, cudaStream_t stream) {
  if (n <= 0 || !gemv_supported(m, k, false, x, w)) return cudaErrorInvalidValue;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w);
  if (f32_output) return launch<false, float, 1>(x, m, bytes, nullptr, 0, n, k, static_cast<float*>(y), stream);
  return launch<false, __nv_bfloat16, 1>(x, m, bytes, nullptr, 0, n, k, static_cast<__nv_bfloat16*>(y), stream);
}

cudaError_t gemv_fp8(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales, int32_t block_stride,
                     int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream, int32_t depth) {
  return launch_fp8_depth<Epi::kStore>(x, m, w, scales, block_stride, n, k, y, stream, depth);
}

cudaError_t gemv_fp8_logits(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales,
                            int32_t block_stride, int32_t n, int32_t k, float* y, cudaStream_t stream) {
  if (!fp8_args_ok(m, n, k, x, w, scales, block_stride)) return cudaErrorInvalidValue;
  return launch<true, float, 1>(x, m, w, scales, block_stride, n, k, y, stream);
}

cudaError_t gemv_bf16_silu(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t intermediate,
                           int32_t k, __nv_bfloat16* act, cudaStream_t stream) {
  if (intermediate <= 0 || !gemv_supported(m, k, false, x, w)) return cudaErrorInvalidValue;
  return launch<false, __nv_bfloat16, 1, Epi::kSiluMul>(x, m, reinterpret_cast<const uint8_t*>(w), nullptr, 0,
                                                         intermediate, k, act, stream);
}

cudaError_t gemv_fp8_silu(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales,
                          int32_t block_stride, int32_t intermediate, int32_t k, __nv_bfloat16* act,
                          cudaStream_t stream, int32_t depth) {
  return launch_fp8_depth<Epi::kSiluMul>(x, m, w, scales, block_stride, intermediate, k, act, stream, depth);
}

}  // namespace pagoda::cuda
