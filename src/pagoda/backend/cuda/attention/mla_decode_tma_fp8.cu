// Paged MLA decode over FlashMLA's 656-byte fp8 records (runtime/mla_fp8_layout.h),
// at most 16 heads, fed by the copy engine: MlaDecodeKernel::kTmaFp8 of
// mla_decode_descriptor.h.
//
// The schedule is the bf16 ping-pong kernel's (mla_decode_tma.cu,
// kTmaPingPongTwoChains): a producer warp and two compute warpgroups, group g
// computing the CTA's tiles of parity g (all of S^T in two accumulator chains,
// the softmax, O^T over all 512 latent dims), group 1 handing its maxima, sums
// and O^T to group 0 at a segment's end. What differs is the load:
//   - the producer copies the raw records with 1-D bulk copies
//     (cp.async.bulk, L2 evict-first) into a ring of kRawSlots staging slots of
//     16 records (10,496 B) each: a tile is 4 slots, 5 slots let a tile's
//     first quarter land while the other group still converts its tile.
//     Each slot has a full and an empty mbarrier per group
//     (mla_decode_tma_fp8_ring.h says why): with one pair a slot, a group that
//     skipped the phases the other consumed could read a slot before its
//     bytes landed, and its arrivals completed the other group's empty phase
//     (the intermittent CUDA error 719 at engine scale, docs/KERNELS.md v17).
//     The consumers keep a parity bit per slot, the producer one per (group,
//     slot) of the empty barriers. One
//     copy a page run: a slot's 16 positions lie in one page when the block
//     size is a multiple of 16, else in 16 / block_size pages (block sizes
//     dividing 16); a slot of rows past the segment's end is armed with fewer
//     (or no) bytes;
//   - the group owning the tile dequantizes its 4 slots into its own bf16 tile
//     (9 swizzled column blocks, the layout the wgmma descriptors read) with
//     the cp.async kernel's arithmetic (code -> half -> float, times the
//     group's scale, rounded to bf16; the rope values copied), so the products
//     see the same bf16 values as the narrow cp.async kernel; it releases each
//     slot once read, so the producer refills it while the group computes.
//     Rows past the segment's end are written as zeros (V must not carry NaNs
//     into 0 x V);
//   - group 1's hand-over goes through its own bf16 tile (free at a segment's
//     end): group 1 writes, arrives on hand_full, and waits on hand_empty
//     (group 0 has read it) before it converts its next tile there.
// 2 x 73,728 B of bf16 tiles + 5 staging slots + Q fit one CTA an SM.
// s_full / pv_full repeat mla_decode_tma.cu's (that file keeps its helpers in
// an anonymous namespace; the math must stay the same); the segment's end
// (sums, hand-over, store) is mla_narrow's, shared with it.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"
#include "pagoda/backend/cuda/attention/mla_decode_merge.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_narrow.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_pair.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_tma_fp8_ring.h"
#include "pagoda/backend/cuda/attention/prefill_sm90_sync.cuh"
#include "pagoda/backend/cuda/attention/wgmma_primitives.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

using mla_narrow::kBlockBytes;
using mla_narrow::kHeads;
using mla_narrow::kTile;
constexpr int kConsumerThreads = mla_narrow::kComputeThreads;
constexpr int kThreads = kConsumerThreads + 32;
constexpr int kColumnBlocks = 9;
constexpr int kQBytes = kColumnBlocks * mla_narrow::kQBlockBytes;  // 18,432
constexpr int kTileBytes = kColumnBlocks * kBlockBytes;            // 73,728
constexpr int kMTiles = 8;
[[maybe_unused]] constexpr int kConsumersBarrier = 3;
constexpr int kRecordBytes = 656;
[[maybe_unused]] constexpr int kScalesAt = 512, kRopeAt = 528;
constexpr int kSlotRecords = 16;
using tma_fp8_ring::kSlotsPerTile;
constexpr int kSlotBytes = kSlotRecords * kRecordBytes;  // 10,496
constexpr int kRawSlots = tma_fp8_ring::kRingSlots;
static_assert(kSlotsPerTile * kSlotRecords == kTile, "a tile is kSlotsPerTile slots");

