// A plain absorbed MLA attention over the paged latent (mla_ops.h): one thread
// block per (token, group of up to 16 heads). The group's absorbed queries sit
// in shared memory as f32; the keys are read a tile of 16 cached vectors at a
// time, dequantized to f32 into shared memory (rows padded by one float so the
// 16 key rows fall in distinct banks), and each tile is used by every head of
// the group: 16 x 16 scores (one per thread), an online-softmax update per
// head, then each thread accumulates its two output dims for every head in
// registers. The same arithmetic as the CPU's kernels::mla_paged_attention in
// f32, in another summation order. Correct for any shape within the limits; the
// fast paged decode kernel is attention/mla_decode.
#include <cmath>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/mla_ops.h"

namespace pagoda::cuda {

namespace {

using kernels::KvQuant;

constexpr int kHeads = 16;      // heads per thread block
constexpr int kTile = 16;       // cached vectors per tile
constexpr int kThreads = 256;
constexpr int kDimsPerThread = 2;  // output dims per thread: rank <= 512
constexpr int kMaxDim = 640;

static_assert(kHeads * kTile == kThreads, "one score per thread");

// Element e of the cached vector at pool slot `slot`, in f32.
__device__ __forceinline__ float latent_element(const DevicePagedKvLayer& layer, int64_t slot, int32_t e) {
  const int32_t dim = layer.head_dim;
  switch (layer.key_dtype) {
    case KvQuant::kNone:
      return __bfloat162float(static_cast<const bf16*>(layer.key)[slot * dim + e]);
    case KvQuant::kFP8E4M3: {
      const uint8_t code = static_cast<const uint8_t*>(layer.key)[slot * dim + e];
      const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3));
      const float scale =
          static_cast<const float*>(layer.key_scale)[kernels::kv_scale_vector(slot, 0, layer.block_size, 1)];
      return __half2float(h) * scale;
    }
    case KvQuant::kInt8: {
      const uint8_t code = static_cast<const uint8_t*>(layer.key)[slot * dim + e];
      const kernels::KvScaleZero r = static_cast<const kernels::KvScaleZero*>(
          layer.key_scale)[kernels::kv_scale_vector(slot, 0, layer.block_size, 1)];
      return static_cast<float>(code) * __half2float(__ushort_as_half(r.scale_f16)) +
             __half2float(__ushort_as_half(r.zero_f16));
    }
    case KvQuant::kInt4: {
      const int32_t bytes = kernels::kv_head_data_bytes(dim, KvQuant::kInt4);
      const uint8_t pair = static_cast<const uint8_t*>(layer.key)[slot * bytes + e / 2];
      const uint32_t code = (e % 2 == 0) ? (pair & 0xfu) : (pair >> 4);
      const int32_t groups = kernels::kv_scale_groups(dim, KvQuant::kInt4);
      const kernels::KvScaleZero r = static_cast<const kernels::KvScaleZero*>(
          layer.key_scale)[kernels::kv_scale_vector(slot, 0, layer.block_size, 1) * groups +
                           e / kernels::kKvInt4GroupSize];
      return static_cast<float>(code) * __half2float(__ushort_as_half(r.scale_f16)) +
             __half2float(__ushort_as_half(r.zero_f16));
    }
  }
  return 0.0f;
}

