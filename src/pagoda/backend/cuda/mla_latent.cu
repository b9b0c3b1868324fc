// MLA's small per-token kernels: the latent RMSNorm of q LoRA, the latent
// write (norm + rope + quantize into the pool) and the query's rope part.
// One thread block per token row; a block-wide sum in shared memory. The
// quantization follows runtime/kv_quant.h with explicitly rounded intrinsics,
// as kv_write.cu does, over the whole latent vector (one record per token; int4
// one record per group of 32); fp8 writes runtime/mla_fp8_layout.h's
// self-contained record (a scale per 128 latent values, the rope key in bf16).
#include <cmath>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda::cuda {

namespace {

using kernels::KvQuant;

constexpr int kThreads = 256;
constexpr int kMaxLatent = 1024;

// Block-wide reduction of one value per thread (op: 0 sum, 1 max, 2 min); every thread gets the result.
__device__ float block_reduce(float v, int op, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = op == 0 ? v + o : (op == 1 ? fmaxf(v, o) : fminf(v, o));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float r = scratch[0];
  for (int w = 1; w < warps; ++w)
    r = op == 0 ? r + scratch[w] : (op == 1 ? fmaxf(r, scratch[w]) : fminf(r, scratch[w]));
  return r;
}

__global__ void __launch_bounds__(kThreads) rmsnorm_f32_kernel(const float* __restrict__ x, int64_t x_stride,
                                                              const float* __restrict__ bias,
                                                              const float* __restrict__ weight, bf16* __restrict__ out,
                                                              int32_t dim, float eps) {
  __shared__ float scratch[32];
  const float* row = x + blockIdx.x * x_stride;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = row[i] + (bias != nullptr ? bias[i] : 0.0f);
    sum += v * v;
  }
  sum = block_reduce(sum, 0, scratch);
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = row[i] + (bias != nullptr ? bias[i] : 0.0f);
    out[blockIdx.x * static_cast<int64_t>(dim) + i] = __float2bfloat16(weight[i] * (v * inv));
  }
}

// The rotated pair (a, b) of rope frequency i at position pos.
__device__ __forceinline__ void rotate(float& a, float& b, int32_t pos, float inv_freq, float factor) {
  const float angle = static_cast<float>(pos) * inv_freq;
  float s, c;
  sincosf(angle, &s, &c);
  c *= factor;
  s *= factor;
  const float x = a, y = b;
  a = x * c - y * s;
  b = y * c + x * s;
}

struct IntParams {
  kernels::KvScaleZero record;
  float zero;
  float inverse_scale;
};
__device__ __forceinline__ IntParams int_params(float lo, float hi, int levels) {
  IntParams p;
  const __half zero = __float2half_rn(lo);
  p.zero = __half2float(zero);
  __half scale = __float2half_rn(__fdiv_rn(__fsub_rn(hi, p.zero), static_cast<float>(levels)));
  if ((__half_as_ushort(scale) & 0x7fffu) == 0) scale = __float2half_rn(1.0f);
  p.inverse_scale = __fdiv_rn(1.0f, __half2float(scale));
  p.record.scale_f16 = __half_as_ushort(scale);
  p.record.zero_f16 = __half_as_ushort(zero);
  return p;
}
__device__ __forceinline__ uint32_t int_code(float x, const IntParams& p, int levels) {
  const float q = rintf(__fmul_rn(__fsub_rn(x, p.zero), p.inverse_scale));
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), static_cast<float>(levels)));
}