// Q | bf16 tile [2 groups] | P^T [2 groups] | staging slots | column maxima
// [2][4][16] | column sums [2][4][16] | group 1's maxima and sums [2][16] |
// mbarriers: full [group][slot], empty [group][slot], hand-over full, empty.
constexpr int kTilesAt = kQBytes;
constexpr int kPAt = kTilesAt + 2 * kTileBytes;
constexpr int kRawAt = kPAt + 2 * kHeads * 128;
constexpr int kMaxAt = kRawAt + kRawSlots * kSlotBytes;
constexpr int kSumAt = kMaxAt + 2 * 4 * kHeads * 4;
constexpr int kHandAt = kSumAt + 2 * 4 * kHeads * 4;
constexpr int kBarriersAt = kHandAt + 2 * kHeads * 4;
// + with the merge paired (d.paired_merge): the pair's ready and arrived mbarriers (mla_decode_pair.cuh); the
// partner's half records land in the staging slots, which the segment's end no longer needs.
constexpr int kSmemBytes = kBarriersAt + (2 * tma_fp8_ring::kBarriers + 4) * 8 + 1024;
static_assert(mla_pair::kReceiveBytes <= kRawSlots * kSlotBytes, "the staging slots hold the pair's receive area");
static_assert(kTilesAt % 1024 == 0 && kPAt % 1024 == 0 && kTileBytes % 1024 == 0, "swizzle atoms 1024-byte aligned");
static_assert(kRawAt % 16 == 0 && kSlotBytes % 16 == 0 && kBarriersAt % 8 == 0, "bulk copies 16-byte aligned");
static_assert(kSmemBytes <= 232448, "fits an SM");
static_assert(kMTiles * 8 * 128 * 4 <= kTileBytes, "group 1's O^T fits its bf16 tile");

