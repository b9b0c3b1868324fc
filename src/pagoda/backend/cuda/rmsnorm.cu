// RMSNorm family: plain (with optional row gather), fused residual add (bf16 or fp8 per-token output), and
// the per-head norm of Qwen3. Sums of squares in f32 with a block reduction.
#include <algorithm>
#include <cstdlib>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/fp8_convert.cuh"
#include "pagoda/backend/cuda/fp8_ops.h"
#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kNormCache = 4;  // add_rmsnorm_kernel<true>: values per thread kept in registers between passes

// Sum over the block; every thread gets the result.
__device__ float block_sum(float value) {
  __shared__ float partial[32];
  __shared__ float total;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = (blockDim.x + 31) / 32;
    float v = lane < num_warps ? partial[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

__global__ void rmsnorm_kernel(const float* __restrict__ x, const int32_t* __restrict__ row_index,
                               const float* __restrict__ weight, bf16* __restrict__ out, int32_t dim,
                               float eps) {
  pdl_wait();               // launched programmatically: the kernel ahead may still run
  pdl_launch_dependents();  // a GEMV after the norm streams its first weights meanwhile (pdl.cuh)
  const int32_t r = blockIdx.x;
  const int64_t src = row_index != nullptr ? row_index[r] : r;
  const float* xr = x + src * dim;
  float sum_sq = 0.0f;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) sum_sq += xr[i] * xr[i];
  const float inv_rms = rsqrtf(block_sum(sum_sq) / dim + eps);
  bf16* yr = out + static_cast<int64_t>(r) * dim;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = __float2bfloat16(weight[i] * (xr[i] * inv_rms));
}

// kFp8: instead of the bf16 out, q (fp8 e4m3) and scales (one per row) as quantize_fp8_per_token (fp8_ops.h)
// would make of that bf16 out, byte for byte: the same bf16 values, their row absmax, the same scale and
// rounding.
// At most 32 registers, so two blocks of 1,024 threads fit an SM (the fp8 variant took 40 without the bound).
template <bool kFp8>
__global__ void __launch_bounds__(1024, 2)
    add_rmsnorm_kernel(float* __restrict__ residual, const bf16* __restrict__ delta, const float* __restrict__ weight,
                       bf16* __restrict__ out, uint8_t* __restrict__ q, float* __restrict__ scales, int32_t dim,
                       float eps) {
  pdl_wait();               // launched programmatically: the kernel ahead may still run
  pdl_launch_dependents();  // a GEMV after the norm streams its first weights meanwhile (pdl.cuh)
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float* xr = residual + base;
  float sum_sq = 0.0f;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (delta != nullptr) {
      v += __bfloat162float(delta[base + i]);
      xr[i] = v;
    }
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / dim + eps);
  // Each thread re-reads only the elements it wrote itself: no barrier needed.
  if constexpr (!kFp8) {
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
      out[base + i] = __float2bfloat16(weight[i] * (xr[i] * inv_rms));
  } else {
    // Two passes over the row: its absmax, then the bytes. Up to kNormCache values per thread (4,096 wide at
    // 1,024 threads: 4) stay in registers between them; wider rows recompute (from L1/L2). Uniform branch.
    auto value = [&](int32_t i) { return __bfloat162float(__float2bfloat16(weight[i] * (xr[i] * inv_rms))); };
    const bool cached = dim <= kNormCache * static_cast<int32_t>(blockDim.x);
    float cache[kNormCache];
    float amax = 0.0f;
    if (cached) {
#pragma unroll
      for (int j = 0; j < kNormCache; ++j) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        cache[j] = i < dim ? value(i) : 0.0f;
        amax = fmaxf(amax, fabsf(cache[j]));
      }
    } else {
      for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) amax = fmaxf(amax, fabsf(value(i)));
    }
    const float scale = fp8_per_token_scale(fp8_block_max(amax));
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
    if (cached) {
#pragma unroll
      for (int j = 0; j < kNormCache; ++j) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < dim) q[base + i] = fp8_e4m3_at_scale(cache[j], scale);
      }
    } else {
      for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) q[base + i] = fp8_e4m3_at_scale(value(i), scale);
    }
  }
}

// The same three row norms over 4-element chunks (dim % 4 == 0): a thread owns consecutive elements
// [4c, 4c + 4) of chunks c = threadIdx.x, threadIdx.x + blockDim.x, ..., read and written as one 16-byte
// (f32) or 8-byte (bf16) access, where the kernels above move one element per access. Each row's time is
// its own latency chain (loads, block reductions, stores), so fewer, wider accesses shorten it. The three
// form their sums of squares in the same order (chunk by chunk, x y z w), so add_rmsnorm_fp8 still equals
// rmsnorm / add_rmsnorm + quantize_fp8_per_token byte for byte.
struct Chunk4 {
  float v[4];
};

