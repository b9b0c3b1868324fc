// The two small kernels of the tensor-core MLA prefill (mla_ops.h; the GEMMs
// are cuBLAS's, driven by cuda_deepseek_mla_prefill.cpp): gathering a
// sequence's paged latent into a contiguous bf16 matrix, and the causal
// softmax of one chunk of f32 scores into bf16 probabilities.
#include <cmath>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/kv_chunk_bf16.cuh"
#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda::cuda {

namespace {

// One thread per 16-byte chunk of a cached vector: the chunk is read as bf16
// whatever the pool's format (kv_chunk_bf16.cuh: code x scale + zero, rounded
// once to bf16, as the llama prefill over quantized KV reads it).
__global__ void mla_gather_latent_kernel(DevicePagedKvLayer layer, const int32_t* __restrict__ block_table,
                                         int32_t num_tokens, int32_t rank, bf16* __restrict__ out) {
  const int32_t chunks = layer.head_dim / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * chunks) return;
  const int32_t token = static_cast<int32_t>(i / chunks);
  const int32_t c = static_cast<int32_t>(i % chunks);
  const int64_t slot = static_cast<int64_t>(block_table[token / layer.block_size]) * layer.block_size +
                       token % layer.block_size;
  if (layer.key_dtype == kernels::KvQuant::kFP8E4M3) {  // runtime/mla_fp8_layout.h's record
    const uint8_t* record =
        static_cast<const uint8_t*>(layer.key) + slot * kernels::mla_fp8_record_bytes(rank, layer.head_dim - rank);
    const int32_t first = c * 8;
    uint32_t w[4];
    if (first < rank) {  // 8 codes x their group's scale, rounded once to bf16
      const uint2 b = *reinterpret_cast<const uint2*>(record + first);
      const float scale = *reinterpret_cast<const float*>(record + kernels::mla_fp8_scales_at(rank) +
                                                          4 * (first / kernels::kMlaFp8GroupSize));
      const uint32_t codes[2] = {b.x, b.y};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint8_t code = static_cast<uint8_t>(codes[k / 2] >> (8 * (2 * (k % 2) + e)));
          v[e] = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3))) * scale;
        }
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v[0], v[1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    } else {  // the rope values, bf16 already (4-byte aligned for any rank)
      const uint32_t* src = reinterpret_cast<const uint32_t*>(record + kernels::mla_fp8_rope_at(rank) + 2 * (first - rank));
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = src[k];
    }
    reinterpret_cast<uint4*>(out)[i] = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  if (layer.latent_pages == runtime::MlaLatentPages::kSwizzled128) {  // bf16 pages, chunks where the layout puts them
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(
        static_cast<const std::byte*>(layer.key) +
        runtime::mla_latent_chunk_offset(layer.latent_pages, slot, layer.block_size, layer.head_dim, c));
    return;
  }
  const int64_t scale_vec = kernels::kv_scale_vector(slot, 0, layer.block_size, 1);
  reinterpret_cast<uint4*>(out)[i] =
      load_kv_chunk_bf16(layer.key, layer.key_scale, layer.key_dtype, slot, scale_vec, layer.head_dim, c);
}

constexpr int kSoftmaxThreads = 256;

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch is reused between calls
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kSoftmaxThreads / 32 ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  return v;
}

// One thread block per (row, head): row i sees keys [0, first_visible + i).
__global__ void __launch_bounds__(kSoftmaxThreads)
    mla_causal_softmax_kernel(const float* __restrict__ scores, int32_t rows, int32_t cols, int32_t ld,
                              int32_t first_visible, float scale_log2, bf16* __restrict__ probs) {
  __shared__ float scratch[kSoftmaxThreads / 32];
  const int32_t i = blockIdx.x;
  const int64_t row = (static_cast<int64_t>(blockIdx.y) * rows + i) * ld;
  const float* s = scores + row;
  bf16* p = probs + row;
  const int32_t visible = min(cols, first_visible + i);
  float m = -INFINITY;
  for (int32_t j = threadIdx.x; j < visible; j += kSoftmaxThreads) m = fmaxf(m, s[j]);
  m = block_reduce(m, true, scratch);
  float sum = 0.0f;
  for (int32_t j = threadIdx.x; j < visible; j += kSoftmaxThreads) sum += exp2f((s[j] - m) * scale_log2);
  sum = block_reduce(sum, false, scratch);
  const float inv = visible > 0 ? 1.0f / sum : 0.0f;
  for (int32_t j = threadIdx.x; j < cols; j += kSoftmaxThreads)
    p[j] = __float2bfloat16_rn(j < visible ? exp2f((s[j] - m) * scale_log2) * inv : 0.0f);
}

}  // namespace

cudaError_t mla_gather_latent(const DevicePagedKvLayer& layer, const int32_t* block_table, int32_t num_tokens,
                              int32_t rank, bf16* out, cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  if (layer.head_dim % 8 != 0 || layer.num_kv_heads != 1 || rank <= 0 || rank > layer.head_dim ||
      (layer.key_dtype == kernels::KvQuant::kFP8E4M3 && rank % 8 != 0) || !mla_latent_pages_valid(layer))
    return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  const int64_t total = static_cast<int64_t>(num_tokens) * (layer.head_dim / 8);
  const int64_t grid = (total + kThreads - 1) / kThreads;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  mla_gather_latent_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(layer, block_table, num_tokens, rank,
                                                                                   out);
  return cudaGetLastError();
}

cudaError_t mla_causal_softmax(const float* scores, int32_t num_heads, int32_t rows, int32_t cols, int32_t ld,
                               int32_t first_visible, float scale, bf16* probs, cudaStream_t stream) {
  if (rows <= 0 || num_heads <= 0) return cudaSuccess;
  if (num_heads > 65535 || ld < cols) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(num_heads));
  mla_causal_softmax_kernel<<<grid, kSoftmaxThreads, 0, stream>>>(scores, rows, cols, ld, first_visible,
                                                                   scale * 1.4426950408889634f, probs);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
