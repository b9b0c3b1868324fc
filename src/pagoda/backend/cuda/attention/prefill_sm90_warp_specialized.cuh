#pragma once
// v4 of the Hopper prefill kernel (docs/KERNELS.md, "Prefill"): the same
// contract and work list as the v2.1 kernel in prefill_attention_sm90.cu (128
// query rows = new tokens x the query heads of one GQA group per CTA,
// head_dim 128, K/V tiles of 128 positions in the 128-byte swizzle; V stored
// page by page), scheduled the FlashAttention-3 way:
//   - warpgroup 0 is a producer: its first warp gathers K and V tiles through
//     the block table with the copy engine (TMA boxes already in the wgmma
//     swizzle: per page, one per half of head_dim for K, one for V) into a
//     3-stage ring; each stage's "K full" / "V full" mbarrier completes when
//     its bytes have landed. setmaxnreg leaves the producer 24 registers;
//   - warpgroups 1 and 2 are consumers of 64 rows each with 240 registers.
//     Per tile t: S(t) = Q K(t)^T and O += P(t-1) V(t-1) are issued back to
//     back, softmax of S(t) runs while P(t-1) V(t-1) is still on the tensor
//     cores, then O is rescaled and P(t) packed to bf16 registers; each
//     consumer releases a stage ("empty") once its P V read it;
//   - with kPingPong, named barriers make the two consumers take turns issuing
//     their GEMMs, so one warpgroup's softmax runs under the other's GEMMs;
//   - lazy rescale: a warp moves its rows' running maxima (and rescales O and
//     the sums) only when some row's maximum grew by more than
//     kRescaleThreshold (log2 units) since it last moved; otherwise the tile's
//     probabilities are taken against the stale maximum (at most 2^8: bf16 P
//     and the f32 sums hold that as well) and the 64 multiplies of O and the
//     correction's exp2 are skipped. The result is the same softmax: O and l
//     always share one maximum. In a causal prefill most tiles past the first
//     few do not move the maximum, so most skip the rescale (docs/KERNELS.md,
//     "Lazy O rescale", has the gain).
// Shapes and units as in attention_descriptor.h. Device code; include from
// prefill_attention_sm90.cu only.

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct; no driver call here)
#include <cuda_bf16.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/prefill_sm90_sync.cuh"
#include "pagoda/backend/cuda/attention/wgmma_primitives.cuh"