__global__ void __launch_bounds__(kThreads)
    latent_write_kernel(const float* __restrict__ kv_a, const float* __restrict__ bias,
                        const float* __restrict__ norm_weight, float eps, const int32_t* __restrict__ positions,
                        const int64_t* __restrict__ slots, int32_t rank, int32_t rope_dim,
                        const float* __restrict__ inv_freq, bool interleaved, float rope_factor,
                        DevicePagedKvLayer layer) {
  __shared__ float v[kMaxLatent];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // uniform across the block
  const int32_t dim = rank + rope_dim;
  const float* row = kv_a + t * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float x = row[i] + (bias != nullptr ? bias[i] : 0.0f);
    v[i] = x;
    if (i < rank) sum += x * x;
  }
  sum = block_reduce(sum, 0, scratch);  // synchronizes: v is complete
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(rank) + eps);
  for (int i = threadIdx.x; i < rank; i += blockDim.x) v[i] = norm_weight[i] * (v[i] * inv);
  const int32_t half = rope_dim / 2;
  const int32_t pos = positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int first = rank + (interleaved ? 2 * i : i);
    const int second = rank + (interleaved ? 2 * i + 1 : i + half);
    float a = v[first], b = v[second];
    rotate(a, b, pos, inv_freq[i], rope_factor);
    v[first] = a;
    v[second] = b;
  }
  __syncthreads();

  switch (layer.key_dtype) {
    case KvQuant::kNone: {
      if (layer.latent_pages == runtime::MlaLatentPages::kSwizzled128) {
        // One thread a 16-byte chunk (8 values), stored where the page's layout puts it.
        auto* page = static_cast<std::byte*>(layer.key);
        for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
          uint32_t w[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const __nv_bfloat162 pair = __floats2bfloat162_rn(v[8 * c + 2 * k], v[8 * c + 2 * k + 1]);
            w[k] = *reinterpret_cast<const uint32_t*>(&pair);
          }
          *reinterpret_cast<uint4*>(
              page + runtime::mla_latent_chunk_offset(layer.latent_pages, slot, layer.block_size, dim, c)) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
        return;
      }
      bf16* out = static_cast<bf16*>(layer.key) + slot * dim;
      for (int i = threadIdx.x; i < dim; i += blockDim.x) out[i] = __float2bfloat16(v[i]);
      return;
    }
    case KvQuant::kFP8E4M3: {
      // The latent pool's fp8 record (runtime/mla_fp8_layout.h): codes with a
      // scale per 128 latent values, the rope key in bf16, zero padding.
      uint8_t* out = static_cast<uint8_t*>(layer.key) + slot * kernels::mla_fp8_record_bytes(rank, rope_dim);
      const int32_t scales_at = kernels::mla_fp8_scales_at(rank), rope_at = kernels::mla_fp8_rope_at(rank);
      for (int32_t g = 0; g < kernels::mla_fp8_groups(rank); ++g) {
        const int32_t begin = g * kernels::kMlaFp8GroupSize;
        const int32_t end = min(begin + kernels::kMlaFp8GroupSize, rank);
        float amax = 0.0f;
        for (int i = begin + threadIdx.x; i < end; i += blockDim.x) amax = fmaxf(amax, fabsf(v[i]));
        amax = block_reduce(amax, 1, scratch);
        const float scale = amax > 0.0f ? __fdiv_rn(amax, kernels::kKvFp8Max) : 1.0f;
        const float inverse = __fdiv_rn(1.0f, scale);
        for (int i = begin + threadIdx.x; i < end; i += blockDim.x)
          out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(v[i], inverse), __NV_SATFINITE, __NV_E4M3));
        if (threadIdx.x == 0) *reinterpret_cast<float*>(out + scales_at + 4 * g) = scale;
      }
      for (int i = threadIdx.x; i < rope_dim; i += blockDim.x)
        reinterpret_cast<bf16*>(out + rope_at)[i] = __float2bfloat16(v[rank + i]);
      const int32_t used = rope_at + 2 * rope_dim, bytes = kernels::mla_fp8_record_bytes(rank, rope_dim);
      for (int i = used + threadIdx.x; i < bytes; i += blockDim.x) out[i] = 0;
      for (int i = rank + threadIdx.x; i < scales_at; i += blockDim.x) out[i] = 0;
      return;
    }
    case KvQuant::kInt8: {
      float lo = INFINITY, hi = -INFINITY;
      for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        lo = fminf(lo, v[i]);
        hi = fmaxf(hi, v[i]);
      }
      lo = block_reduce(lo, 2, scratch);
      hi = block_reduce(hi, 1, scratch);
      const IntParams p = int_params(lo, hi, 255);
      uint8_t* out = static_cast<uint8_t*>(layer.key) + slot * dim;
      for (int i = threadIdx.x; i < dim; i += blockDim.x) out[i] = static_cast<uint8_t>(int_code(v[i], p, 255));
      if (threadIdx.x == 0)
        static_cast<kernels::KvScaleZero*>(layer.key_scale)[kernels::kv_scale_vector(slot, 0, layer.block_size, 1)] =
            p.record;
      return;
    }
    case KvQuant::kInt4: {
      // One warp per group of 32 elements (the last group may be shorter).
      const int32_t groups = kernels::kv_scale_groups(dim, KvQuant::kInt4);
      uint8_t* out = static_cast<uint8_t*>(layer.key) + slot * kernels::kv_head_data_bytes(dim, KvQuant::kInt4);
      auto* records = static_cast<kernels::KvScaleZero*>(layer.key_scale) +
                      kernels::kv_scale_vector(slot, 0, layer.block_size, 1) * groups;
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      for (int g = warp; g < groups; g += blockDim.x / 32) {
        const int e = g * 32 + lane;
        const bool valid = e < dim;
        float lo = valid ? v[e] : INFINITY, hi = valid ? v[e] : -INFINITY;
        for (int offset = 16; offset > 0; offset >>= 1) {
          lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
          hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
        }
        const IntParams p = int_params(lo, hi, 15);
        const uint32_t code = valid ? int_code(v[e], p, 15) : 0u;
        const uint32_t odd = __shfl_down_sync(0xffffffffu, code, 1);
        if ((lane & 1) == 0 && valid) out[e / 2] = static_cast<uint8_t>(code | (odd << 4));
        if (lane == 0) records[g] = p.record;
      }
      return;
    }
  }
}

