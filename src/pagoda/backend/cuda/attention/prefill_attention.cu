// Prefill (and chunked-prefill, and mixed) attention over the paged cache with
// bf16 tensor cores (mma.sync m16n8k16, f32 accumulate), FlashAttention-2
// style: online softmax over tiles of 64 KV positions, P kept in registers.
//
// One CTA = 128 query rows x one KV head. The rows pack the query heads of the
// GQA group: row r is new token first_token + r / group, query head
// kv_head * group + r % group, so every K/V tile loaded into shared memory
// serves the whole group. 8 warps own 16 rows each. K/V tiles are gathered
// through the block table with 16-byte cp.async (zero-filled past the end)
// into a double buffer with an XOR swizzle that keeps ldmatrix conflict-free.
// Causal masking is applied only on tiles that reach past the first row's
// position. At head_dim 128 the plan picks the wgmma kernels of
// prefill_attention_sm90.cu instead; this one serves the other head dims, and
// head_dim 128 for comparisons (AttentionPlanOptions::portable_prefill).

#include <cuda_bf16.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/attention_launch_internal.h"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

constexpr int kRows = 128;  // query rows per CTA (8 warps x 16)
constexpr int kKeys = 64;   // KV positions per tile
constexpr int kWarps = kRows / 16;
constexpr int kThreads = kWarps * 32;

template <int kHeadDim>
struct PrefillShape {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kQChunks = kRows * kChunks;
  static constexpr int kKvChunks = kKeys * kChunks;
  static constexpr int kSmemBytes = (kQChunks + 4 * kKvChunks) * 16;  // Q + 2 stages of K and V
};

