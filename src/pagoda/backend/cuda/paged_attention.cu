// Paged attention, simple and correct (the fast kernels are backend/cuda/attention's).
//
// Grid (token, kv head, group of up to 8 query heads): the query heads that
// share a KV head share every K/V tile, loaded into shared memory 32 keys at a
// time through the block table. Scores, an online softmax (running max and sum
// per head) and the V accumulation are all f32. Shared rows are padded to an
// odd number of 4-byte words so that 32 lanes reading 32 different keys hit 32
// different banks. Quantized pools are dequantized to bf16 on the way into
// shared memory (f32 code x scale + zero, rounded once).
#include <cfloat>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/kv_chunk_bf16.cuh"
#include "pagoda/backend/cuda/kv_share_ops.h"

namespace pagoda::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = 32;
constexpr int kMaxHeads = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kRowWords = kMaxHeadDim / 2 + 1;  // bf16 pairs per shared row, padded
constexpr int kWarps = kThreads / 32;

__device__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Elements [8 c, 8 c + 8) of the vector at index vec of one pool, as four bf16
// pairs into a padded shared row (4-byte aligned only, hence word by word).
__device__ __forceinline__ void load_chunk(const void* pool, const void* scales, kernels::KvQuant format,
                                           int64_t vec, int64_t scale_vec, int32_t head_dim, int32_t c,
                                           __nv_bfloat162* dst) {
  const uint4 chunk = load_kv_chunk_bf16(pool, scales, format, vec, scale_vec, head_dim, c);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&chunk);
#pragma unroll
  for (int w = 0; w < 4; ++w) dst[w] = pairs[w];
}

__global__ void __launch_bounds__(kThreads)
paged_attention_kernel(const bf16* __restrict__ q, int64_t q_row_stride, DevicePagedKvLayer layer,
                       DeviceAttentionPlan plan, int32_t num_q_heads, int32_t group, float scale,
                       DeviceKvShare share, bf16* __restrict__ out) {
  __shared__ float q_s[kMaxHeads][kMaxHeadDim];
  __shared__ __nv_bfloat162 k_s[kTileKeys][kRowWords];
  __shared__ __nv_bfloat162 v_s[kTileKeys][kRowWords];
  __shared__ float p_s[kMaxHeads][kTileKeys];
  __shared__ float m_s[kMaxHeads], l_s[kMaxHeads], corr_s[kMaxHeads];
  // Cross-layer sharing (kv_share_ops.h): this member's K and V norm of each key of the tile; 1 when not shared.
  __shared__ float k_norm_s[kTileKeys], v_norm_s[kTileKeys];

  const int32_t t = blockIdx.x;
  const int32_t kv_head = blockIdx.y;
  const int32_t group_begin = blockIdx.z * kMaxHeads;
  const int32_t num_heads = min(kMaxHeads, group - group_begin);
  const int32_t head_dim = layer.head_dim;
  const int32_t pairs = head_dim / 2;
  const int32_t first_head = kv_head * group + group_begin;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t kv_begin = plan.kv_begin[t];
  const int32_t kv_end = plan.kv_end[t];
  __nv_bfloat162* out_t = reinterpret_cast<__nv_bfloat162*>(
      out + (static_cast<int64_t>(t) * num_q_heads + first_head) * head_dim);

  if (kv_end <= kv_begin) {  // padding row of a graph bucket
    for (int32_t i = tid; i < num_heads * pairs; i += kThreads) out_t[i] = __float2bfloat162_rn(0.0f);
    return;
  }
  const bf16* q_t = q + static_cast<int64_t>(t) * q_row_stride + static_cast<int64_t>(first_head) * head_dim;
  for (int32_t i = tid; i < num_heads * head_dim; i += kThreads)
    q_s[i / head_dim][i % head_dim] = __bfloat162float(q_t[i]) * scale;
  if (tid < kMaxHeads) {
    m_s[tid] = -FLT_MAX;
    l_s[tid] = 0.0f;
  }
  float2 acc[kMaxHeads];
#pragma unroll
  for (int g = 0; g < kMaxHeads; ++g) acc[g] = make_float2(0.0f, 0.0f);

  const int32_t sequence = plan.token_sequence[t];
  const int32_t* table = plan.block_tables + static_cast<int64_t>(sequence) * plan.block_table_stride;
  const int32_t chunks = head_dim / 8;
  // Per-head holes (token eviction): loaded as zeros, never attended.
  int32_t hole_begin = 0, hole_end = 0;
  if (plan.hole_begin != nullptr) {
    hole_begin = plan.hole_begin[static_cast<int64_t>(sequence) * layer.num_kv_heads + kv_head];
    hole_end = plan.hole_end[sequence];
  }
  auto live = [&](int32_t pos) { return pos < hole_begin || pos >= hole_end; };

  for (int32_t tile = kv_begin; tile < kv_end; tile += kTileKeys) {
    const int32_t n = min(kTileKeys, kv_end - tile);
    for (int32_t i = tid; i < n * chunks; i += kThreads) {
      const int32_t key = i / chunks, c = i % chunks;
      const int32_t pos = tile + key;
      if (!live(pos)) {
#pragma unroll
        for (int w = 0; w < 4; ++w) k_s[key][c * 4 + w] = v_s[key][c * 4 + w] = __float2bfloat162_rn(0.0f);
        continue;
      }
      const int64_t block = table[pos / layer.block_size];
      const int64_t slot = block * layer.block_size + pos % layer.block_size;
      const int64_t vec = slot * layer.num_kv_heads + kv_head;
      const int64_t scale_vec = kernels::kv_scale_vector(slot, kv_head, layer.block_size, layer.num_kv_heads);
      load_chunk(layer.key, layer.key_scale, layer.key_dtype, vec, scale_vec, head_dim, c, &k_s[key][c * 4]);
      load_chunk(layer.value, layer.value_scale, layer.value_dtype, vec, scale_vec, head_dim, c, &v_s[key][c * 4]);
    }
    if (tid < kTileKeys) {
      float k_norm = 1.0f, v_norm = 1.0f;
      if (share.norms != nullptr && tid < n && live(tile + tid)) {
        const int32_t pos = tile + tid;
        const int64_t slot = int64_t{table[pos / layer.block_size]} * layer.block_size + pos % layer.block_size;
        const float* rec = share.norms + (slot * layer.num_kv_heads + kv_head) * 2 * share.record;
        k_norm = rec[share.member];
        v_norm = rec[share.record + share.member];
      }
      k_norm_s[tid] = k_norm;
      v_norm_s[tid] = v_norm;
    }
    __syncthreads();

    for (int32_t s = tid; s < num_heads * kTileKeys; s += kThreads) {
      const int32_t g = s / kTileKeys, key = s % kTileKeys;
      float dot = -FLT_MAX;
      if (key < n && live(tile + key)) {
        dot = 0.0f;
        for (int32_t d2 = 0; d2 < pairs; ++d2) {
          const float2 kf = __bfloat1622float2(k_s[key][d2]);
          dot += q_s[g][2 * d2] * kf.x + q_s[g][2 * d2 + 1] * kf.y;
        }
        dot *= k_norm_s[key];
      }
      p_s[g][key] = dot;
    }
    __syncthreads();

    // Online softmax: one warp per head, one lane per key of the tile.
    for (int32_t g = warp; g < num_heads; g += kWarps) {
      const float score = p_s[g][lane];
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, warp_max(score));
      const float p = lane < n && live(tile + lane) ? expf(score - m_new) : 0.0f;
      const float sum = warp_sum(p);
      p_s[g][lane] = p;
      if (lane == 0) {
        const float corr = expf(m_old - m_new);
        l_s[g] = l_s[g] * corr + sum;
        m_s[g] = m_new;
        corr_s[g] = corr;
      }
    }
    __syncthreads();

    if (tid < pairs) {
#pragma unroll
      for (int g = 0; g < kMaxHeads; ++g) {
        if (g < num_heads) {
          acc[g].x *= corr_s[g];
          acc[g].y *= corr_s[g];
        }
      }
      for (int32_t key = 0; key < n; ++key) {
        const float2 vf = __bfloat1622float2(v_s[key][tid]);
#pragma unroll
        for (int g = 0; g < kMaxHeads; ++g) {
          if (g < num_heads) {
            const float p = p_s[g][key] * v_norm_s[key];
            acc[g].x += p * vf.x;
            acc[g].y += p * vf.y;
          }
        }
      }
    }
    __syncthreads();
  }

  if (tid < pairs) {
#pragma unroll
    for (int g = 0; g < kMaxHeads; ++g) {
      if (g < num_heads) {
        const float inv = 1.0f / l_s[g];
        out_t[g * pairs + tid] = __float22bfloat162_rn(make_float2(acc[g].x * inv, acc[g].y * inv));
      }
    }
  }
}

}  // namespace

