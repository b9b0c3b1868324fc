// Weight-streaming GEMV for m <= kGemvMaxRows rows (gemv.h).
//
// A block of kThreads threads owns kGemvRowsPerBlock consecutive weight rows at a time (a row group: output
// columns; fp8 at 1-2 activation rows: twice as many). Each thread walks the 16-byte chunks c = tid,
// tid + kThreads, ... of those rows and multiplies each chunk against the matching activations of all m
// rows (read through L1/L2: every block reads the same x). Partial sums are reduced with warp shuffles, then
// across warps in shared memory. Two kernels share this layout (GemvKernel):
// - gemv_kernel (direct): one block per row group, weights loaded into registers two chunks per row per trip
//   with loads that skip L1;
// - gemv_stream_kernel (streamed, the default): a persistent grid, weights copied into shared memory by
//   cp.async several trips ahead of their use, across row groups, so the stream never drains between blocks.
// Both are launched with programmatic dependent launch (pdl.cuh): the first weight loads run ahead of the
// PDL wait.

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Rows (output columns) per block: fp8 chunks hold twice the elements of bf16 ones, so at k = 4096 a
// 4-row fp8 block is a single load trip per thread; at 1-2 activation rows fp8 blocks take 8 rows, which
// keeps a block's bytes in flight and lifetime those of a bf16 block (its activations stay in registers).
template <int M, bool kFp8>
constexpr int rows_per_block() {
  return kFp8 && M <= 2 ? 2 * kGemvRowsPerBlock : kGemvRowsPerBlock;
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

using kernels::cuda::device::bf16x8_to_float;

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

// kFp8: weights e4m3 (16 per chunk) else bf16 (8 per chunk). block_stride > 0: 128x128 block scales applied
// per chunk (a chunk never straddles a 128-column block: 16 divides 128); == 0 with scales: per-row scales
// applied at the end; scales null (bf16): none.
template <int M, bool kFp8, typename Out, int kR = rows_per_block<M, kFp8>()>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                                                        const float* __restrict__ scales, int32_t block_stride,
                                                        int32_t n, int32_t k, Out* __restrict__ y) {
  constexpr int kElems = kFp8 ? 16 : 8;
  constexpr int kRowBytesPerElem = kFp8 ? 1 : 2;
  const int32_t chunks = k / kElems;
  const int32_t n0 = static_cast<int32_t>(blockIdx.x) * kR;
  const uint4* rows[kR];
  const float* block_scales[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int32_t row = min(n0 + r, n - 1);  // rows past n are computed from the last row and not stored
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
  uint4 a[kR], b[kR];
  auto load_trip = [&](int32_t c) {
    if (c < chunks) {
#pragma unroll
      for (int r = 0; r < kR; ++r) a[r] = load_stream(rows[r] + c);
    }
    if (c + kThreads < chunks) {
#pragma unroll
      for (int r = 0; r < kR; ++r) b[r] = load_stream(rows[r] + c + kThreads);
    }
  };
  load_trip(c0);
  pdl_wait();
  pdl_launch_dependents();
  for (; c0 < chunks; c0 += 2 * kThreads) {
    const int32_t c1 = c0 + kThreads;
    const bool has1 = c1 < chunks;
    if (c0 != static_cast<int32_t>(threadIdx.x)) load_trip(c0);
    if constexpr (kR > kGemvRowsPerBlock) {
      consume_x_resident(a, c0);
      if (has1) consume_x_resident(b, c1);
    } else {
      consume_w_resident(a, c0);
      if (has1) consume_w_resident(b, c1);
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

// The streamed kernel: the same block layout and arithmetic, but the weights travel through shared memory
// by cp.async (16 bytes per copy, L2 only), kStreamStages trips of kStreamLoads copies per thread deep, so
// a thread keeps (kStreamStages - 1) x kStreamLoads x 16 bytes in flight without holding them in registers.
// Each thread reads back only the slots it filled itself (cp.async.wait_group makes a thread's own copies
// visible to it), so the pipeline needs no block barrier. The grid is persistent: at most the blocks that
// fit on the SMs at once, each taking row groups blockIdx.x, blockIdx.x + gridDim.x, ... and prefetching
// the next group's weights while it finishes the current one, so the weight stream does not drain between
// waves of short blocks; the grid size divides the groups as evenly as it can.
constexpr int kStreamStages = 4;
constexpr int kStreamLoads = 8;  // 16-byte copies per thread per trip: kR rows x kStreamLoads / kR chunks

template <int M, bool kFp8>
constexpr size_t stream_shared_bytes() {
  return static_cast<size_t>(kThreads) * kStreamStages * kStreamLoads * 16;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void copy_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

template <int M, bool kFp8, typename Out, int kR = rows_per_block<M, kFp8>()>
__global__ void __launch_bounds__(kThreads) gemv_stream_kernel(const __nv_bfloat16* __restrict__ x,
                                                               const uint8_t* __restrict__ w,
                                                               const float* __restrict__ scales, int32_t block_stride,
                                                               int32_t n, int32_t k, Out* __restrict__ y) {
  constexpr int kElems = kFp8 ? 16 : 8;
  constexpr int kRowBytesPerElem = kFp8 ? 1 : 2;
  constexpr int kU = kStreamLoads / kR;  // chunks per row per trip
  static_assert(kU >= 1 && kU * kR == kStreamLoads, "a trip is kStreamLoads copies");
  extern __shared__ uint4 stage[];  // [kStreamStages][kStreamLoads][kThreads]
  const int tid = static_cast<int>(threadIdx.x);
  const int32_t chunks = k / kElems;
  const int32_t groups = (n + kR - 1) / kR;
  const int32_t trips_per_group = (chunks + kThreads * kU - 1) / (kThreads * kU);
  const int32_t my_groups = (groups - static_cast<int32_t>(blockIdx.x) + static_cast<int32_t>(gridDim.x) - 1) /
                            static_cast<int32_t>(gridDim.x);
  const int32_t trips = my_groups * trips_per_group;
  const uint32_t stage_base = shared_address(stage);

  // Issues trip t's copies into stage t % kStreamStages (a trip past the end commits an empty group, which
  // keeps the group count and so the wait arithmetic uniform).
  auto issue = [&](int32_t t) {
    if (t < trips) {
      const int32_t g = static_cast<int32_t>(blockIdx.x) + (t / trips_per_group) * static_cast<int32_t>(gridDim.x);
      const int32_t c_base = (t % trips_per_group) * kThreads * kU + tid;
      const uint32_t slot0 = stage_base + static_cast<uint32_t>(((t % kStreamStages) * kStreamLoads) * kThreads + tid) * 16u;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int32_t row = min(g * kR + r, n - 1);
        const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * k * kRowBytesPerElem);
#pragma unroll
        for (int j = 0; j < kU; ++j) {
          const int32_t c = c_base + j * kThreads;
          if (c < chunks) copy_async16(slot0 + static_cast<uint32_t>((j * kR + r) * kThreads) * 16u, wr + c);
        }
      }
    }
    copy_async_commit();
  };

  float acc[M][kR];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[m][r] = 0.0f;

  // The first stages' weight copies depend on no earlier kernel: issued before the PDL wait (pdl.cuh).
#pragma unroll
  for (int t = 0; t < kStreamStages - 1; ++t) issue(t);
  pdl_wait();
  pdl_launch_dependents();

  __shared__ float partial[kWarps][M * kR];
  const int lane = tid % 32, warp = tid / 32;
  for (int32_t t = 0; t < trips; ++t) {
    copy_async_wait<kStreamStages - 2>();
    const int32_t g = static_cast<int32_t>(blockIdx.x) + (t / trips_per_group) * static_cast<int32_t>(gridDim.x);
    const int32_t c_base = (t % trips_per_group) * kThreads * kU + tid;
    const uint4* slots = stage + (t % kStreamStages) * kStreamLoads * kThreads + tid;
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const int32_t c = c_base + j * kThreads;
      if (c >= chunks) continue;
      uint4 wc[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) wc[r] = slots[(j * kR + r) * kThreads];
      // Block scales of this chunk's rows (rows of a group may straddle a 128-row block).
      float sr[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r)
        sr[r] = (kFp8 && block_stride > 0)
                    ? __ldg(scales + static_cast<int64_t>(min(g * kR + r, n - 1) / 128) * block_stride + (c * kElems) / 128)
                    : 1.0f;
      if constexpr (kR > kGemvRowsPerBlock) {
        float xf[M][kElems];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * k + static_cast<int64_t>(c) * kElems);
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
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < kElems; ++e) dot = fmaf(xf[m][e], wf[e], dot);
            acc[m][r] = fmaf(dot, sr[r], acc[m][r]);
          }
        }
      } else {
        float wf[kR][kElems];
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          if constexpr (kFp8) {
            fp8x16_to_float(wc[r], wf[r]);
          } else {
            bf16x8_to_float(wc[r], wf[r]);
          }
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
            acc[m][r] = fmaf(dot, sr[r], acc[m][r]);
          }
        }
      }
    }
    // Refill the stage consumed one trip ago (every thread is past it: its own slots only).
    issue(t + kStreamStages - 1);
    if (t % trips_per_group == trips_per_group - 1) {  // the group is done: reduce and store it
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          float v = acc[m][r];
#pragma unroll
          for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
          if (lane == 0) partial[warp][m * kR + r] = v;
          acc[m][r] = 0.0f;
        }
      __syncthreads();
      if (tid < M * kR) {
        const int m = tid / kR, r = tid % kR;
        const int32_t col = g * kR + r;
        if (col < n) {
          float v = 0.0f;
#pragma unroll
          for (int i = 0; i < kWarps; ++i) v += partial[i][tid];
          if (kFp8 && block_stride == 0) v *= scales[col];
          store(y + static_cast<int64_t>(m) * n + col, v);
        }
      }
      __syncthreads();  // partial is reused by the next group
    }
  }
  copy_async_wait<0>();
}

