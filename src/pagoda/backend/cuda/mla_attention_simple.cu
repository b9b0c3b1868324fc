// A plain absorbed MLA attention over the paged latent (mla_ops.h): one thread
// block per (token, group of up to 16 heads; 4 when there are few tokens, so
// that more SMs work). The group's absorbed queries sit in shared memory as
// f32; the keys are read a tile of 16 cached vectors at a time (every 8-value
// chunk of the tile loaded before any is decoded, so the loads overlap),
// dequantized to f32 into shared memory (rows padded by 4 floats: 16-byte
// aligned and in distinct banks), and each tile is used by every head of
// the group: 16 x 16 scores (one per thread), an online-softmax update per
// head, then each thread accumulates its two output dims for every head in
// registers. The same arithmetic as the CPU's kernels::mla_paged_attention in
// f32, in another summation order. Correct for any shape within the limits; the
// fast paged decode kernel is attention/mla_decode.
#include <cmath>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda::cuda {

namespace {

using kernels::KvQuant;

constexpr int kHeads = 16;      // heads per thread block
constexpr int kTile = 16;       // cached vectors per tile
constexpr int kThreads = 256;
constexpr int kDimsPerThread = 2;  // output dims per thread: rank <= 512
constexpr int kMaxDim = 640;
constexpr int kPad = 4;  // floats after each shared row: 16-byte aligned rows in distinct banks
constexpr int kChunksPerThread = (kTile * kMaxDim / 8 + kThreads - 1) / kThreads;
// Below this many (token, head group) blocks, heads are split into groups of
// kSmallGroup so that more SMs work (each group reads the latent again).
constexpr int kSmallGroup = 4;
constexpr int kFewBlocks = 264;

static_assert(kHeads * kTile == kThreads, "one score per thread");

// One chunk of 8 consecutive latent values of the cached vector at `slot`:
// the raw codes (bf16: 16 bytes; fp8 / int8: 8; int4: 4) and the chunk's scale
// and zero. Loaded for the whole tile before any is decoded, so a thread's
// loads are in flight together.
struct RawChunk {
  uint4 bits;
  float scale;
  float zero;
  bool bf16;  // an fp8 pool's rope chunk: 8 bf16 values (runtime/mla_fp8_layout.h)
};

__device__ __forceinline__ RawChunk load_chunk(const DevicePagedKvLayer& layer, int64_t slot, int32_t chunk,
                                               int32_t rank) {
  const int32_t dim = layer.head_dim;
  RawChunk r{make_uint4(0, 0, 0, 0), 1.0f, 0.0f, false};
  const int64_t scale_vec = kernels::kv_scale_vector(slot, 0, layer.block_size, 1);
  switch (layer.key_dtype) {
    case KvQuant::kNone:  // token-major or swizzled pages (runtime/mla_latent_layout.h)
      r.bits = *reinterpret_cast<const uint4*>(
          static_cast<const std::byte*>(layer.key) +
          runtime::mla_latent_chunk_offset(layer.latent_pages, slot, layer.block_size, dim, chunk));
      break;
    case KvQuant::kFP8E4M3: {  // the latent pool's self-contained records (rank % 8 == 0)
      const uint8_t* record =
          static_cast<const uint8_t*>(layer.key) + slot * kernels::mla_fp8_record_bytes(rank, dim - rank);
      const int32_t first = chunk * 8;
      if (first < rank) {
        const uint2 b = *reinterpret_cast<const uint2*>(record + first);
        r.bits.x = b.x;
        r.bits.y = b.y;
        r.scale = *reinterpret_cast<const float*>(record + kernels::mla_fp8_scales_at(rank) +
                                                  4 * (first / kernels::kMlaFp8GroupSize));
      } else {  // 4-byte loads: the rope piece is 4-byte aligned for any rank
        const uint32_t* w = reinterpret_cast<const uint32_t*>(record + kernels::mla_fp8_rope_at(rank) + 2 * (first - rank));
        r.bits = make_uint4(w[0], w[1], w[2], w[3]);
        r.bf16 = true;
      }
      break;
    }
    case KvQuant::kInt8: {
      const uint2 b = reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(layer.key) + slot * dim)[chunk];
      r.bits.x = b.x;
      r.bits.y = b.y;
      const kernels::KvScaleZero z = static_cast<const kernels::KvScaleZero*>(layer.key_scale)[scale_vec];
      r.scale = __half2float(__ushort_as_half(z.scale_f16));
      r.zero = __half2float(__ushort_as_half(z.zero_f16));
      break;
    }
    case KvQuant::kInt4: {
      const int32_t bytes = kernels::kv_head_data_bytes(dim, KvQuant::kInt4);
      r.bits.x = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(layer.key) + slot * bytes)[chunk];
      const int32_t groups = kernels::kv_scale_groups(dim, KvQuant::kInt4);
      const kernels::KvScaleZero z = static_cast<const kernels::KvScaleZero*>(
          layer.key_scale)[scale_vec * groups + chunk * 8 / kernels::kKvInt4GroupSize];
      r.scale = __half2float(__ushort_as_half(z.scale_f16));
      r.zero = __half2float(__ushort_as_half(z.zero_f16));
      break;
    }
  }
  return r;
}