cudaError_t paged_attention(const bf16* q, int64_t q_row_stride, const DevicePagedKvLayer& layer,
                            const DeviceAttentionPlan& plan, int32_t num_q_heads, float scale, bf16* out,
                            cudaStream_t stream) {
  return paged_attention_shared(q, q_row_stride, layer, plan, num_q_heads, scale, DeviceKvShare{}, out, stream);
}

cudaError_t paged_attention_shared(const bf16* q, int64_t q_row_stride, const DevicePagedKvLayer& layer,
                                   const DeviceAttentionPlan& plan, int32_t num_q_heads, float scale,
                                   const DeviceKvShare& share, bf16* out, cudaStream_t stream) {
  if (share.norms != nullptr && (share.record < 3 || share.member < 0 || share.member >= share.record - 1))
    return cudaErrorInvalidValue;
  if (plan.num_tokens == 0) return cudaSuccess;
  if (layer.head_dim % 8 != 0 || layer.head_dim > kMaxHeadDim || layer.num_kv_heads <= 0 ||
      num_q_heads % layer.num_kv_heads != 0 || q_row_stride % 8 != 0)
    return cudaErrorInvalidValue;
  if ((layer.key_dtype != kernels::KvQuant::kNone && layer.key_scale == nullptr) ||
      (layer.value_dtype != kernels::KvQuant::kNone && layer.value_scale == nullptr))
    return cudaErrorInvalidValue;
  const int32_t group = num_q_heads / layer.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(plan.num_tokens), static_cast<unsigned>(layer.num_kv_heads),
                  static_cast<unsigned>((group + kMaxHeads - 1) / kMaxHeads));
  paged_attention_kernel<<<grid, kThreads, 0, stream>>>(q, q_row_stride, layer, plan, num_q_heads, group, scale,
                                                        share, out);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