template <int M, bool kFp8, typename Out>
bool set_stream_shared_limit() {
  return cudaFuncSetAttribute(gemv_stream_kernel<M, kFp8, Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(stream_shared_bytes<M, kFp8>())) == cudaSuccess;
}

// Blocks of one instantiation that fit on an SM at once: queried once (after its shared memory limit was
// raised on the current device), the same on every device of the machine's kind.
template <int M, bool kFp8, typename Out>
int stream_blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_stream_kernel<M, kFp8, Out>, kThreads,
                                                      stream_shared_bytes<M, kFp8>()) != cudaSuccess)
      return 0;
    return b;
  }();
  return blocks;
}

template <bool kFp8, typename Out, int... Ms>
bool prepare_all(std::integer_sequence<int, Ms...>) {
  const bool limits = (set_stream_shared_limit<Ms + 1, kFp8, Out>() && ...);
  return limits && ((stream_blocks_per_sm<Ms + 1, kFp8, Out>() > 0) && ...);
}

// Raises every streamed instantiation's shared memory limit on the current device (a per-device function
// attribute) and queries the occupancies, once per device, so that no launch inside a stream capture makes
// those calls. False: the streamed kernels cannot run here (the launches use the direct kernel).
bool prepare_stream_kernels() {
  static std::mutex mu;
  static uint64_t done = 0, ok = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  const uint64_t bit = uint64_t{1} << device;
  std::lock_guard<std::mutex> lock(mu);
  if ((done & bit) == 0) {
    const auto rows = std::make_integer_sequence<int, kGemvMaxRows>{};
    const bool a = prepare_all<false, __nv_bfloat16>(rows);
    const bool b = prepare_all<false, float>(rows);
    const bool c = prepare_all<true, __nv_bfloat16>(rows);
    done |= bit;
    if (a && b && c) ok |= bit;
    else cudaGetLastError();  // not sticky: clear it
  }
  return (ok & bit) != 0;
}