__device__ __forceinline__ Chunk4 load4(const float* p) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  return {{a.x, a.y, a.z, a.w}};
}

__device__ __forceinline__ Chunk4 load4(const bf16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return {{lo.x, lo.y, hi.x, hi.y}};
}

__device__ __forceinline__ float sum_squares(const Chunk4& c, float sum) {
#pragma unroll
  for (int e = 0; e < 4; ++e) sum += c.v[e] * c.v[e];
  return sum;
}

// The normed chunk as bf16 values (widened back to float): weight * (x * inv_rms), rounded.
__device__ __forceinline__ Chunk4 normed4(const Chunk4& x, const float* weight, float inv_rms) {
  const Chunk4 w = load4(weight);
  Chunk4 y;
#pragma unroll
  for (int e = 0; e < 4; ++e) y.v[e] = __bfloat162float(__float2bfloat16(w.v[e] * (x.v[e] * inv_rms)));
  return y;
}

__device__ __forceinline__ void store4(bf16* p, const Chunk4& y) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(y.v[0], y.v[1]), hi = __floats2bfloat162_rn(y.v[2], y.v[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<uint32_t*>(&lo);
  raw.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

__global__ void rmsnorm4_kernel(const float* __restrict__ x, const int32_t* __restrict__ row_index,
                                const float* __restrict__ weight, bf16* __restrict__ out, int32_t dim, float eps) {
  pdl_wait();
  pdl_launch_dependents();
  const int32_t r = blockIdx.x;
  const float* xr = x + (row_index != nullptr ? row_index[r] : r) * static_cast<int64_t>(dim);
  const int32_t chunks = dim / 4;
  float sum_sq = 0.0f;
  for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) sum_sq = sum_squares(load4(xr + 4 * c), sum_sq);
  const float inv_rms = rsqrtf(block_sum(sum_sq) / dim + eps);
  bf16* yr = out + static_cast<int64_t>(r) * dim;
  for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x)
    store4(yr + 4 * c, normed4(load4(xr + 4 * c), weight + 4 * c, inv_rms));
}

template <bool kFp8>
__global__ void __launch_bounds__(1024, 2)
    add_rmsnorm4_kernel(float* __restrict__ residual, const bf16* __restrict__ delta, const float* __restrict__ weight,
                        bf16* __restrict__ out, uint8_t* __restrict__ q, float* __restrict__ scales, int32_t dim,
                        float eps) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float* xr = residual + base;
  const int32_t chunks = dim / 4;
  // A row of at most one chunk per thread (4,096 wide at 1,024 threads) keeps its chunk in registers
  // between the passes; wider rows re-read theirs (written by this thread). Uniform branch.
  const bool cached = chunks <= static_cast<int32_t>(blockDim.x);
  Chunk4 kept{};
  float sum_sq = 0.0f;
  for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    Chunk4 v = load4(xr + 4 * c);
    if (delta != nullptr) {
      const Chunk4 d = load4(delta + base + 4 * c);
#pragma unroll
      for (int e = 0; e < 4; ++e) v.v[e] += d.v[e];
      *reinterpret_cast<float4*>(xr + 4 * c) = make_float4(v.v[0], v.v[1], v.v[2], v.v[3]);
    }
    sum_sq = sum_squares(v, sum_sq);
    kept = v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / dim + eps);
  auto row_chunk = [&](int32_t c) { return cached ? kept : load4(xr + 4 * c); };
  if constexpr (!kFp8) {
    for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x)
      store4(out + base + 4 * c, normed4(row_chunk(c), weight + 4 * c, inv_rms));
  } else {
    float amax = 0.0f;
    for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const Chunk4 y = normed4(row_chunk(c), weight + 4 * c, inv_rms);
#pragma unroll
      for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(y.v[e]));
    }
    const float scale = fp8_per_token_scale(fp8_block_max(amax));
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
    for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const Chunk4 y = normed4(row_chunk(c), weight + 4 * c, inv_rms);
      uchar4 bytes;
      bytes.x = fp8_e4m3_at_scale(y.v[0], scale);
      bytes.y = fp8_e4m3_at_scale(y.v[1], scale);
      bytes.z = fp8_e4m3_at_scale(y.v[2], scale);
      bytes.w = fp8_e4m3_at_scale(y.v[3], scale);
      *reinterpret_cast<uchar4*>(q + base + 4 * c) = bytes;
    }
  }
}

__global__ void add_residual_kernel(float* __restrict__ residual, const bf16* __restrict__ delta, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) residual[i] += __bfloat162float(delta[i]);
}

