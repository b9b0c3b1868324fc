// Small elementwise ops of the MLP and projections: SiLU-mul (bf16 or fp8 per-token output) and bias add.
#include <algorithm>
#include <cstdlib>

#include "pagoda/backend/cuda/activation.cuh"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/fp8_convert.cuh"
#include "pagoda/backend/cuda/fp8_ops.h"
#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

// Two outputs per thread through bf16x2 loads when the width allows it.
__global__ void silu_mul_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int32_t rows,
                                int32_t intermediate) {
  pdl_wait();               // launched programmatically: the kernel ahead may still run
  pdl_launch_dependents();  // the down projection's GEMV streams its first weights meanwhile (pdl.cuh)
  const int32_t pairs = intermediate / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * pairs) return;
  const int64_t r = i / pairs;
  const int32_t p = static_cast<int32_t>(i % pairs);
  const bf16* row = gate_up + r * 2 * intermediate;
  const float2 g = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(row)[p]);
  const float2 u = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(row + intermediate)[p]);
  const float2 y = make_float2(silu_mul_value(g.x, u.x), silu_mul_value(g.y, u.y));
  reinterpret_cast<__nv_bfloat162*>(out + r * intermediate)[p] = __float22bfloat162_rn(y);
}

__global__ void silu_mul_scalar_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int32_t rows,
                                       int32_t intermediate) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * intermediate) return;
  const int64_t r = i / intermediate;
  const int32_t c = static_cast<int32_t>(i % intermediate);
  const float g = __bfloat162float(gate_up[r * 2 * intermediate + c]);
  const float u = __bfloat162float(gate_up[r * 2 * intermediate + intermediate + c]);
  out[i] = __float2bfloat16(silu_mul_value(g, u));
}

// silu_mul then quantize_fp8_per_token (fp8_ops.h) in one kernel, one block per row: the same bf16 values
// (the same expression, rounded to nearest like the kernels above), their absmax, the same scale and
// rounding, so the bytes equal the unfused pair's. Two passes over the row: the absmax, then the bytes.
// kPairs: bf16x2 loads and 2-byte stores (even intermediate).
constexpr int kSiluCachePairs = 8;

// At most 32 registers, so two blocks of 1,024 threads fit an SM (34 without the bound; no spills with it).
template <bool kPairs>
__global__ void __launch_bounds__(1024, 2)
    silu_mul_fp8_kernel(const bf16* __restrict__ gate_up, uint8_t* __restrict__ q, float* __restrict__ scales,
                        int32_t intermediate) {
  pdl_wait();               // launched programmatically: the kernel ahead may still run
  pdl_launch_dependents();  // the down projection's GEMM may start launching meanwhile (pdl.cuh)
  const int64_t r = blockIdx.x;
  const bf16* row = gate_up + r * 2 * intermediate;
  uint8_t* out = q + r * intermediate;
  float amax = 0.0f;
  if constexpr (kPairs) {
    const int32_t pairs = intermediate / 2;
    const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(row);
    const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(row + intermediate);
    auto value = [&](int32_t p) {
      const float2 g = __bfloat1622float2(g2[p]);
      const float2 u = __bfloat1622float2(u2[p]);
      const float2 y = make_float2(silu_mul_value(g.x, u.x), silu_mul_value(g.y, u.y));
      return __bfloat1622float2(__float22bfloat162_rn(y));
    };
    // Rows of up to kSiluCachePairs pairs per thread (14,336 wide at 1,024 threads: 7) keep their values in
    // registers between the passes, loaded all at once (more loads in flight); wider rows recompute them.
    // The branch is uniform over the block.
    const bool cached = pairs <= kSiluCachePairs * static_cast<int32_t>(blockDim.x);
    float2 cache[kSiluCachePairs];
    if (cached) {
#pragma unroll
      for (int j = 0; j < kSiluCachePairs; ++j) {
        const int32_t p = threadIdx.x + j * blockDim.x;
        cache[j] = p < pairs ? value(p) : make_float2(0.0f, 0.0f);
        amax = fmaxf(amax, fmaxf(fabsf(cache[j].x), fabsf(cache[j].y)));
      }
    } else {
#pragma unroll 4
      for (int32_t p = threadIdx.x; p < pairs; p += blockDim.x) {
        const float2 y = value(p);
        amax = fmaxf(amax, fmaxf(fabsf(y.x), fabsf(y.y)));
      }
    }
    const float scale = fp8_per_token_scale(fp8_block_max(amax));
    if (threadIdx.x == 0) scales[r] = scale;
    auto store = [&](int32_t p, float2 y) {
      reinterpret_cast<uchar2*>(out)[p] = make_uchar2(fp8_e4m3_at_scale(y.x, scale), fp8_e4m3_at_scale(y.y, scale));
    };
    if (cached) {
#pragma unroll
      for (int j = 0; j < kSiluCachePairs; ++j) {
        const int32_t p = threadIdx.x + j * blockDim.x;
        if (p < pairs) store(p, cache[j]);
      }
    } else {
#pragma unroll 4
      for (int32_t p = threadIdx.x; p < pairs; p += blockDim.x) store(p, value(p));
    }
  } else {
    auto value = [&](int32_t c) {
      const float g = __bfloat162float(row[c]);
      const float u = __bfloat162float(row[intermediate + c]);
      return __bfloat162float(__float2bfloat16(silu_mul_value(g, u)));
    };
    for (int32_t c = threadIdx.x; c < intermediate; c += blockDim.x) amax = fmaxf(amax, fabsf(value(c)));
    const float scale = fp8_per_token_scale(fp8_block_max(amax));
    if (threadIdx.x == 0) scales[r] = scale;
    for (int32_t c = threadIdx.x; c < intermediate; c += blockDim.x) out[c] = fp8_e4m3_at_scale(value(c), scale);
  }
}