[[maybe_unused]] __device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// `bytes` (a multiple of 16) from global src to shared dst through the copy
// engine, completing on `bar` (transaction bytes).
[[maybe_unused]] __device__ __forceinline__ void bulk_load(void* smem_dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(smem_address(smem_dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// Sixteen e4m3 codes times `scale` -> sixteen bf16 (mla_decode.cu's
// fp8x16_scaled_to_bf16: the same arithmetic, so the same bits).
[[maybe_unused]] __device__ __forceinline__ void fp8x16_scaled(const uint4& codes, float scale, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * half));
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      out[2 * i + half] = pack_bf16x2(f.x * scale, f.y * scale);
    }
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// Byte offset of (row, 16-byte bf16 chunk 0..71) in a swizzled 64-row tile.
[[maybe_unused]] __device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return (chunk >> 3) * kBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// mla_decode_tma.cu's s_full with two chains (kTmaPingPongTwoChains) over a
// tile already in shared memory.
[[maybe_unused]] __device__ __forceinline__ void s_full2(float (&s)[8], uint32_t q_addr, uint32_t tile_addr) {
  float s_odd[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = s_odd[i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kMlaKeyDim / 16; ++ks) {
    const uint64_t desc_k = make_smem_desc_sw128(tile_addr + (ks >> 2) * kBlockBytes + (ks & 3) * 32, 16, 1024);
    const uint64_t desc_q =
        make_smem_desc_sw128(q_addr + (ks >> 2) * mla_narrow::kQBlockBytes + (ks & 3) * 32, 16, 1024);
    if (ks & 1) mla_narrow::wgmma_m64n16k16<0>(s_odd, desc_k, desc_q, ks > 1);
    else mla_narrow::wgmma_m64n16k16<0>(s, desc_k, desc_q, ks >= 2);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mla_narrow::keep_in_order(s[i]);
    mla_narrow::keep_in_order(s_odd[i]);
    s[i] += s_odd[i];
  }
}

// O^T[all 8 m-tiles] += V^T P^T (mla_decode_tma.cu's pv_full).
[[maybe_unused]] __device__ __forceinline__ void pv_full(mla_narrow::SegmentStateOf<kMTiles>& st, uint32_t p_addr,
                                        uint32_t tile_addr) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int i = 0; i < 8; ++i) mla_narrow::keep_in_order(st.o[mi][i]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const uint64_t desc_p = make_smem_desc_sw128(p_addr + kk * 32, 16, 1024);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
      mla_narrow::wgmma_m64n16k16<1>(
          st.o[mi], make_smem_desc_sw128(tile_addr + mi * kBlockBytes + kk * 16 * 128, kBlockBytes, 1024), desc_p, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int i = 0; i < 8; ++i) mla_narrow::keep_in_order(st.o[mi][i]);
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_tma_fp8_kernel(const MlaDecodeDescriptor d, const __nv_bfloat16* __restrict__ q,
                              __nv_bfloat16* __restrict__ out) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  launch_dependents();  // the merge pass (programmatic_merge) may be scheduled now: it waits for this grid
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_address(smem_raw);
  uint8_t* base = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  uint8_t* raw = base + kRawAt;
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kBarriersAt);  // [group][slot]
  uint64_t* empty = full + tma_fp8_ring::kBarriers;                 // [group][slot]
  uint64_t* hand_full = empty + tma_fp8_ring::kBarriers;  // group 1's 128 threads arrive once its hand-over is written
  uint64_t* hand_empty = hand_full + 1;     // group 0's 128 threads arrive once they have read it
  uint64_t* pair_ready = hand_empty + 1;    // the merge paired: the partner's staging slots are free
  uint64_t* pair_arrived = pair_ready + 1;  // the merge paired: the partner's half records are in
  const int tid = threadIdx.x;
  const int lane = tid & 31;

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < tma_fp8_ring::kBarriers; ++i) {
      mbarrier_init(&full[i], 1);   // the producer's arrive + the bytes
      // Every reading thread arrives: an mbarrier arrive releases only the arriving
      // thread's own prior accesses, so one lane arriving for its warp would leave the
      // other lanes' slot reads unordered before the next bulk copy into the slot.
      mbarrier_init(&empty[i], 128);
    }
    mbarrier_init(hand_full, 128);
    mbarrier_init(hand_empty, 128);
    if (d.paired_merge) {
      mbarrier_init(pair_ready, mla_pair::kGroupThreads);
      mbarrier_init(pair_arrived, mla_pair::kGroupThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (d.paired_merge) mla_pair::cluster_sync();  // the partner's pair barriers are initialized

  const int seg_begin = d.cta_segment_start[blockIdx.y];
  const int seg_end = d.cta_segment_start[blockIdx.y + 1];

  if (tid >= kConsumerThreads) {
    // ---- Producer warp: per slot of 16 positions, wait for it to be free,
    // arm it with the bytes of its positions below kv_end, lanes issue one
    // copy a page run (run = min(block_size, 16) positions).
    const int bs = d.block_size;
    const int run = bs < kSlotRecords ? bs : kSlotRecords;
    const uint64_t policy = evict_first_policy();
    const uint8_t* latent = static_cast<const uint8_t*>(d.latent);
    int next = 0;  // slots issued by this CTA over all its segments
    // Bit b: parity of the next phase of empty[b] (b = group * kRawSlots + slot) to wait for.
    uint32_t empty_parity = 0;
    for (int seg = seg_begin; seg < seg_end; ++seg) {
      const int row = d.segments[3 * seg];
      const int kv_begin = d.segments[3 * seg + 1];
      const int kv_end = d.segments[3 * seg + 2];
      const int32_t* table = d.block_tables + d.block_table_start[row];
      for (int kv0 = kv_begin; kv0 < kv_end; kv0 += kTile) {
#pragma unroll 1
        for (int s = 0; s < kSlotsPerTile; ++s, ++next) {
          const int first_row = kv0 + s * kSlotRecords;
          int rows_here = kv_end - first_row;
          rows_here = rows_here < 0 ? 0 : rows_here > kSlotRecords ? kSlotRecords : rows_here;
          const int runs = (rows_here + run - 1) / run;
          const int pos = first_row + lane * run;
          const bool mine = lane < runs;
          const int64_t page_slot = mine ? int64_t{__ldg(table + pos / bs)} * bs + pos % bs : 0;
          const int n = mine ? min(run, rows_here - lane * run) : 0;
          const int slot = tma_fp8_ring::ring_slot(next);
          uint64_t* const full_here = &full[tma_fp8_ring::ring_barrier(next)];
          if (next >= kRawSlots) {
            // The slot's previous use was released on its own group's barrier.
            const int bit = tma_fp8_ring::ring_barrier(next - kRawSlots);
            mbarrier_wait(&empty[bit], (empty_parity >> bit) & 1);
            empty_parity ^= 1u << bit;
          }
          if (lane == 0) mbarrier_arrive_expect_tx(full_here, uint32_t(rows_here * kRecordBytes));
          __syncwarp();
          if (mine)
            bulk_load(raw + slot * kSlotBytes + lane * run * kRecordBytes, latent + page_slot * kRecordBytes,
                      uint32_t(n * kRecordBytes), full_here, policy);
        }
      }
    }
    return;
  }

  // ---- Compute warpgroups: group g converts and computes the CTA's tiles of parity g.
  const mla_narrow::ThreadPlace t = mla_narrow::thread_place(tid);
  const int g = t.warpgroup;
  const int gtid = tid & 127;
  uint8_t* my_tile = base + kTilesAt + g * kTileBytes;
  uint8_t* p_tile = base + kPAt + g * kHeads * 128;
  float* col_max = reinterpret_cast<float*>(base + kMaxAt) + g * 4 * kHeads;
  float* col_sum = reinterpret_cast<float*>(base + kSumAt) + g * 4 * kHeads;
  float* hand_m = reinterpret_cast<float*>(base + kHandAt);
  float* hand_l = hand_m + kHeads;
  float* hand_o = reinterpret_cast<float*>(base + kTilesAt + kTileBytes);  // group 1's bf16 tile
  const uint32_t q_addr = smem_address(base);
  const uint32_t p_addr = smem_address(p_tile);
  const uint32_t tile_addr = smem_address(my_tile);
  auto consumers_barrier = [] { named_barrier_sync(kConsumersBarrier, kConsumerThreads); };
  constexpr float kNoPositionScale[2] = {1.0f, 1.0f};
  // This thread's part of a slot: record rec (0..15), code chunks cq + 8 k
  // (group k's scale), rope chunk cq.
  const int rec = gtid >> 3, cq = gtid & 7;
  uint64_t* const my_full = full + g * kRawSlots;
  uint64_t* const my_empty = empty + g * kRawSlots;
  uint32_t full_parity = 0;  // bit slot: parity of the next phase of my_full[slot] to wait for

  int it = 0;
  for (int seg = seg_begin; seg < seg_end; ++seg) {
    const int row = d.segments[3 * seg];
    const int kv_begin = d.segments[3 * seg + 1];
    const int kv_end = d.segments[3 * seg + 2];
    const int num_tiles = (kv_end - kv_begin + kTile - 1) / kTile;

    consumers_barrier();  // both groups are past their last S^T: Q is free
    mla_narrow::issue_q(base, q, row, d.num_heads, tid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    consumers_barrier();

    mla_narrow::SegmentStateOf<kMTiles> st;
    mla_narrow::reset(st);
    for (int tile = ((g - it) & 1); tile < num_tiles; tile += 2) {
      const int kv0 = kv_begin + tile * kTile;
      const int valid_rows = kv_end - kv0;
      // Every warp of the group is done with the previous tile's P V (and
      // group 1's hand-over was read): the bf16 tile may be rewritten.
      mla_narrow::group_barrier(g);
#pragma unroll 1
      for (int s = 0; s < kSlotsPerTile; ++s) {
        const int idx = (it + tile) * kSlotsPerTile + s;
        const int slot = tma_fp8_ring::ring_slot(idx);  // ring_barrier(idx) = g * kRawSlots + slot
        mbarrier_wait(&my_full[slot], (full_parity >> slot) & 1);
        full_parity ^= 1u << slot;
        const int r = s * kSlotRecords + rec;  // tile row
        const uint8_t* record = raw + slot * kSlotBytes + rec * kRecordBytes;
        uint4 codes[4], rope = make_uint4(0u, 0u, 0u, 0u);
        float4 scales = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const bool valid = r < valid_rows;
        if (valid) {
#pragma unroll
          for (int k = 0; k < 4; ++k) codes[k] = *reinterpret_cast<const uint4*>(record + 16 * (cq + 8 * k));
          scales = *reinterpret_cast<const float4*>(record + kScalesAt);
          rope = *reinterpret_cast<const uint4*>(record + kRopeAt + 16 * cq);
        }
        // Done reading the slot: back to the producer.
        mbarrier_arrive(&my_empty[slot]);
        const float gs[4] = {scales.x, scales.y, scales.z, scales.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int c = cq + 8 * k;  // code chunk 0..31 -> bf16 chunks 2c, 2c + 1
          uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
          if (valid) fp8x16_scaled(codes[k], gs[k], lo, hi);
          *reinterpret_cast<uint4*>(my_tile + tile_offset(r, 2 * c)) = lo;
          *reinterpret_cast<uint4*>(my_tile + tile_offset(r, 2 * c + 1)) = hi;
        }
        *reinterpret_cast<uint4*>(my_tile + tile_offset(r, 64 + cq)) = valid ? rope : make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async_shared();
      mla_narrow::group_barrier(g);  // the bf16 tile is complete

      float s[8];
      s_full2(s, q_addr, tile_addr);
      mla_narrow::softmax_tile<false>(s, st, t, valid_rows, kNoPositionScale, d.scale_log2, col_max, p_tile);
      pv_full(st, p_addr, tile_addr);
    }
    it += num_tiles;

    // Every warp of the group is also done with its bf16 tile after this.
    float sum[4];
    mla_narrow::group_head_sums(st, t, col_sum, sum);
    const int u = seg - seg_begin;  // the hand-over's use
    if (g == 1) {
      mla_narrow::hand_over_stats(st, t, sum, hand_m, hand_l);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int i = 0; i < 8; ++i) hand_o[(mi * 8 + i) * 128 + gtid] = st.o[mi][i];
      mbarrier_arrive(hand_full);           // release: the writes above
      mbarrier_wait(hand_empty, u & 1);     // group 0 has read them: the tile is free again
      continue;
    }
    mbarrier_wait(hand_full, u & 1);
    float w0[4], w1[4];
    mla_narrow::hand_over_weights(st, t, sum, hand_m, hand_l, w0, w1);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int k = 2 * ((i >> 2) & 1) + (i & 1);
        float& o = st.o[mi][i];
        o = o * w0[k] + hand_o[(mi * 8 + i) * 128 + gtid] * w1[k];
      }
    mbarrier_arrive(hand_empty);
    const int row_first = d.row_segment_start[row];
    if (d.paired_merge && d.row_segment_start[row + 1] - row_first == 2) {
      // Group 1 is past its last tile (it handed over) and so is this group: the staging slots are free (the
      // CTA's one segment: nothing more is staged).
      mla_pair::exchange_and_store(d, st, t, sum, row, seg - row_first, gtid, reinterpret_cast<float*>(raw),
                                   pair_arrived, pair_ready, out);
      continue;
    }
    mla_narrow::store_handed_over(d, st, t, sum, seg, row, out);
    mla_merge::publish_record(d, row, gtid, [] { mla_narrow::group_barrier(0); });
  }
  if (d.fused_merge)  // the merge folded in (mla_decode_merge.cuh)
    mla_merge::combine_held_rows<kConsumerThreads>(d, seg_begin, seg_end, tid, consumers_barrier, out);
#endif
}

}  // namespace

