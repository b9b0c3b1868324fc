#pragma once
// The per-tile math of the narrow (at most 16 heads) bf16-tile MLA decode
// kernels, shared by the cp.async kernel (mla_decode.cu,
// mla_decode_narrow_kernel) and the TMA-fed kernels (mla_decode_tma.cu); they
// differ only in who loads the latent tiles and how a tile's column blocks are
// found and waited for, which the callers pass in.
//
// A CTA's 256 compute threads are two warpgroups. Per tile of 64 positions:
//   S^T = K Q^T      64 positions x 16 heads (wgmma m64n16k16, K from the tile,
//                    Q K-major), warpgroup g summing over the K dims
//                    [288 g, 288 g + 288); the halves are swapped through shared
//                    memory so both groups hold all of S^T;
//   softmax          per head = per column of S^T, online over the tiles; the
//                    column maxima go through the group's 4 warps in shared
//                    memory; each thread's 4 heads are the same 4 columns in S^T
//                    and O^T, so the rescaling needs no shuffle; P^T is written
//                    bf16 into the group's own [16 heads][64 positions] tile;
//   O^T += V^T P^T   group g owns latent dims [256 g, 256 g + 256) = 4 m-tiles
//                    of 64 (column blocks 4 g .. 4 g + 3 of the tile, read
//                    MN-major).
// Every column block is 64 rows x 128 B, 128-byte swizzled (16-byte chunk c of
// row r at c ^ (r % 8)), 1,024-byte aligned.
//
// Device-only helpers (no state); callable from sm_90a code only.

#include <cuda_bf16.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"
#include "pagoda/backend/cuda/attention/wgmma_primitives.cuh"

namespace pagoda::kernels::cuda::mla_narrow {

using namespace device;

constexpr int kHeads = 16;
constexpr int kTile = 64;
constexpr int kComputeThreads = 256;
constexpr int kBlockBytes = kTile * 128;        // one column block of a tile
constexpr int kQBlockBytes = kHeads * 128;      // one column block of Q
constexpr int kKeyChunks = kMlaKeyDim / 8;      // 72 16-byte chunks a vector
constexpr float kNoScore = -1e30f;

__device__ __forceinline__ void keep_in_order(float& r) { asm volatile("" : "+f"(r)::"memory"); }

__device__ __forceinline__ void group_barrier(int warpgroup) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + warpgroup), "r"(128) : "memory");
}

// d[8] (+)= A * B for m64n16k16; kTransA: A MN-major (transposed), else K-major; B K-major.
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA));
}

// A compute thread's place: its accumulator rows (positions of S^T, dims of
// O^T within an m-tile) row0 and row0 + 8, and its 4 heads h(j, e) = 8 j + col
// + e (index 2 j + e).
struct ThreadPlace {
  int tid, lane, warpgroup, wg_warp, row0, col;
};

__device__ __forceinline__ ThreadPlace thread_place(int tid) {
  const int lane = tid & 31;
  return {tid, lane, tid >> 7, (tid >> 5) & 3, ((tid >> 5) & 3) * 16 + (lane >> 2), 2 * (lane & 3)};
}

// The online-softmax state of a segment: O^T accumulators (kMTiles m-tiles of
// 64 latent dims: 4 when a group owns half of the dims, 8 when it owns all of
// them, the ping-pong kernel), running maxima and sums.
template <int kMTiles>
struct SegmentStateOf {
  float o[kMTiles][8];
  float m[4];
  float l[4];
};
using SegmentState = SegmentStateOf<4>;

template <int kMTiles>
__device__ __forceinline__ void reset(SegmentStateOf<kMTiles>& st) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int i = 0; i < 8; ++i) st.o[mi][i] = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    st.m[k] = kNoScore;
    st.l[k] = 0.0f;
  }
}

// Issues (cp.async, not committed) the copy of row `row`'s Q into q_tile: 16
// rows x 72 chunks in column blocks of 16 rows, rows past num_heads zero.
__device__ __forceinline__ void issue_q(uint8_t* q_tile, const __nv_bfloat16* q, int row, int num_heads, int tid) {
  const int heads_here = min(kHeads, num_heads);
  const __nv_bfloat16* q_row = q + int64_t{row} * num_heads * kMlaKeyDim;
  for (int idx = tid; idx < kHeads * kKeyChunks; idx += kComputeThreads) {
    const int r = idx / kKeyChunks, c = idx % kKeyChunks;
    const bool valid = r < heads_here;
    cp_async_16(q_tile + (c >> 3) * kQBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4),
                        valid ? q_row + r * kMlaKeyDim + c * 8 : q, valid);
  }
}