// silu_mul_fp8 over 4-element chunks (intermediate % 4 == 0): a thread reads its gate and up values 8 bytes
// at a time (half the loads of the bf16x2 kernel) and writes 4 bytes of fp8; the same values, absmax, scale
// and bytes. Up to kSiluCacheChunks chunks per thread stay in registers between the passes.
constexpr int kSiluCacheChunks = 4;

__device__ __forceinline__ float4 silu_mul4(const bf16* gate, const bf16* up) {
  const uint2 g_raw = *reinterpret_cast<const uint2*>(gate), u_raw = *reinterpret_cast<const uint2*>(up);
  const float2 g0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g_raw.x));
  const float2 g1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g_raw.y));
  const float2 u0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u_raw.x));
  const float2 u1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u_raw.y));
  const float2 y0 = __bfloat1622float2(__float22bfloat162_rn(
      make_float2(silu_mul_value(g0.x, u0.x), silu_mul_value(g0.y, u0.y))));
  const float2 y1 = __bfloat1622float2(__float22bfloat162_rn(
      make_float2(silu_mul_value(g1.x, u1.x), silu_mul_value(g1.y, u1.y))));
  return make_float4(y0.x, y0.y, y1.x, y1.y);
}

__device__ __forceinline__ float amax4(float4 y, float amax) {
  return fmaxf(amax, fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w))));
}

__global__ void __launch_bounds__(1024, 2)
    silu_mul_fp8_quad_kernel(const bf16* __restrict__ gate_up, uint8_t* __restrict__ q, float* __restrict__ scales,
                             int32_t intermediate) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const bf16* gate = gate_up + r * 2 * intermediate;
  const bf16* up = gate + intermediate;
  uint8_t* out = q + r * intermediate;
  const int32_t chunks = intermediate / 4;
  const bool cached = chunks <= kSiluCacheChunks * static_cast<int32_t>(blockDim.x);  // uniform
  float4 cache[kSiluCacheChunks];
  float amax = 0.0f;
  if (cached) {
#pragma unroll
    for (int j = 0; j < kSiluCacheChunks; ++j) {
      const int32_t c = threadIdx.x + j * blockDim.x;
      cache[j] = c < chunks ? silu_mul4(gate + 4 * c, up + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      amax = amax4(cache[j], amax);
    }
  } else {
    for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) amax = amax4(silu_mul4(gate + 4 * c, up + 4 * c), amax);
  }
  const float scale = fp8_per_token_scale(fp8_block_max(amax));
  if (threadIdx.x == 0) scales[r] = scale;
  auto store = [&](int32_t c, float4 y) {
    uchar4 bytes;
    bytes.x = fp8_e4m3_at_scale(y.x, scale);
    bytes.y = fp8_e4m3_at_scale(y.y, scale);
    bytes.z = fp8_e4m3_at_scale(y.z, scale);
    bytes.w = fp8_e4m3_at_scale(y.w, scale);
    reinterpret_cast<uchar4*>(out)[c] = bytes;
  };
  if (cached) {
#pragma unroll
    for (int j = 0; j < kSiluCacheChunks; ++j) {
      const int32_t c = threadIdx.x + j * blockDim.x;
      if (c < chunks) store(c, cache[j]);
    }
  } else {
    for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) store(c, silu_mul4(gate + 4 * c, up + 4 * c));
  }
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

cudaError_t silu_mul_fp8(const bf16* gate_up, int32_t rows, int32_t intermediate, uint8_t* q, float* scales,
                         cudaStream_t stream) {
  if (rows == 0 || intermediate == 0) return cudaSuccess;
  // Up to 1,024 threads at 4+ values each (the row norms' rule): 14,336 wide is 7 pairs per thread.
  static const bool pairs_only = [] {  // PAGODA_SILU_PAIRS=1 keeps the bf16x2 kernel (an A/B switch)
    const char* env = std::getenv("PAGODA_SILU_PAIRS");
    return env != nullptr && env[0] == '1';
  }();
  if (intermediate % 4 == 0 && !pairs_only) {
    const int32_t chunks = intermediate / 4;  // 14,336 wide: 3,584 chunks, 896 threads of 4 chunks
    const int threads = std::min(1024, std::max(32, ((chunks / kSiluCacheChunks + 31) / 32) * 32));
    return launch_pdl(silu_mul_fp8_quad_kernel, dim3(rows), dim3(threads), 0, stream, gate_up, q, scales,
                      intermediate);
  }
  const int32_t items = intermediate % 2 == 0 ? intermediate / 2 : intermediate;
  const int threads = std::min(1024, std::max(32, ((items / 4 + 31) / 32) * 32));
  if (intermediate % 2 == 0)
    return launch_pdl(silu_mul_fp8_kernel<true>, dim3(rows), dim3(threads), 0, stream, gate_up, q, scales,
                      intermediate);
  return launch_pdl(silu_mul_fp8_kernel<false>, dim3(rows), dim3(threads), 0, stream, gate_up, q, scales,
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