namespace pagoda::kernels::cuda::prefill_ws {

using namespace device;

constexpr int kHeadDim = 128;
constexpr int kKeys = 128;  // KV positions per tile
constexpr int kConsumerThreads = 256;  // 2 warpgroups x 64 query rows
constexpr int kThreads = 128 + kConsumerThreads;
constexpr int kStages = 3;
constexpr int kHalfBytes = 128 * 128;  // one 64-element half of head_dim for 128 rows
constexpr int kTileBytes = 2 * kHalfBytes;
// Q, then kStages x (K, V), plus slack to align the base to 1024 bytes (224 KB + 1 KB).
constexpr int kSmemBytes = kTileBytes + kStages * 2 * kTileBytes + 1024;
// 128 x 24 + 256 x 240 = 64,512 of the SM's 65,536 registers.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
// Named barriers (0 is __syncthreads): 1 + c = consumer c's turn on the tensor
// cores; 3 + c = consumer c's Q rows have landed; 5: both consumers zeroed the
// last tile's V rows past the end.
constexpr int kTurnBarrier = 1;
constexpr int kQueryBarrier = 3;
constexpr int kZeroedBarrier = 5;
// How far (log2 units) a row's maximum may outgrow the one its O and l are kept against.
constexpr float kRescaleThreshold = 8.0f;

// Byte offset of (row, 16-byte chunk 0..15 of head_dim) in a swizzled 128-row tile.
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return (chunk >> 3) * kHalfBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// Byte offset of (row, 16-byte chunk) in a swizzled V tile, stored page by page
// ([page][half][block_size rows][64]), block_size = 1 << log2_block_size.
__device__ __forceinline__ uint32_t value_offset(int row, int chunk, int log2_block_size) {
  const int page = row >> log2_block_size, slot = row & ((1 << log2_block_size) - 1);
  return ((page * 2 + (chunk >> 3)) << (log2_block_size + 7)) + slot * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// The compiler sees a wgmma's accumulators as written when it is issued; this
// pins every later use of them after the wgmma_wait that precedes this call.
__device__ __forceinline__ void keep_in_order(float (&r)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// key_map: the K pool as a [positions][num_kv_heads][128] bf16 tensor, boxes of
// 64 x 1 x block_size; value_map: the V pool as [num_kv_heads][2 halves]
// [positions][64], boxes of 64 x block_size x 2 x 1 (make_key_tensor_map /
// make_value_tensor_map in prefill_attention_sm90.cu); both in the 128-byte
// swizzle; block_size 16..64.
template <bool kPingPong>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_sm90_ws_kernel(const AttentionDescriptor d, const __grid_constant__ CUtensorMap key_map,
                                     const __grid_constant__ CUtensorMap value_map,
                                     const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The portable compute_90 PTX has no wgmma / setmaxnreg: sm_90a machine code only.
  __trap();
#else
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full_k[kStages], full_v[kStages], empty[kStages];
  const uint32_t raw_addr = smem_address(smem_raw);
  uint8_t* base = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);  // wgmma: 1024-byte swizzle atoms
  uint8_t* q_tile = base;
  uint8_t* kv_tiles = base + kTileBytes;  // stage s: K at s * 2 * kTileBytes, V after it

  const int tid = threadIdx.x;
  const int kv_head = blockIdx.x;
  const int sequence = d.work_items[2 * blockIdx.y];
  const int first_token = d.work_items[2 * blockIdx.y + 1];
  const int group = d.num_q_heads / d.num_kv_heads;
  const int query_row0 = d.query_start[sequence];
  const int num_new = d.query_start[sequence + 1] - query_row0;
  const int num_cached = d.kv_length[sequence] - num_new;
  const int token_end = min(first_token + d.tokens_per_tile, num_new);
  const int num_keys = num_cached + token_end;
  const int num_tiles = (num_keys + kKeys - 1) / kKeys;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full_k[s], 1);  // the producer's arrive + the copies' bytes
      mbarrier_init(&full_v[s], 1);
      mbarrier_init(&empty[s], kConsumerThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    // ---- Producer warpgroup: its first warp issues every copy; no tensor-core work.
    setmaxnreg_dec<kProducerRegisters>();
    if (tid >= 32) return;
    const int32_t* table = d.block_tables + d.block_table_start[sequence];
    // A K box is one page of one KV head and one 64-element half of head_dim
    // (tile_offset's layout); a V box is one page with both halves, stored
    // page by page (value_offset's layout), which the P V descriptors can
    // walk, so a tile of 16-position pages takes 16 K and 8 V boxes. Lanes
    // 0..15 issue the K boxes (page lane / 2, half lane % 2), lanes 16..23 the
    // V boxes (page lane - 16), side by side: one table-load latency per tile.
    const int box_rows = d.block_size;  // 16..64 (the launch's rule): at most 8 pages per tile
    const int lane = tid;
    const bool copies_value = lane >= 16;
    const int page = copies_value ? lane - 16 : lane >> 1;
    const int upper = lane & 1;
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = tile % kStages;
      const int first = tile * kKeys;
      const int boxes = (min(first + kKeys, num_keys) - first + box_rows - 1) / box_rows;
      const bool active = page < boxes;
      // Table entries first: their latency overlaps the wait for the stage.
      const int token = active ? __ldg(table + ((first >> d.log2_block_size) + page)) * d.block_size : 0;
      // The stage last held tile - kStages: wait until both consumers are done with it.
      if (tile >= kStages) mbarrier_wait(&empty[stage], (tile / kStages - 1) & 1);
      uint8_t* k_dst = kv_tiles + stage * 2 * kTileBytes;
      // Rows of the last tile past the sequence end hold whatever the pool or an
      // earlier tile left there: K is masked, V is zeroed by the consumers.
      if (lane == 0) {
        const uint32_t bytes = boxes * box_rows * 128 * 2;
        mbarrier_arrive_expect_tx(&full_k[stage], bytes);
        mbarrier_arrive_expect_tx(&full_v[stage], bytes);
      }
      __syncwarp();
      if (active && copies_value)
        tma_load_4d(k_dst + kTileBytes + page * box_rows * 256, &value_map, 0, token, 0, kv_head, &full_v[stage]);
      else if (active)
        tma_load_3d(k_dst + upper * kHalfBytes + page * box_rows * 128, &key_map, upper * 64, kv_head, token,
                    &full_k[stage]);
    }
    return;
  }