// This group's half of S^T (K dims [288 g, 288 g + 288)), waited for on the
// MMAs. block_addr(c): shared address of the tile's column block c;
// wait_block(c): called before the first MMA on column block c (at compile-time
// steps), for loaders that signal column blocks separately (a no-op otherwise).
template <class BlockAddr, class WaitBlock>
__device__ __forceinline__ void s_half(float (&s)[8], const ThreadPlace& t, uint32_t q_addr, BlockAddr block_addr,
                                       WaitBlock wait_block) {
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kMlaKeyDim / 32; ++step) {
    const int ks = t.warpgroup * (kMlaKeyDim / 32) + step;
    // Group 0 enters a column block at steps 0, 4, ..., 16, group 1 (ks 18 +
    // step) at 0, 2, 6, ..., 14: every even step waits (at most once more on a
    // landed block). A fence after each wait keeps the compiler from
    // serializing the MMAs around the wait loop.
    if ((step & 1) == 0 && wait_block(ks >> 2)) wgmma_fence();
    wgmma_m64n16k16<0>(s, make_smem_desc_sw128(block_addr(ks >> 2) + (ks & 3) * 32, 16, 1024),
                       make_smem_desc_sw128(q_addr + (ks >> 2) * kQBlockBytes + (ks & 3) * 32, 16, 1024), step > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 8; ++i) keep_in_order(s[i]);
}

// Adds the other group's half of S^T through `partial` (256 threads x 8 floats):
// writes this thread's, calls consumers_barrier() (both groups), reads the other's.
template <class Barrier>
__device__ __forceinline__ void add_other_half(float (&s)[8], uint8_t* partial, int tid, Barrier consumers_barrier) {
  float4* mine = reinterpret_cast<float4*>(partial) + 2 * tid;
  const float4* other = reinterpret_cast<const float4*>(partial) + 2 * (tid ^ 128);
  mine[0] = make_float4(s[0], s[1], s[2], s[3]);
  mine[1] = make_float4(s[4], s[5], s[6], s[7]);
  consumers_barrier();
  const float4 a = other[0], b = other[1];
  s[0] += a.x; s[1] += a.y; s[2] += a.z; s[3] += a.w;
  s[4] += b.x; s[5] += b.y; s[6] += b.z; s[7] += b.w;
}

// exp2 as one MUFU.EX2 (flushes subnormal results to zero; exp2f adds a range
// fix-up around it).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Softmax of one tile: rows at or past valid_rows are masked; pos_scale[i]
// scales row row0 + 8 i's scores and P (fp8 per-vector scales; 1 otherwise);
// col_max: this group's [4 warps][16] floats; p_tile: this group's P^T. Ends
// with this group's P^T complete and visible to its MMAs. kFastExp (bf16
// tiles only: pos_scale must be 1): the maxima are taken over the raw scores
// (the scale is positive), each exponent is one FFMA, s x scale_log2 - m, and
// exp2 is exp2_ftz; other roundings than the default path.
template <bool kFastExp = false, int kMTiles>
__device__ __forceinline__ void softmax_tile(float (&s)[8], SegmentStateOf<kMTiles>& st, const ThreadPlace& t,
                                             int valid_rows, const float (&pos_scale)[2], float scale_log2,
                                             float* col_max, uint8_t* p_tile) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool valid = t.row0 + 8 * i < valid_rows;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[4 * j + 2 * i + e];
        if constexpr (kFastExp) v = valid ? v : kNoScore;
        else v = valid ? v * pos_scale[i] * scale_log2 : kNoScore;
      }
  }
  // Column maxima: this warp's 16 positions, then the group's 4 warps.
  float mx[4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
      mx[2 * j + e] = v;
    }
  if (t.lane < 4) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) col_max[t.wg_warp * kHeads + 8 * j + t.col + e] = mx[2 * j + e];
  }
  group_barrier(t.warpgroup);
  float p_out[2][2][2];  // [j][i][e]: P at position row0 + 8 i, head 8 j + col + e
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + t.col + e;
      float tile_max =
          fmaxf(fmaxf(col_max[h], col_max[kHeads + h]), fmaxf(col_max[2 * kHeads + h], col_max[3 * kHeads + h]));
      if constexpr (kFastExp) tile_max *= scale_log2;
      const int k = 2 * j + e;
      const float m_new = fmaxf(st.m[k], tile_max);
      const float correction = kFastExp ? exp2_ftz(st.m[k] - m_new) : exp2f(st.m[k] - m_new);
      st.m[k] = m_new;
      st.l[k] *= correction;
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        st.o[mi][4 * j + e] *= correction;
        st.o[mi][4 * j + 2 + e] *= correction;
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float p = kFastExp ? exp2_ftz(fmaf(s[4 * j + 2 * i + e], scale_log2, -m_new))
                                 : exp2f(s[4 * j + 2 * i + e] - m_new);
        st.l[k] += p;
        p_out[j][i][e] = kFastExp ? p : p * pos_scale[i];
      }
    }
  // P^T[h][r]: row h of 128 B, 16-byte chunk r / 8 swizzled (128B), bf16 r % 8. This warp's P is four 8x8
  // accumulator fragments, matrix m = 2 j + i (heads 8 j.., positions 16 wg_warp + 8 i..); stored
  // transposed, each matrix row is one head's 8 positions: one swizzled 16-byte chunk, whose address
  // lane 8 m + c gives (head 8 j + c).
  uint32_t packed[4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) packed[2 * j + i] = pack_bf16x2(p_out[j][i][0], p_out[j][i][1]);
  {
    const int m = t.lane >> 3;
    const int h = 8 * (m >> 1) + (t.lane & 7);
    const int chunk = 2 * t.wg_warp + (m & 1);
    stmatrix_x4_trans(packed, p_tile + h * 128 + ((chunk ^ (h & 7)) << 4));
  }
  fence_proxy_async_shared();
  group_barrier(t.warpgroup);  // this group's P^T is complete (and its maxima read)
}