int device_sms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return sms;
}

GemvKernel resolve(GemvKernel kernel) {
  if (kernel != GemvKernel::kAuto) return kernel;
  static const GemvKernel from_env = [] {
    const char* env = std::getenv("PAGODA_GEMV_KERNEL");
    return env != nullptr && std::strcmp(env, "direct") == 0 ? GemvKernel::kDirect : GemvKernel::kStreamed;
  }();
  return from_env;
}

template <int M, bool kFp8, typename Out>
cudaError_t launch_m(GemvKernel kernel, const __nv_bfloat16* x, const uint8_t* w, const float* scales,
                     int32_t block_stride, int32_t n, int32_t k, Out* y, cudaStream_t stream) {
  constexpr int kR = rows_per_block<M, kFp8>();
  const int32_t groups = (n + kR - 1) / kR;
  if (kernel == GemvKernel::kStreamed) {
    constexpr size_t shared = stream_shared_bytes<M, kFp8>();
    const int per_sm = stream_blocks_per_sm<M, kFp8, Out>();
    const int sms = device_sms();
    if (per_sm > 0 && sms > 0) {
      const int32_t resident = per_sm * sms;
      const int32_t rounds = (groups + resident - 1) / resident;
      const int32_t blocks = (groups + rounds - 1) / rounds;
      return launch_pdl(gemv_stream_kernel<M, kFp8, Out>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), shared,
                        stream, x, w, scales, block_stride, n, k, y);
    }
    // No SM count: the direct kernel needs none.
  }
  return launch_pdl(gemv_kernel<M, kFp8, Out>, dim3(static_cast<unsigned>(groups)), dim3(kThreads), 0, stream, x, w,
                    scales, block_stride, n, k, y);
}