  // ---- Consumer warpgroups: 64 query rows each.
  setmaxnreg_inc<kConsumerRegisters>();
  const int ctid = tid - 128;
  const int consumer = ctid >> 7;  // rows 64 * consumer ..
  const int warp = ctid >> 5;      // rows 16 * warp .. (0..7)
  const int lane = tid & 31;
  const int rows_used = d.tokens_per_tile * group;

  for (int idx = ctid & 127; idx < 64 * 16; idx += 128) {
    const int r = consumer * 64 + (idx >> 4), c = idx & 15;
    const int t = first_token + r / group;
    const bool valid = r < rows_used && t < num_new;
    const int head = kv_head * group + r % group;
    const __nv_bfloat16* src =
        valid ? q + (int64_t{query_row0 + t} * d.num_q_heads + head) * kHeadDim + c * 8 : q;
    cp_async_16(q_tile + tile_offset(r, c), src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  named_barrier_sync(kQueryBarrier + consumer, 128);

  // This thread's two rows (of the CTA's 128) and their positions.
  int row_pos[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + (lane >> 2) + 8 * i;
    const int t = first_token + r / group;
    row_valid[i] = r < rows_used && t < num_new;
    row_pos[i] = num_cached + (row_valid[i] ? t : first_token);
  }
  // No valid row of this warpgroup sits before this position: tiles that end
  // at or before it need no causal mask (rows past the end read zero K/V).
  const int min_row_pos = num_cached + first_token + (64 * consumer) / group;

  float o[64], s[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = s[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float correction[2];
  bool rescale = true;  // whether this tile moved the warp's maxima (warp-uniform)
  uint32_t p[kKeys / 16][4];
  const uint32_t q_addr = smem_address(q_tile) + consumer * 64 * 128;
  const uint32_t kv_addr = smem_address(kv_tiles);

  // S = Q K^T: 64 rows x 128 keys, K-major operands, 16 of head_dim per step.
  auto issue_s = [&](int stage) {
    const uint32_t k_addr = kv_addr + stage * 2 * kTileBytes;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t step = (ks >> 2) * kHalfBytes + (ks & 3) * 32;
      wgmma_m64n128k16_ss(s, make_smem_desc_sw128(q_addr + step, 16, 1024),
                          make_smem_desc_sw128(k_addr + step, 16, 1024), ks > 0);
    }
  };
  // O += P V: V is MN-major for this product, stored page by page: the 16
  // positions of k-step kk are rows of one page (block_size >= 16), its
  // 8-position groups 1024 B apart, its two head_dim halves a page half apart.
  const uint32_t value_half_bytes = 128u << d.log2_block_size;
  auto issue_pv = [&](int stage) {
    const uint32_t v_addr = kv_addr + stage * 2 * kTileBytes + kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_m64n128k16_rs_transb(o, p[kk], make_smem_desc_sw128(v_addr + value_offset(16 * kk, 0, d.log2_block_size),
                                                                value_half_bytes, 1024),
                                 1);
  };
  // Online softmax of S(tile) in place (S becomes exp2 of the scaled scores);
  // correction = how much this tile's new row maxima shrink the old sums.
  auto softmax = [&](int tile) {
    if ((tile + 1) * kKeys - 1 > min_row_pos) {
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = tile * kKeys + j * 8 + (lane & 3) * 2 + (e & 1);
          if (pos > row_pos[e >> 1]) s[4 * j + e] = -INFINITY;
        }
      }
    }
    float m_new[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
        tile_max = fmaxf(tile_max, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // Tile 0 holds position 0 <= every row's position, so m is finite from then on.
      m_new[i] = fmaxf(m[i], tile_max * d.scale_log2);
    }
    // Tile 0 always moves (m is -inf before it).
    rescale = __any_sync(0xffffffffu, m_new[0] - m[0] > kRescaleThreshold || m_new[1] - m[1] > kRescaleThreshold);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (rescale) {
        correction[i] = exp2f(m[i] - m_new[i]);
        m[i] = m_new[i];
      }
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
        s[4 * j + 2 * i] = exp2f(fmaf(s[4 * j + 2 * i], d.scale_log2, -m[i]));
        s[4 * j + 2 * i + 1] = exp2f(fmaf(s[4 * j + 2 * i + 1], d.scale_log2, -m[i]));
        sum += s[4 * j + 2 * i] + s[4 * j + 2 * i + 1];
      }
      l[i] = rescale ? l[i] * correction[i] + sum : l[i] + sum;
    }
  };
  // The accumulator layout of two adjacent 8-key blocks is the A fragment of one k-step.
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      p[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  const int my_turn = kTurnBarrier + consumer, other_turn = kTurnBarrier + 1 - consumer;
  // Every consumer takes num_tiles + 1 turns (tile 0's S, then one per tile
  // after it, then the last P V); consumer 1 lets consumer 0 go first and skips
  // its last hand-over, so no arrival is left pending at exit.
  if (kPingPong && consumer == 1) named_barrier_arrive(kTurnBarrier, kConsumerThreads);

  mbarrier_wait(&full_k[0], 0);
  if (kPingPong) named_barrier_sync(my_turn, kConsumerThreads);
  wgmma_fence();
  issue_s(0);
  wgmma_commit();
  if (kPingPong) named_barrier_arrive(other_turn, kConsumerThreads);
  wgmma_wait<0>();
  keep_in_order(s);
  softmax(0);
  pack_p();

  const int last = num_tiles - 1;
  for (int tile = 1; tile <= last; ++tile) {
    const int stage = tile % kStages, prev = (tile - 1) % kStages;
    mbarrier_wait(&full_k[stage], (tile / kStages) & 1);
    mbarrier_wait(&full_v[prev], ((tile - 1) / kStages) & 1);  // landed long ago, as a rule
    if (kPingPong) named_barrier_sync(my_turn, kConsumerThreads);
    wgmma_fence();
    issue_s(stage);
    wgmma_commit();
    issue_pv(prev);
    wgmma_commit();
    if (kPingPong) named_barrier_arrive(other_turn, kConsumerThreads);
    wgmma_wait<1>();  // S(tile) is in; P(tile - 1) V(tile - 1) may still run
    keep_in_order(s);
    softmax(tile);
    wgmma_wait<0>();
    keep_in_order(o);
    mbarrier_arrive(&empty[prev]);
    if (rescale) {
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[4 * j + e] *= correction[e >> 1];
      }
    }
    pack_p();
  }
  mbarrier_wait(&full_v[last % kStages], (last / kStages) & 1);
  const int last_rows = num_keys - last * kKeys;
  if (last_rows < kKeys) {
    // P is 0 there, but 0 x NaN is not: zero V past the end (once per CTA).
    uint8_t* v_tile = kv_tiles + (last % kStages) * 2 * kTileBytes + kTileBytes;
    for (int idx = ctid; idx < (kKeys - last_rows) * 16; idx += kConsumerThreads)
      *reinterpret_cast<uint4*>(v_tile + value_offset(last_rows + (idx >> 4), idx & 15, d.log2_block_size)) =
          make_uint4(0, 0, 0, 0);
    fence_proxy_async_shared();  // generic-proxy stores, read next by wgmma
    named_barrier_sync(kZeroedBarrier, kConsumerThreads);
  }
  if (kPingPong) named_barrier_sync(my_turn, kConsumerThreads);
  wgmma_fence();
  issue_pv(last % kStages);
  wgmma_commit();
  if (kPingPong && consumer == 0) named_barrier_arrive(other_turn, kConsumerThreads);
  wgmma_wait<0>();
  keep_in_order(o);

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!row_valid[i]) continue;
    const int r = warp * 16 + (lane >> 2) + 8 * i;
    const int t = first_token + r / group;
    const int head = kv_head * group + r % group;
    __nv_bfloat16* dst = out + (int64_t{query_row0 + t} * d.num_q_heads + head) * kHeadDim;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const uint32_t packed = pack_bf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      *reinterpret_cast<uint32_t*>(dst + j * 8 + (lane & 3) * 2) = packed;
    }
  }
#endif
}

}  // namespace pagoda::kernels::cuda::prefill_ws