// One warp per (token, head); head_dim <= 256 so a lane holds at most 8 values.
__global__ void head_rmsnorm_kernel(bf16* __restrict__ x, int64_t row_stride, int32_t num_tokens,
                                    int32_t num_heads, int32_t head_dim, const float* __restrict__ weight,
                                    float eps) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (item >= static_cast<int64_t>(num_tokens) * num_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = item / num_heads;
  const int32_t h = static_cast<int32_t>(item % num_heads);
  bf16* v = x + t * row_stride + static_cast<int64_t>(h) * head_dim;
  float values[8];
  float sum_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int32_t i = lane + k * 32;
    values[k] = i < head_dim ? __bfloat162float(v[i]) : 0.0f;
    sum_sq += values[k] * values[k];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  const float inv_rms = rsqrtf(sum_sq / head_dim + eps);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int32_t i = lane + k * 32;
    if (i < head_dim) v[i] = __float2bfloat16(weight[i] * (values[k] * inv_rms));
  }
}

// Row norms take up to 1,024 threads at 4+ elements each: at decode's few rows a 4,096-wide row is one
// block, whose time is its dependent load / reduce latency, shortest with the most threads.
int norm_threads(int32_t dim) {
  const int narrow = dim >= kNormThreads ? kNormThreads : ((dim + 31) / 32) * 32;
  return std::min(1024, std::max(narrow, ((dim / 4 + 31) / 32) * 32));
}

// The chunked kernels' threads: the rule above over chunks of 4 (up to 1,024 threads, one chunk each at
// 4,096 wide). Used when dim % 4 == 0, the rows' starts then 16-byte (f32) / 8-byte (bf16) aligned.
int norm4_threads(int32_t dim) { return std::min(1024, std::max(32, ((dim / 4 + 31) / 32) * 32)); }

// PAGODA_NORM_SCALAR=1 keeps the per-element kernels (an A/B switch, read once).
bool chunked(int32_t dim) {
  static const bool scalar = [] {
    const char* env = std::getenv("PAGODA_NORM_SCALAR");
    return env != nullptr && env[0] == '1';
  }();
  return dim % 4 == 0 && !scalar;
}

}  // namespace

cudaError_t rmsnorm(const float* x, const int32_t* row_index, const float* weight, bf16* out, int32_t rows,
                    int32_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (chunked(dim))
    return launch_pdl(rmsnorm4_kernel, dim3(rows), dim3(norm4_threads(dim)), 0, stream, x, row_index, weight, out,
                      dim, eps);
  return launch_pdl(rmsnorm_kernel, dim3(rows), dim3(norm_threads(dim)), 0, stream, x, row_index, weight, out, dim,
                    eps);
}

cudaError_t add_rmsnorm(float* residual, const bf16* delta, const float* weight, bf16* out, int32_t rows,
                        int32_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (chunked(dim))
    return launch_pdl(add_rmsnorm4_kernel<false>, dim3(rows), dim3(norm4_threads(dim)), 0, stream, residual, delta,
                      weight, out, static_cast<uint8_t*>(nullptr), static_cast<float*>(nullptr), dim, eps);
  return launch_pdl(add_rmsnorm_kernel<false>, dim3(rows), dim3(norm_threads(dim)), 0, stream, residual, delta, weight,
                    out, static_cast<uint8_t*>(nullptr), static_cast<float*>(nullptr), dim, eps);
}

cudaError_t add_rmsnorm_fp8(float* residual, const bf16* delta, const float* weight, int32_t rows, int32_t dim,
                            float eps, uint8_t* q, float* scales, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (chunked(dim))
    return launch_pdl(add_rmsnorm4_kernel<true>, dim3(rows), dim3(norm4_threads(dim)), 0, stream, residual, delta,
                      weight, static_cast<bf16*>(nullptr), q, scales, dim, eps);
  return launch_pdl(add_rmsnorm_kernel<true>, dim3(rows), dim3(norm_threads(dim)), 0, stream, residual, delta, weight,
                    static_cast<bf16*>(nullptr), q, scales, dim, eps);
}

cudaError_t add_residual(float* residual, const bf16* delta, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_residual_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(residual, delta, n);
  return cudaGetLastError();
}

cudaError_t head_rmsnorm(bf16* x, int64_t row_stride, int32_t num_tokens, int32_t num_heads, int32_t head_dim,
                         const float* weight, float eps, cudaStream_t stream) {
  const int64_t items = static_cast<int64_t>(num_tokens) * num_heads;
  if (items == 0) return cudaSuccess;
  if (head_dim > 256) return cudaErrorInvalidValue;
  constexpr int kWarpsPerBlock = 4;
  head_rmsnorm_kernel<<<static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32,
                        0, stream>>>(x, row_stride, num_tokens, num_heads, head_dim, weight, eps);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