__global__ void __launch_bounds__(kThreads)
    mla_attention_kernel(const bf16* __restrict__ q, DevicePagedKvLayer layer, DeviceAttentionPlan plan,
                         int32_t num_heads, int32_t rank, float scale, bf16* __restrict__ out) {
  extern __shared__ float shared[];
  const int32_t dim = layer.head_dim;
  const int32_t ld = dim + 1;
  float* q_s = shared;                  // [kHeads][ld]
  float* k_s = q_s + kHeads * ld;       // [kTile][ld]
  float* p_s = k_s + kTile * ld;        // [kHeads][kTile]
  float* m_s = p_s + kHeads * kTile;    // [kHeads] running max
  float* l_s = m_s + kHeads;            // [kHeads] running sum
  float* a_s = l_s + kHeads;            // [kHeads] this tile's rescale factor

  const int64_t t = blockIdx.x;
  const int32_t h0 = blockIdx.y * kHeads;
  const int32_t hc = min(kHeads, num_heads - h0);
  const int tid = threadIdx.x;
  const int32_t begin = plan.kv_begin[t], end = plan.kv_end[t];
  const int32_t* table = plan.block_tables + static_cast<int64_t>(plan.token_sequence[t]) * plan.block_table_stride;
  const int32_t bs = layer.block_size;

  for (int i = tid; i < hc * dim; i += kThreads)
    q_s[(i / dim) * ld + i % dim] = __bfloat162float(q[(t * num_heads + h0) * dim + i]);
  if (tid < kHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  float acc[kHeads][kDimsPerThread];
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) acc[h][j] = 0.0f;

  for (int32_t k0 = begin; k0 < end; k0 += kTile) {
    const int32_t n = min(kTile, end - k0);
    __syncthreads();  // the previous tile is consumed (and q_s / m_s are written)
    for (int i = tid; i < n * dim; i += kThreads) {
      const int32_t j = i / dim, e = i % dim;
      const int32_t index = k0 + j;
      const int64_t slot = static_cast<int64_t>(table[index / bs]) * bs + index % bs;
      k_s[j * ld + e] = latent_element(layer, slot, e);
    }
    __syncthreads();
    {
      const int h = tid / kTile, j = tid % kTile;
      float s = -INFINITY;
      if (h < hc && j < n) {
        const float* qr = q_s + h * ld;
        const float* kr = k_s + j * ld;
        float dot = 0.0f;
        for (int e = 0; e < dim; ++e) dot = fmaf(qr[e], kr[e], dot);
        s = dot * scale;
      }
      p_s[h * kTile + j] = s;
    }
    __syncthreads();
    if (tid < hc) {
      float* row = p_s + tid * kTile;
      float mx = m_s[tid];
      for (int j = 0; j < n; ++j) mx = fmaxf(mx, row[j]);
      const float alpha = m_s[tid] == -INFINITY ? 0.0f : expf(m_s[tid] - mx);
      float sum = 0.0f;
      for (int j = 0; j < kTile; ++j) {
        const float p = j < n ? expf(row[j] - mx) : 0.0f;
        row[j] = p;
        sum += p;
      }
      l_s[tid] = l_s[tid] * alpha + sum;
      m_s[tid] = mx;
      a_s[tid] = alpha;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      if (h < hc) {
        const float alpha = a_s[h];
        const float* p = p_s + h * kTile;
#pragma unroll
        for (int jd = 0; jd < kDimsPerThread; ++jd) {
          const int d = tid + jd * kThreads;
          if (d < rank) {
            float a = acc[h][jd] * alpha;
            for (int j = 0; j < n; ++j) a = fmaf(p[j], k_s[j * ld + d], a);
            acc[h][jd] = a;
          }
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < hc) {
      const float l = l_s[h];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int jd = 0; jd < kDimsPerThread; ++jd) {
        const int d = tid + jd * kThreads;
        if (d < rank) out[(t * num_heads + h0 + h) * rank + d] = __float2bfloat16(acc[h][jd] * inv);
      }
    }
  }
}

}  // namespace

cudaError_t mla_attention_simple(const bf16* q, const DevicePagedKvLayer& layer, const DeviceAttentionPlan& plan,
                                 int32_t num_heads, int32_t rank, float scale, bf16* out, cudaStream_t stream) {
  const int32_t dim = layer.head_dim;
  if (rank <= 0 || rank > kThreads * kDimsPerThread || dim > kMaxDim || dim < rank || layer.num_kv_heads != 1 ||
      num_heads <= 0 || (layer.key_dtype != KvQuant::kNone && layer.key_scale == nullptr))
    return cudaErrorInvalidValue;
  if (plan.num_tokens <= 0) return cudaSuccess;
  const size_t ld = static_cast<size_t>(dim) + 1;
  const size_t shared = ((kHeads + kTile) * ld + kHeads * kTile + 3 * kHeads) * sizeof(float);
  const cudaError_t attr =
      cudaFuncSetAttribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(plan.num_tokens), static_cast<unsigned>((num_heads + kHeads - 1) / kHeads));
  mla_attention_kernel<<<grid, kThreads, shared, stream>>>(q, layer, plan, num_heads, rank, scale, out);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