// O^T[dims of m-tile mi] += V^T P^T over this group's column blocks
// 4 g .. 4 g + 3 (block_addr(c) as for s_half), waited for on the MMAs.
template <class BlockAddr>
__device__ __forceinline__ void pv(SegmentState& st, const ThreadPlace& t, uint32_t p_addr, BlockAddr block_addr) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int i = 0; i < 8; ++i) keep_in_order(st.o[mi][i]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const uint64_t desc_p = make_smem_desc_sw128(p_addr + kk * 32, 16, 1024);
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const uint32_t v_addr = block_addr(t.warpgroup * 4 + mi) + kk * 16 * 128;
      wgmma_m64n16k16<1>(st.o[mi], make_smem_desc_sw128(v_addr, kBlockBytes, 1024), desc_p, 1);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int i = 0; i < 8; ++i) keep_in_order(st.o[mi][i]);
}

// The end of a segment, first step: each warp's sums reduced over its lanes
// into col_sum[warp][16] (this group's [4 warps][16] floats), then the group
// barrier, after which head_sum reads the totals.
template <int kMTiles>
__device__ __forceinline__ void reduce_group_sums(SegmentStateOf<kMTiles>& st, const ThreadPlace& t, float* col_sum) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    st.l[k] += __shfl_xor_sync(0xffffffffu, st.l[k], 4);
    st.l[k] += __shfl_xor_sync(0xffffffffu, st.l[k], 8);
    st.l[k] += __shfl_xor_sync(0xffffffffu, st.l[k], 16);
  }
  if (t.lane < 4) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) col_sum[t.wg_warp * kHeads + 8 * j + t.col + e] = st.l[2 * j + e];
  }
  group_barrier(t.warpgroup);
}

// Head h's sum over the group's 4 warps (after reduce_group_sums).
__device__ __forceinline__ float head_sum(const float* col_sum, int h) {
  return col_sum[h] + col_sum[kHeads + h] + col_sum[2 * kHeads + h] + col_sum[3 * kHeads + h];
}

// Both steps, for this thread's 4 heads (index 2 j + e) into sum.
template <int kMTiles>
__device__ __forceinline__ void group_head_sums(SegmentStateOf<kMTiles>& st, const ThreadPlace& t, float* col_sum,
                                                float (&sum)[4]) {
  reduce_group_sums(st, t, col_sum);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) sum[2 * j + e] = head_sum(col_sum, 8 * j + t.col + e);
}