template <bool kFp8, typename Out>
cudaError_t launch(GemvKernel kernel, const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales,
                   int32_t block_stride, int32_t n, int32_t k, Out* y, cudaStream_t stream) {
  kernel = resolve(kernel);
  if (kernel == GemvKernel::kStreamed && !prepare_stream_kernels()) kernel = GemvKernel::kDirect;
  switch (m) {
#define PAGODA_GEMV_CASE(M) \
  case M:                   \
    return launch_m<M, kFp8, Out>(kernel, x, w, scales, block_stride, n, k, y, stream);
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

}  // namespace

cudaError_t gemv_prepare() {
  if (resolve(GemvKernel::kAuto) == GemvKernel::kStreamed) prepare_stream_kernels();
  return cudaSuccess;
}

bool gemv_supported(int32_t m, int32_t k, bool fp8_weights, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % (fp8_weights ? 16 : 8) == 0 && aligned16(x) && aligned16(w);
}

cudaError_t gemv_bf16(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t n, int32_t k, void* y,
                      bool f32_output, cudaStream_t stream, GemvKernel kernel) {
  if (n <= 0 || !gemv_supported(m, k, false, x, w)) return cudaErrorInvalidValue;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w);
  if (f32_output) return launch<false, float>(kernel, x, m, bytes, nullptr, 0, n, k, static_cast<float*>(y), stream);
  return launch<false, __nv_bfloat16>(kernel, x, m, bytes, nullptr, 0, n, k, static_cast<__nv_bfloat16*>(y), stream);
}

cudaError_t gemv_fp8(const __nv_bfloat16* x, int32_t m, const uint8_t* w, const float* scales, int32_t block_stride,
                     int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream, GemvKernel kernel) {
  if (n <= 0 || scales == nullptr || block_stride < 0 || !gemv_supported(m, k, true, x, w))
    return cudaErrorInvalidValue;
  if (block_stride > 0 && block_stride < (k + 127) / 128) return cudaErrorInvalidValue;
  return launch<true, __nv_bfloat16>(kernel, x, m, w, scales, block_stride, n, k, y, stream);
}

}  // namespace pagoda::cuda