// The 8 values of a chunk in f32: code x scale + zero (bf16: the values).
__device__ __forceinline__ void decode_chunk(const RawChunk& r, KvQuant format, float* out) {
  if (r.bf16) format = KvQuant::kNone;
  switch (format) {
    case KvQuant::kNone: {
      const uint32_t w[4] = {r.bits.x, r.bits.y, r.bits.z, r.bits.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
      return;
    }
    case KvQuant::kFP8E4M3: {
      const uint32_t w[2] = {r.bits.x, r.bits.y};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint8_t code = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
        const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3));
        out[i] = __half2float(h) * r.scale;
      }
      return;
    }
    case KvQuant::kInt8: {
      const uint32_t w[2] = {r.bits.x, r.bits.y};
#pragma unroll
      for (int i = 0; i < 8; ++i)
        out[i] = static_cast<float>((w[i / 4] >> (8 * (i % 4))) & 0xffu) * r.scale + r.zero;
      return;
    }
    case KvQuant::kInt4: {
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = static_cast<float>((r.bits.x >> (4 * i)) & 0xfu) * r.scale + r.zero;
      return;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    mla_attention_kernel(const bf16* __restrict__ q, DevicePagedKvLayer layer, DeviceAttentionPlan plan,
                         int32_t num_heads, int32_t heads_per_block, int32_t rank, float scale,
                         bf16* __restrict__ out) {
  extern __shared__ float shared[];
  const int32_t dim = layer.head_dim;
  const int32_t ld = dim + kPad;
  float* q_s = shared;                  // [kHeads][ld]
  float* k_s = q_s + kHeads * ld;       // [kTile][ld]
  float* p_s = k_s + kTile * ld;        // [kHeads][kTile]
  float* m_s = p_s + kHeads * kTile;    // [kHeads] running max
  float* l_s = m_s + kHeads;            // [kHeads] running sum
  float* a_s = l_s + kHeads;            // [kHeads] this tile's rescale factor

  const int64_t t = blockIdx.x;
  const int32_t h0 = blockIdx.y * heads_per_block;
  const int32_t hc = min(heads_per_block, num_heads - h0);
  const int tid = threadIdx.x;
  const int32_t begin = plan.kv_begin[t], end = plan.kv_end[t];
  const int32_t* table = plan.block_tables + static_cast<int64_t>(plan.token_sequence[t]) * plan.block_table_stride;
  const int32_t bs = layer.block_size;
  const int32_t chunks_per_key = dim / 8;

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
    const int32_t chunks = n * chunks_per_key;
    // Every load of this thread's chunks first (independent, in flight together) ...
    RawChunk raw[kChunksPerThread];
#pragma unroll
    for (int r = 0; r < kChunksPerThread; ++r) {
      const int c = tid + r * kThreads;
      if (c < chunks) {
        const int32_t j = c / chunks_per_key;
        const int32_t index = k0 + j;
        const int64_t slot = static_cast<int64_t>(table[index / bs]) * bs + index % bs;
        raw[r] = load_chunk(layer, slot, c - j * chunks_per_key, rank);
      }
    }
    __syncthreads();  // the previous tile is consumed (and q_s / m_s are written)
    // ... then decoded into the tile.
#pragma unroll
    for (int r = 0; r < kChunksPerThread; ++r) {
      const int c = tid + r * kThreads;
      if (c < chunks) {
        const int32_t j = c / chunks_per_key;
        float v[8];
        decode_chunk(raw[r], layer.key_dtype, v);
        float4* dst = reinterpret_cast<float4*>(k_s + j * ld + (c - j * chunks_per_key) * 8);
        dst[0] = make_float4(v[0], v[1], v[2], v[3]);
        dst[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
    __syncthreads();
    {
      const int h = tid / kTile, j = tid % kTile;
      float s = -INFINITY;
      if (h < hc && j < n) {
        const float4* qr = reinterpret_cast<const float4*>(q_s + h * ld);
        const float4* kr = reinterpret_cast<const float4*>(k_s + j * ld);
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int e = 0; e < dim / 4; ++e) {
          const float4 x = qr[e], y = kr[e];
          a0 = fmaf(x.x, y.x, a0);
          a1 = fmaf(x.y, y.y, a1);
          a2 = fmaf(x.z, y.z, a2);
          a3 = fmaf(x.w, y.w, a3);
        }
        s = ((a0 + a1) + (a2 + a3)) * scale;
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
  if (rank <= 0 || rank > kThreads * kDimsPerThread || dim > kMaxDim || dim < rank || dim % 8 != 0 ||
      layer.num_kv_heads != 1 ||
      num_heads <= 0 ||
      (layer.key_dtype != KvQuant::kNone && layer.key_dtype != KvQuant::kFP8E4M3 && layer.key_scale == nullptr) ||
      (layer.key_dtype == KvQuant::kFP8E4M3 && rank % 8 != 0) ||  // fp8: records, no scale pool
      !mla_latent_pages_valid(layer))
    return cudaErrorInvalidValue;
  if (plan.num_tokens <= 0) return cudaSuccess;
  const size_t ld = static_cast<size_t>(dim) + kPad;
  const size_t shared = ((kHeads + kTile) * ld + kHeads * kTile + 3 * kHeads) * sizeof(float);
  const cudaError_t attr =
      cudaFuncSetAttribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (attr != cudaSuccess) return attr;
  int32_t group = kHeads;
  if (static_cast<int64_t>(plan.num_tokens) * ((num_heads + kHeads - 1) / kHeads) < kFewBlocks) group = kSmallGroup;
  const dim3 grid(static_cast<unsigned>(plan.num_tokens), static_cast<unsigned>((num_heads + group - 1) / group));
  mla_attention_kernel<<<grid, kThreads, shared, stream>>>(q, layer, plan, num_heads, group, rank, scale, out);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