__global__ void query_rope_kernel(const bf16* __restrict__ q, bf16* __restrict__ q_absorbed,
                                  const int32_t* __restrict__ positions, int32_t num_heads, int32_t nope,
                                  int32_t rope_dim, int32_t rank, const float* __restrict__ inv_freq,
                                  bool interleaved, float rope_factor) {
  const int64_t t = blockIdx.x;
  const int32_t half = rope_dim / 2;
  const int32_t pos = positions[t];
  for (int k = threadIdx.x; k < num_heads * half; k += blockDim.x) {
    const int h = k / half, i = k % half;
    const bf16* src = q + (t * num_heads + h) * (nope + rope_dim) + nope;
    bf16* dst = q_absorbed + (t * num_heads + h) * (rank + rope_dim) + rank;
    const int first = interleaved ? 2 * i : i;
    const int second = interleaved ? 2 * i + 1 : i + half;
    float a = __bfloat162float(src[first]), b = __bfloat162float(src[second]);
    rotate(a, b, pos, inv_freq[i], rope_factor);
    dst[first] = __float2bfloat16(a);
    dst[second] = __float2bfloat16(b);
  }
}

}  // namespace

cudaError_t mla_rmsnorm_f32(const float* x, int64_t x_stride, const float* bias, const float* weight, bf16* out,
                            int32_t rows, int32_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rmsnorm_f32_kernel<<<rows, kThreads, 0, stream>>>(x, x_stride, bias, weight, out, dim, eps);
  return cudaGetLastError();
}

cudaError_t mla_latent_write(const float* kv_a, const float* bias, const float* norm_weight, float eps,
                             const int32_t* positions, const int64_t* slots, int32_t num_tokens, int32_t rank,
                             int32_t rope_dim, const float* inv_freq, bool interleaved, float rope_factor,
                             const DevicePagedKvLayer& layer, cudaStream_t stream) {
  if (rank + rope_dim > kMaxLatent || rank % 2 != 0 || rope_dim % 2 != 0 || layer.head_dim != rank + rope_dim ||
      layer.num_kv_heads != 1 ||
      (layer.key_dtype != KvQuant::kNone && layer.key_dtype != KvQuant::kFP8E4M3 && layer.key_scale == nullptr) ||
      !mla_latent_pages_valid(layer))
    return cudaErrorInvalidValue;
  if (num_tokens <= 0) return cudaSuccess;
  latent_write_kernel<<<num_tokens, kThreads, 0, stream>>>(kv_a, bias, norm_weight, eps, positions, slots, rank,
                                                           rope_dim, inv_freq, interleaved, rope_factor, layer);
  return cudaGetLastError();
}

cudaError_t mla_query_rope(const bf16* q, bf16* q_absorbed, const int32_t* positions, int32_t num_tokens,
                           int32_t num_heads, int32_t nope, int32_t rope_dim, int32_t rank, const float* inv_freq,
                           bool interleaved, float rope_factor, cudaStream_t stream) {
  if (rope_dim % 2 != 0) return cudaErrorInvalidValue;
  if (num_tokens <= 0) return cudaSuccess;
  query_rope_kernel<<<num_tokens, 128, 0, stream>>>(q, q_absorbed, positions, num_heads, nope, rope_dim, rank,
                                                    inv_freq, interleaved, rope_factor);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