cudaError_t prepare_mla_decode_tma_fp8_kernel() {
  static const cudaError_t prepared =
      cudaFuncSetAttribute(mla_decode_tma_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  return prepared;
}

cudaError_t mla_decode_tma_fp8_occupancy(int* ctas_per_sm) {
  *ctas_per_sm = 0;
  const cudaError_t prepared = prepare_mla_decode_tma_fp8_kernel();
  if (prepared != cudaSuccess) return prepared;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, mla_decode_tma_fp8_kernel, kThreads, kSmemBytes);
}

cudaError_t launch_mla_decode_tma_fp8_main(const MlaDecodeDescriptor& d, const void* q, void* out,
                                           cudaStream_t stream) {
  const bool domain = d.latent_element == KvElement::kFP8E4M3 && d.latent_layout == MlaLatentLayout::kFlashMla656 &&
                      d.num_heads <= kHeads && d.block_size > 0 &&
                      (d.block_size % kSlotRecords == 0 || kSlotRecords % d.block_size == 0) &&
                      (reinterpret_cast<uintptr_t>(d.latent) & 15) == 0;
  if (!domain) return cudaErrorNotSupported;
  const cudaError_t prepared = prepare_mla_decode_tma_fp8_kernel();
  if (prepared != cudaSuccess) return prepared;
  if (d.num_ctas == 0) return cudaSuccess;
  return mla_merge::launch_decode(mla_decode_tma_fp8_kernel, d, kThreads, kSmemBytes, stream, d,
                                  static_cast<const __nv_bfloat16*>(q), static_cast<__nv_bfloat16*>(out));
}

}  // namespace pagoda::kernels::cuda