// Swizzled position of (row, 16-byte chunk) in a tile with kChunks chunks per row.
template <int kChunks>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kChunks + (chunk ^ (row & 7));
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_kernel(const AttentionDescriptor d, const __nv_bfloat16* __restrict__ q,
                             __nv_bfloat16* __restrict__ out) {
  using P = PrefillShape<kHeadDim>;
  constexpr int kC = P::kChunks;
  extern __shared__ uint4 smem[];
  uint4* q_tile = smem;
  uint4* kv_tiles = smem + P::kQChunks;  // stage s: K at s * 2 * kKvChunks, V after it

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int kv_head = blockIdx.x;
  const int sequence = d.work_items[2 * blockIdx.y];
  const int first_token = d.work_items[2 * blockIdx.y + 1];
  const int group = d.num_q_heads / d.num_kv_heads;
  const int rows_used = d.tokens_per_tile * group;
  const int query_row0 = d.query_start[sequence];
  const int num_new = d.query_start[sequence + 1] - query_row0;
  const int kv_length = d.kv_length[sequence];
  const int num_cached = kv_length - num_new;
  const int token_end = min(first_token + d.tokens_per_tile, num_new);
  const int num_keys = num_cached + token_end;  // positions any row of this tile sees
  const int num_tiles = (num_keys + kKeys - 1) / kKeys;
  const int32_t* table = d.block_tables + d.block_table_start[sequence];
  const auto* key = static_cast<const __nv_bfloat16*>(d.key);
  const auto* value = static_cast<const __nv_bfloat16*>(d.value);
  const int64_t head_offset = int64_t{kv_head} * kHeadDim;

  // Query rows -> shared memory (zero rows past the end of the tile).
  for (int idx = tid; idx < P::kQChunks; idx += kThreads) {
    const int r = idx / kC, c = idx % kC;
    const int t = first_token + r / group;
    const bool valid = r < rows_used && t < num_new;
    const int head = kv_head * group + r % group;
    const __nv_bfloat16* src =
        valid ? q + (int64_t{query_row0 + t} * d.num_q_heads + head) * kHeadDim + c * 8 : q;
    cp_async_16(q_tile + swizzle<kC>(r, c), src, valid);
  }
  auto issue_kv_tile = [&](int tile) {
    uint4* k_dst = kv_tiles + (tile & 1) * 2 * P::kKvChunks;
    uint4* v_dst = k_dst + P::kKvChunks;
#pragma unroll
    for (int i = 0; i < P::kKvChunks / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int r = idx / kC, c = idx % kC;
      const int pos = tile * kKeys + r;
      const bool valid = pos < num_keys;
      const int block = valid ? table[pos >> d.log2_block_size] : 0;
      const int64_t offset = int64_t{block} * d.block_stride +
                             int64_t{pos & (d.block_size - 1)} * d.token_stride + head_offset +
                             c * 8;
      cp_async_16(k_dst + swizzle<kC>(r, c), key + offset, valid);
      cp_async_16(v_dst + swizzle<kC>(r, c), value + offset, valid);
    }
  };
  issue_kv_tile(0);
  cp_async_commit();

  // This thread's two rows (lane / 4 and lane / 4 + 8 of the warp's 16) and their positions.
  int row_pos[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + lane / 4 + 8 * i;
    const int t = first_token + r / group;
    row_valid[i] = r < rows_used && t < num_new;
    row_pos[i] = num_cached + (row_valid[i] ? t : first_token);  // invalid rows: finite, unstored
  }
  const int min_row_pos = num_cached + first_token;

  uint32_t q_frag[kHeadDim / 16][4];
  float o[kHeadDim / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  const int ld_row = lane % 8;
  const int ld_matrix = lane / 8;

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<0>();
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int kc = 0; kc < kHeadDim / 16; ++kc) {
        const int r = warp * 16 + ld_row + (ld_matrix & 1) * 8;
        ldmatrix_x4(q_frag[kc], q_tile + swizzle<kC>(r, 2 * kc + (ld_matrix >> 1)));
      }
    }
    if (tile + 1 < num_tiles) issue_kv_tile(tile + 1);
    cp_async_commit();
    const uint4* k_tile = kv_tiles + (tile & 1) * 2 * P::kKvChunks;
    const uint4* v_tile = k_tile + P::kKvChunks;

    // S = Q K^T for 16 rows x 64 keys.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kHeadDim / 16; ++kc) {
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        const int r = 16 * np + ld_row + (ld_matrix >> 1) * 8;
        ldmatrix_x4(b, k_tile + swizzle<kC>(r, 2 * kc + (ld_matrix & 1)));
        mma_bf16_16816(s[2 * np], q_frag[kc], b[0], b[1]);
        mma_bf16_16816(s[2 * np + 1], q_frag[kc], b[2], b[3]);
      }
    }

    // Causal mask (and the end of the sequence) on the tiles that need it.
    if ((tile + 1) * kKeys - 1 > min_row_pos) {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = tile * kKeys + n * 8 + (lane % 4) * 2 + (e & 1);
          if (pos > row_pos[e >> 1]) s[n][e] = -INFINITY;
        }
      }
    }

    // Online softmax (log2 domain); every row has position 0 in tile 0, so m is finite after it.
    uint32_t p_frag[kKeys / 16][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
        tile_max = fmaxf(tile_max, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m[i], tile_max * d.scale_log2);
      const float correction = exp2f(m[i] - m_new);
      m[i] = m_new;
      l[i] *= correction;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        o[n][2 * i] *= correction;
        o[n][2 * i + 1] *= correction;
      }
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        s[n][2 * i] = exp2f(fmaf(s[n][2 * i], d.scale_log2, -m_new));
        s[n][2 * i + 1] = exp2f(fmaf(s[n][2 * i + 1], d.scale_log2, -m_new));
        l[i] += s[n][2 * i] + s[n][2 * i + 1];
      }
    }
    // The accumulator layout of two adjacent n-tiles is the A layout of one k-step.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      p_frag[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      p_frag[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      p_frag[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      p_frag[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];
        const int r = 16 * kk + ld_row + (ld_matrix & 1) * 8;
        ldmatrix_x4_trans(b, v_tile + swizzle<kC>(r, 2 * dp + (ld_matrix >> 1)));
        mma_bf16_16816(o[2 * dp], p_frag[kk], b[0], b[1]);
        mma_bf16_16816(o[2 * dp + 1], p_frag[kk], b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!row_valid[i]) continue;
    const int r = warp * 16 + lane / 4 + 8 * i;
    const int t = first_token + r / group;
    const int head = kv_head * group + r % group;
    __nv_bfloat16* dst = out + (int64_t{query_row0 + t} * d.num_q_heads + head) * kHeadDim;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      const uint32_t packed = pack_bf16x2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
      *reinterpret_cast<uint32_t*>(dst + n * 8 + (lane % 4) * 2) = packed;
    }
  }
}

template <int kHeadDim>
cudaError_t launch_prefill_for_dim(const AttentionDescriptor& d, const __nv_bfloat16* q,
                                   __nv_bfloat16* out, cudaStream_t stream) {
  constexpr int smem_bytes = PrefillShape<kHeadDim>::kSmemBytes;
  auto* kernel = prefill_attention_kernel<kHeadDim>;
  // Once per process (normally before any graph capture: see prepare_paged_attention_kernels).
  static const cudaError_t prepared =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (prepared != cudaSuccess) return prepared;
  if (d.num_work_items == 0) return cudaSuccess;
  kernel<<<dim3(d.num_kv_heads, d.num_work_items), kThreads, smem_bytes, stream>>>(d, q, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_prefill_attention() {
  AttentionDescriptor empty;  // zero work items: sets the attribute, enqueues nothing
  for (int head_dim : {64, 128}) {
    empty.head_dim = head_dim;
    const cudaError_t err = launch_prefill_attention(empty, nullptr, nullptr, nullptr);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_prefill_attention(const AttentionDescriptor& d, const void* q, void* out,
                                     cudaStream_t stream) {
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  switch (d.head_dim) {
    case 64: return launch_prefill_for_dim<64>(d, qb, ob, stream);
    case 128: return launch_prefill_for_dim<128>(d, qb, ob, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace pagoda::kernels::cuda