// The end of segment `seg` of row `row`: column sums over the group (through
// col_sum, this group's [4 warps][16] floats), then O / sum to out (bf16) when
// the row has one segment, else O / sum and the base-2 log-sum-exp to the
// split-K workspace for the merge pass.
__device__ __forceinline__ void finish_segment(const MlaDecodeDescriptor& d, SegmentState& st, const ThreadPlace& t,
                                               int seg, int row, float* col_sum, __nv_bfloat16* __restrict__ out) {
  reduce_group_sums(st, t, col_sum);
  const int heads_here = min(kHeads, d.num_heads);
  const bool split = d.row_segment_start[row + 1] - d.row_segment_start[row] > 1;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + t.col + e;
      if (h >= heads_here) continue;
      const float sum = head_sum(col_sum, h);
      const float inv = 1.0f / sum;
      const int64_t at = (split ? int64_t{seg} : int64_t{row}) * d.num_heads + h;
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int dim = t.warpgroup * 256 + mi * 64 + t.row0 + 8 * i;
          const float v = st.o[mi][4 * j + 2 * i + e] * inv;
          if (!split) out[at * kMlaLatentDim + dim] = __float2bfloat16(v);
          else d.workspace[at * kMlaLatentDim + dim] = v;
        }
      if (split && t.warpgroup == 0 && t.lane < 4 && t.wg_warp == 0) {
        float* lse = d.workspace + int64_t{d.num_segments} * d.num_heads * kMlaLatentDim;
        lse[at] = st.m[2 * j + e] + log2f(sum);
      }
    }
}

// The ping-pong kernels' hand-over (a group owns all 8 m-tiles of O^T; group
// 1 hands its state to group 0 at a segment's end). Group 1's side: its
// maxima and sums per head (the same in every thread of the group for a head:
// warp 0's lanes 0..3 hold all 16).
__device__ __forceinline__ void hand_over_stats(const SegmentStateOf<8>& st, const ThreadPlace& t,
                                                const float (&sum)[4], float* hand_m, float* hand_l) {
  if (t.wg_warp == 0 && t.lane < 4) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        hand_m[8 * j + t.col + e] = st.m[2 * j + e];
        hand_l[8 * j + t.col + e] = sum[2 * j + e];
      }
  }
}

// Group 0's side: the weights of its own and group 1's partial state per head
// (each already divided by the combined sum), with st.m and sum moved to the
// combined state's.
__device__ __forceinline__ void hand_over_weights(SegmentStateOf<8>& st, const ThreadPlace& t, float (&sum)[4],
                                                  const float* hand_m, const float* hand_l, float (&w0)[4],
                                                  float (&w1)[4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + t.col + e, k = 2 * j + e;
      const float m1 = hand_m[h];
      const float m = fmaxf(st.m[k], m1);
      const float a0 = exp2f(st.m[k] - m), a1 = exp2f(m1 - m);
      const float total = sum[k] * a0 + hand_l[h] * a1;
      w0[k] = a0 / total;
      w1[k] = a1 / total;
      st.m[k] = m;
      sum[k] = total;
    }
}

// Group 0 writes the combined, normalized O^T of segment `seg` of row `row`:
// to out (bf16) when the row has one segment, else with the base-2
// log-sum-exp to the split-K workspace for the merge pass.
__device__ __forceinline__ void store_handed_over(const MlaDecodeDescriptor& d, const SegmentStateOf<8>& st,
                                                  const ThreadPlace& t, const float (&sum)[4], int seg, int row,
                                                  __nv_bfloat16* __restrict__ out) {
  const int heads_here = min(kHeads, d.num_heads);
  const bool split = d.row_segment_start[row + 1] - d.row_segment_start[row] > 1;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + t.col + e;
      if (h >= heads_here) continue;
      const int64_t at = (split ? int64_t{seg} : int64_t{row}) * d.num_heads + h;
#pragma unroll
      for (int mi = 0; mi < 8; ++mi)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int dim = mi * 64 + t.row0 + 8 * i;
          const float v = st.o[mi][4 * j + 2 * i + e];
          if (!split) out[at * kMlaLatentDim + dim] = __float2bfloat16(v);
          else d.workspace[at * kMlaLatentDim + dim] = v;
        }
      if (split && t.lane < 4 && t.wg_warp == 0) {
        float* lse = d.workspace + int64_t{d.num_segments} * d.num_heads * kMlaLatentDim;
        lse[at] = st.m[2 * j + e] + log2f(sum[2 * j + e]);
      }
    }
}

}  // namespace pagoda::kernels::cuda::mla_narrow
