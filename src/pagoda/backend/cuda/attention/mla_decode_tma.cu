// Paged MLA decode, bf16 latent, at most 16 heads, with the tiles loaded by
// the copy engine (TMA): MlaDecodeKernel::kTma, kTmaTile, kTmaPair, kTmaPairTile of
// mla_decode_descriptor.h, kTmaFastExp (kTma with a shorter softmax), and
// the kTmaPingPong* kernels (each compute warpgroup owning whole tiles;
// described at their kernel below).
//
// The math is the narrow kernels' (mla_decode_narrow.cuh: S^T = K Q^T over 64
// positions x 16 heads, the K dims split between the two compute warpgroups
// and the halves swapped through shared memory; softmax per head = per column;
// O^T += V^T P^T with each group owning 256 latent dims), and so are the tile
// layout (9 column blocks of 64 rows x 128 B, 128-byte swizzle) and the
// segment schedule. What differs is who loads the tiles:
//   - a ninth warp (the producer) walks the block tables and issues tensor-map
//     copies (cp.async.bulk.tensor, L2 evict-first: the latent is read once a
//     step) into a ring of column-block slots: 18 (two stages of whole tiles,
//     kTma, kTmaTile) or 9 (one tile, kTmaPair*), one column block a round
//     (kTma) or one whole tile a round (v8's schedule: kTmaTile); every slot
//     always holds the same column block, so its readers are always the same
//     threads and each waits for every phase of its barriers (a parity wait
//     must never run two phases ahead: the 23-slot ring variants, whose slots
//     changed readers, were removed for that, docs/KERNELS.md v17); the 256
//     compute threads issue
//     no latent copies (they still copy Q, 18 KB a segment);
//   - the latent pool is seen as a 3-D tensor [slots][9 column blocks][64
//     values] (strides 1,152 B and 128 B), and one box is one column block of
//     one page: 64 values x min(block_size, 64) rows, landing in the swizzled
//     layout the wgmma descriptors read (a box starts on a 1,024-byte swizzle
//     atom: block sizes 8 / 16 / 32, or multiples of 64 where a tile lies in
//     one page);
//   - each slot has a "full" mbarrier (transaction bytes), so a group starts
//     S^T on its first column block while the others land, and an "empty"
//     mbarrier its readers arrive on when done with it (the rope block after
//     S, the others after P V), which the producer waits on before reusing it;
//   - rows of a segment's last tile past its end are not loaded (whole pages
//     past it) or hold whatever the pool has there: the compute threads zero
//     them before S (V must not carry NaNs into 0 x V).
// The tensor map is encoded on the host per launch (a pure host call) and
// passed as a __grid_constant__ parameter, so a captured graph replays it.
// docs/KERNELS.md ("MLA decode", v8 and v9) has the design notes and measurements.

#include <cuda.h>  // CUtensorMap, the encoder's signature (no driver call is linked)
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"
#include "pagoda/backend/cuda/attention/mla_decode_merge.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_narrow.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_pair.cuh"
#include "pagoda/backend/cuda/attention/prefill_sm90_sync.cuh"
#include "pagoda/backend/cuda/attention/wgmma_primitives.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

using mla_narrow::kBlockBytes;  // one column block of a tile
using mla_narrow::kHeads;
using mla_narrow::kKeyChunks;
using mla_narrow::kTile;
constexpr int kConsumerThreads = mla_narrow::kComputeThreads;  // 2 compute warpgroups
constexpr int kThreads = kConsumerThreads + 32;                // + the producer warp
constexpr int kColumnBlocks = 9;                               // 576 / 64
constexpr int kQBytes = kColumnBlocks * mla_narrow::kQBlockBytes;  // 18,432
// Named barriers (0 is __syncthreads, which the producer does not join after
// the set-up): 1 + g, one compute warpgroup; 3, both compute warpgroups. The
// ping-pong kernels with turns also use 6 + g (group g's turn to issue its S^T
// MMAs); their segment-end hand-over uses two mbarriers, not named barriers.
[[maybe_unused]] constexpr int kConsumersBarrier = 3;
[[maybe_unused]] constexpr int kTurnBarrier = 6;

// The ring of column-block slots: a tile's column block c goes to slot
// (9 x tile + c) % kSlots. 18 slots are v8's two stages of whole tiles. (kSlots
// must stay a multiple of 9, and of 18 for the ping-pong kernels: then a slot
// always holds one column block of one group's tiles, so each waiter sees
// every phase of the slot's barriers.)
constexpr int kTwoStageSlots = 2 * kColumnBlocks;
// One tile's 9 slots: 112 KB of shared memory a CTA, so two CTAs share an SM
// (kTmaPair, kTmaPairTile). The producer loads the next tile's column block c
// once this tile's readers have released slot c.
constexpr int kPairSlots = kColumnBlocks;

// Shared memory (base aligned to 1024 B): Q | kSlots column-block slots | P^T
// [2 groups] | column maxima [2][4 warps][16] | column sums [2][4][16] | S^T
// halves [2 tile parities][256 threads][8] | mbarriers: full [slot], empty [slot].
template <int kSlots>
struct Layout {
  static constexpr int kTilesAt = kQBytes;
  static constexpr int kPAt = kTilesAt + kSlots * kBlockBytes;
  static constexpr int kMaxAt = kPAt + 2 * kHeads * 128;
  static constexpr int kSumAt = kMaxAt + 2 * 4 * kHeads * 4;
  static constexpr int kPartialAt = kSumAt + 2 * 4 * kHeads * 4;
  static constexpr int kPartialBytes = kConsumerThreads * 8 * 4;
  static constexpr int kBarriersAt = kPartialAt + 2 * kPartialBytes;
  static constexpr int kSmemBytes = kBarriersAt + 2 * kSlots * 8 + 1024;
  static_assert(kTilesAt % 1024 == 0 && kPAt % 1024 == 0 && kBlockBytes % 1024 == 0,
                "swizzle atoms stay 1024-byte aligned");
  static_assert(kSmemBytes <= 232448, "fits an SM");
  static_assert(kSlots % kColumnBlocks == 0, "a slot keeps one column block (parity waits)");
};

// mbarrier.arrive with a count (one warp standing for the warps that do not
// read the slot).
[[maybe_unused]] __device__ __forceinline__ void mbarrier_arrive_count(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}

// An L2 policy that evicts first: the latent is read once per step.
[[maybe_unused]] __device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// `bytes` (a multiple of 16) from global src to shared dst as one 1-D bulk copy through the copy engine,
// completing on `bar` (transaction bytes), with an L2 cache policy.
[[maybe_unused]] __device__ __forceinline__ void bulk_load_hint(void* smem_dst, const void* src, uint32_t bytes,
                                                               uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(smem_address(smem_dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// tma_load_3d (prefill_sm90_sync.cuh) with an L2 cache policy.
[[maybe_unused]] __device__ __forceinline__ void tma_load_3d_hint(void* smem_dst, const void* tensor_map, int c0, int c1, int c2,
                                                 uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%2, %3, %4}], [%5], %6;\n" ::"r"(smem_address(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// kWholeTile: the producer's schedule. false (v9): one column block a round
// (wait for its slot, arm, issue its boxes); true (v8): one tile a round (wait
// for its 9 slots, arm all, issue all its boxes from up to 32 lanes at once).
// The compute side and the slot releases are the same for both.
// kCtasPerSm: the occupancy the variant is built for (2: kPairSlots, so that
// one CTA's copies and barriers overlap the other's MMAs).
// kFastExp: the softmax with the scale folded into the exponent's FFMA and
// ex2.approx.ftz (mla_narrow::softmax_tile; kTmaFastExp).
template <int kSlots, bool kWholeTile, int kCtasPerSm, bool kFastExp = false>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    mla_decode_tma_kernel(const MlaDecodeDescriptor d, const __grid_constant__ CUtensorMap latent_map,
                          const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The portable compute_90 PTX has no wgmma: this body exists only in the sm_90a machine code.
  __trap();
#else
  launch_dependents();  // the merge pass (programmatic_merge) may be scheduled now: it waits for this grid
  using L = Layout<kSlots>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_address(smem_raw);
  uint8_t* base = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  uint8_t* tiles = base + L::kTilesAt;
  uint64_t* full = reinterpret_cast<uint64_t*>(base + L::kBarriersAt);  // [slot]
  uint64_t* empty = full + kSlots;                                     // [slot]
  const int tid = threadIdx.x;
  const int lane = tid & 31;

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      mbarrier_init(&full[i], 1);  // the producer's arrive + the bytes
      // 8 counts a use: each of the 8 compute warps that reads the slot arrives
      // with 8 / (warps reading it) once done (column block 4: both groups, 1
      // each; the others: one group, 2 each).
      mbarrier_init(&empty[i], kConsumerThreads / 32);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  const int seg_begin = d.cta_segment_start[blockIdx.y];
  const int seg_end = d.cta_segment_start[blockIdx.y + 1];

  if (tid >= kConsumerThreads) {
    // ---- Producer warp. A tile is 64 / box_rows pages (one when the block size
    // is a multiple of 64: the tile lies inside one page), each column block
    // loaded as one box a page into its slot, column block 0 first; lane p
    // issues page p's boxes. The producer runs ahead over tiles and segments as
    // far as the ring's free slots allow.
    const int bs = d.block_size;
    const int box_rows = bs < kTile ? bs : kTile;
    const int pages = kTile / box_rows;  // <= 8
    const uint64_t policy = evict_first_policy();
    int next = 0;  // column blocks issued by this CTA, over all its segments (the ring's position)
    for (int seg = seg_begin; seg < seg_end; ++seg) {
      const int row = d.segments[3 * seg];
      const int kv_begin = d.segments[3 * seg + 1];
      const int kv_end = d.segments[3 * seg + 2];
      const int32_t* table = d.block_tables + d.block_table_start[row];
      for (int kv0 = kv_begin; kv0 < kv_end; kv0 += kTile) {
        // Pages holding at least one position below kv_end (the table has no
        // entry past the row's last page).
        const int live_pages = min(pages, (kv_end - kv0 + box_rows - 1) / box_rows);
        const uint32_t bytes = uint32_t(live_pages * box_rows * 128);
        if constexpr (kWholeTile) {
          // v8's schedule: copy i of the tile is column block i / live_pages,
          // page i % live_pages (column block 0 first), up to 3 a lane; the
          // table loads overlap the waits for the tile's 9 slots, then lane 0
          // arms all 9 and the lanes issue every box at once.
          const int copies = kColumnBlocks * live_pages;
          int page_slot[3];
#pragma unroll
          for (int k = 0; k < 3; ++k) {
            const int i = lane + 32 * k;
            const int pos = kv0 + (i % live_pages) * box_rows;
            page_slot[k] = i < copies ? __ldg(table + pos / bs) * bs + pos % bs : 0;
          }
#pragma unroll 1
          for (int cb = 0; cb < kColumnBlocks; ++cb) {
            const int use = (next + cb) / kSlots;
            if (use > 0) mbarrier_wait(&empty[(next + cb) % kSlots], (use - 1) & 1);
          }
          if (lane == 0) {
#pragma unroll 1
            for (int cb = 0; cb < kColumnBlocks; ++cb) mbarrier_arrive_expect_tx(&full[(next + cb) % kSlots], bytes);
          }
          __syncwarp();
#pragma unroll
          for (int k = 0; k < 3; ++k) {
            const int i = lane + 32 * k;
            if (i < copies) {
              const int cb = i / live_pages, page = i % live_pages;
              const int slot = (next + cb) % kSlots;
              tma_load_3d_hint(tiles + slot * kBlockBytes + page * box_rows * 128, &latent_map, 0, cb, page_slot[k],
                               &full[slot], policy);
            }
          }
          next += kColumnBlocks;
        } else {
          // v9's schedule: per column block, wait for its slot, arm it, lanes
          // 0..live_pages-1 issue one box each.
          const int pos = kv0 + lane * box_rows;
          // This lane's page slot first: the table load overlaps the waits.
          const int page_slot = lane < live_pages ? __ldg(table + pos / bs) * bs + pos % bs : 0;
#pragma unroll 1
          for (int cb = 0; cb < kColumnBlocks; ++cb, ++next) {
            const int slot = next % kSlots;
            const int use = next / kSlots;
            if (use > 0) mbarrier_wait(&empty[slot], (use - 1) & 1);
            if (lane == 0) mbarrier_arrive_expect_tx(&full[slot], bytes);
            __syncwarp();
            if (lane < live_pages)
              tma_load_3d_hint(tiles + slot * kBlockBytes + lane * box_rows * 128, &latent_map, 0, cb, page_slot,
                               &full[slot], policy);
          }
        }
      }
    }
    return;
  }

  // ---- Compute warpgroups (mla_decode_narrow.cuh's math).
  const mla_narrow::ThreadPlace t = mla_narrow::thread_place(tid);
  uint8_t* q_tile = base;
  uint8_t* p_tile = base + L::kPAt + t.warpgroup * kHeads * 128;  // this group's P^T
  float* col_max = reinterpret_cast<float*>(base + L::kMaxAt) + t.warpgroup * 4 * kHeads;  // [warp][head]
  float* col_sum = reinterpret_cast<float*>(base + L::kSumAt) + t.warpgroup * 4 * kHeads;
  const uint32_t q_addr = smem_address(q_tile);
  const uint32_t p_addr = smem_address(p_tile);
  const uint32_t tiles_addr = smem_address(tiles);
  auto consumers_barrier = [] { named_barrier_sync(kConsumersBarrier, kConsumerThreads); };
  constexpr float kNoPositionScale[2] = {1.0f, 1.0f};

  int it = 0;  // tiles computed by this CTA, over all its segments (the producer's order)
  for (int seg = seg_begin; seg < seg_end; ++seg) {
    const int row = d.segments[3 * seg];
    const int kv_begin = d.segments[3 * seg + 1];
    const int kv_end = d.segments[3 * seg + 2];
    const int num_tiles = (kv_end - kv_begin + kTile - 1) / kTile;

    consumers_barrier();  // the previous segment is done with Q
    mla_narrow::issue_q(q_tile, q, row, d.num_heads, tid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    consumers_barrier();

    mla_narrow::SegmentState st;
    mla_narrow::reset(st);
    for (int tile = 0; tile < num_tiles; ++tile, ++it) {
      const int kv0 = kv_begin + tile * kTile;
      // Column block c of this tile: slot (first + c) % kSlots, its use's parity.
      const int first = (it * kColumnBlocks) % kSlots;
      const int first_use = (it * kColumnBlocks) / kSlots;
      auto slot_of = [&](int c) { return first + c < kSlots ? first + c : first + c - kSlots; };
      auto parity_of = [&](int c) { return (first_use + (first + c < kSlots ? 0 : 1)) & 1; };
      auto block_addr = [&](int c) { return tiles_addr + uint32_t(slot_of(c) * kBlockBytes); };
      auto wait_block = [&](int c) {
        mbarrier_wait(&full[slot_of(c)], parity_of(c));
        return true;
      };
      const int valid_rows = kv_end - kv0;  // < 64 only in a segment's last tile
      if (valid_rows < kTile) {
        // Rows past the segment: zeros, once every box has landed.
#pragma unroll
        for (int cb = 0; cb < kColumnBlocks; ++cb) wait_block(cb);
        for (int idx = tid; idx < (kTile - valid_rows) * kKeyChunks; idx += kConsumerThreads) {
          const int r = valid_rows + idx / kKeyChunks, c = idx % kKeyChunks;
          *reinterpret_cast<uint4*>(tiles + slot_of(c >> 3) * kBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4)) =
              make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async_shared();
        consumers_barrier();
      }

      // S^T: each group starts on its first column block while the rest land.
      float s[8];
      mla_narrow::s_half(s, t, q_addr, block_addr, wait_block);
      // Done with the slots only S reads: group 0 with column block 4 (group 1
      // still reads it in P V), group 1 with the rope block 8.
      __syncwarp();
      if (t.lane == 0) {
        if (t.warpgroup == 0) mbarrier_arrive_count(&empty[slot_of(4)], 1);
        else mbarrier_arrive_count(&empty[slot_of(8)], 2);
      }
      // Halves by tile parity: a fast group may write the next tile's half
      // before the other group has read this one (no CTA barrier between tiles).
      mla_narrow::add_other_half(s, base + L::kPartialAt + (it & 1) * L::kPartialBytes, tid, consumers_barrier);
      mla_narrow::softmax_tile<kFastExp>(s, st, t, valid_rows, kNoPositionScale, d.scale_log2, col_max, p_tile);
      mla_narrow::pv(st, t, p_addr, block_addr);
      __syncwarp();
      if (t.lane == 0) {
        // This group's V column blocks go back to the producer.
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
          const int c = t.warpgroup * 4 + mi;
          mbarrier_arrive_count(&empty[slot_of(c)], c == 4 ? 1 : 2);
        }
      }
    }
    // col_sum is read here and written again only after the next segment's
    // tiles, which pass this group's barriers.
    mla_narrow::finish_segment(d, st, t, seg, row, col_sum, out);
  }
#endif
}

// ---- The ping-pong variants (MlaDecodeKernel::kTmaPingPong*, on 18 slots).
// The loader is kTma's (a column block a round into a
// ring of column-block slots: CTA tile T's column block c in slot (9 T + c) %
// kSlots), and warpgroup g computes the CTA's tiles of parity g (T % 2 == g;
// with 18 slots that is stage g): all of S^T (36 dependent m64n16k16, no half
// to swap), the softmax with its own running maxima and sums, and O^T over all
// 512 latent dims (8 m-tiles, 64 accumulator registers a thread). A slot has
// one reading group a use: its 4 warps release it with 2 counts each (the rope
// block after S, the others after P V). The groups meet only at a segment's
// start (Q) and end, where group 1 hands its maxima, sums and O^T to group 0
// through shared memory of its own (two mbarriers, every thread of a group
// arriving: group 1 arrives on hand_full once a part is written and, before it
// writes the next, waits on hand_empty for group 0 to have read the last; group
// 0 waits on hand_full, reads, arrives on hand_empty; v14, replacing v12's
// bar.arrive / bar.sync pair that racecheck reported) and
// group 0 writes the combined result: m = max(m0, m1), a_g = 2^(m_g - m),
// O = (O0 a0 + O1 a1) / (l0 a0 + l1 a1). A group without a tile in the segment
// has m = kNoScore, l = 0, O = 0 and weighs nothing. Between tiles the groups
// synchronize only with themselves (named barrier 1 + g) and with the producer
// (mbarriers), so one group's softmax and barriers run while the other's MMAs
// do. kSplitPartials (kTmaPingPongSplit*): no hand-over at all; each group
// writes its own normalized O^T and log2-sum-exp as workspace record 2 x
// segment + g and the merge pass combines them. Without kTurns no named
// barrier forces an order (tiles land alternately, which alternates the
// groups); with kTurns group g waits for its
// turn (named barrier 6 + g) before its S^T MMAs and gives the turn to the
// other group once they are done, so the groups' S^T chains alternate strictly
// (the CTA's tiles by their index over all segments: group 1 gives the first
// turn at the start; the one arrival left at the end is consumed there) and a
// group's softmax and P V run beside the other's S^T. kFastExp: softmax_tile's
// fast exp (the scale folded into the exponent's FFMA, ex2.approx.ftz).
// kSChains: s_full's accumulator chains (2: another summation order of S^T).
// FlashMLA's 64-head kernel instead shares P and the running maxima between its
// groups every tile, because there each group can hold only half of a 64 x 512
// O; at 16 heads a group holds all of O^T.
constexpr int kMTiles = 8;  // 512 latent dims / 64

// Shared memory: Q | kSlots slots | P^T [2 groups] | column maxima [2][4][16] |
// column sums [2][4][16] | group 1's maxima and sums [2][16] | group 1's O^T in
// kHandParts parts (all of it where it fits: 18 slots; in two halves on 23) |
// mbarriers: full [slot], empty [slot], the hand-over's full and empty. The
// hand-over has room of its own, so the next segment's Q never meets it.
template <int kSlots>
struct PingPongLayout {
  static constexpr int kTilesAt = kQBytes;
  static constexpr int kPAt = kTilesAt + kSlots * kBlockBytes;
  static constexpr int kMaxAt = kPAt + 2 * kHeads * 128;
  static constexpr int kSumAt = kMaxAt + 2 * 4 * kHeads * 4;
  static constexpr int kHandAt = kSumAt + 2 * 4 * kHeads * 4;
  static constexpr int kHandOAt = kHandAt + 2 * kHeads * 4;
  static constexpr int kOBytes = kMTiles * 8 * 128 * 4;  // a group's O^T, 8 floats a thread per m-tile
  static constexpr int kBarrierBytes = (2 * kSlots + 2) * 8;  // full, empty [slot]; hand-over full, empty
  static constexpr int kHandParts = kHandOAt + kOBytes + kBarrierBytes + 1024 <= 232448 ? 1 : 2;
  static constexpr int kBarriersAt = kHandOAt + kOBytes / kHandParts;
  static constexpr int kSmemBytes = kBarriersAt + kBarrierBytes + 1024;
  // With the merge paired (launches of MlaDecodeDescriptor::paired_merge only): the receive area and its
  // mbarrier (mla_decode_pair.cuh) after the barriers.
  static constexpr int kPairAt = (kBarriersAt + kBarrierBytes + 15) / 16 * 16;
  static constexpr int kPairedSmemBytes = kPairAt + mla_pair::kBytes + 1024;
  static_assert(kTilesAt % 1024 == 0 && kPAt % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
  static_assert(kSmemBytes <= 232448, "fits an SM");
  static_assert(kHandParts > 1 || kPairedSmemBytes <= 232448, "the paired layout fits an SM");
  static_assert(kSlots % (2 * kColumnBlocks) == 0, "a slot keeps one group's column block (parity waits)");
};

// S^T over all 576 K dims of the tile (column block c waited for before its
// first MMA). kChains 1: one chain of 36 dependent MMAs; 2: the even and the
// odd K steps in two independent accumulators (so consecutive MMAs need not
// wait for each other), added at the end: another summation order.
template <int kChains = 1, class BlockAddr, class WaitBlock>
__device__ __forceinline__ void s_full(float (&s)[8], uint32_t q_addr, BlockAddr block_addr, WaitBlock wait_block) {
  static_assert(kChains == 1 || kChains == 2, "one or two accumulator chains");
  float s_odd[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = s_odd[i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kMlaKeyDim / 16; ++ks) {
    if ((ks & 3) == 0) {
      wait_block(ks >> 2);
      wgmma_fence();
    }
    const uint64_t desc_k = make_smem_desc_sw128(block_addr(ks >> 2) + (ks & 3) * 32, 16, 1024);
    const uint64_t desc_q =
        make_smem_desc_sw128(q_addr + (ks >> 2) * mla_narrow::kQBlockBytes + (ks & 3) * 32, 16, 1024);
    if (kChains == 2 && (ks & 1)) mla_narrow::wgmma_m64n16k16<0>(s_odd, desc_k, desc_q, ks > 1);
    else mla_narrow::wgmma_m64n16k16<0>(s, desc_k, desc_q, ks >= kChains);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mla_narrow::keep_in_order(s[i]);
    if (kChains == 2) {
      mla_narrow::keep_in_order(s_odd[i]);
      s[i] += s_odd[i];
    }
  }
}

// O^T[all 8 m-tiles] += V^T P^T (V^T = column blocks 0..7, MN-major).
template <class BlockAddr>
__device__ __forceinline__ void pv_full(mla_narrow::SegmentStateOf<kMTiles>& st, uint32_t p_addr,
                                        BlockAddr block_addr) {
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
      mla_narrow::wgmma_m64n16k16<1>(st.o[mi], make_smem_desc_sw128(block_addr(mi) + kk * 16 * 128, kBlockBytes, 1024),
                                     desc_p, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int i = 0; i < 8; ++i) mla_narrow::keep_in_order(st.o[mi][i]);
}

// kBulk (kBulkPingPongTwoChains): the latent is swizzled pages (MlaLatentLayout::kBf16SwizzledPages), so a
// tile's column block is one contiguous piece of each page it spans, already in the tile's swizzled layout:
// the producer issues 1-D bulk copies (no tensor map) of min(block_size, 64) rows x 128 B, one a page, where
// the other variants issue tensor-map boxes. The compute side is the same, so are the results, bit for bit.
template <int kSlots, bool kFastExp, bool kTurns, int kSChains, bool kSplitPartials, bool kBulk = false>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_tma_pingpong_kernel(const MlaDecodeDescriptor d, const __grid_constant__ CUtensorMap latent_map,
                                   const __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ out) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  using L = PingPongLayout<kSlots>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_address(smem_raw);
  uint8_t* base = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  uint8_t* tiles = base + L::kTilesAt;
  uint64_t* full = reinterpret_cast<uint64_t*>(base + L::kBarriersAt);  // [slot]
  uint64_t* empty = full + kSlots;                                     // [slot]
  uint64_t* hand_full = empty + kSlots;  // group 1's 128 threads arrive once a hand-over part is written
  uint64_t* hand_empty = hand_full + 1;  // group 0's 128 threads arrive once they have read it
  const int tid = threadIdx.x;
  const int lane = tid & 31;

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      mbarrier_init(&full[i], 1);
      // Each of the 4 warps of the one group reading the slot arrives with 2.
      mbarrier_init(&empty[i], kConsumerThreads / 32);
    }
    mbarrier_init(hand_full, 128);
    mbarrier_init(hand_empty, 128);
    if (d.paired_merge)
      mbarrier_init(reinterpret_cast<uint64_t*>(base + L::kPairAt + mla_pair::kReceiveBytes), mla_pair::kGroupThreads);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (d.paired_merge) mla_pair::cluster_sync();  // the partner's pair_arrived is initialized

  const int seg_begin = d.cta_segment_start[blockIdx.y];
  const int seg_end = d.cta_segment_start[blockIdx.y + 1];

  if (tid >= kConsumerThreads) {
    // ---- Producer warp: kTma's schedule (per column block: wait for its
    // slot, arm it, lanes 0..pages-1 issue one box each).
    const int bs = d.block_size;
    const int box_rows = bs < kTile ? bs : kTile;
    const int pages = kTile / box_rows;
    const uint64_t policy = evict_first_policy();
    int next = 0;
    for (int seg = seg_begin; seg < seg_end; ++seg) {
      const int row = d.segments[3 * seg];
      const int kv_begin = d.segments[3 * seg + 1];
      const int kv_end = d.segments[3 * seg + 2];
      const int32_t* table = d.block_tables + d.block_table_start[row];
      for (int kv0 = kv_begin; kv0 < kv_end; kv0 += kTile) {
        const int live_pages = min(pages, (kv_end - kv0 + box_rows - 1) / box_rows);
        const uint32_t bytes = uint32_t(live_pages * box_rows * 128);
        const int pos = kv0 + lane * box_rows;
        const int page_slot = lane < live_pages ? __ldg(table + pos / bs) * bs + pos % bs : 0;
        // kBulk: this lane's page rows [pos % bs, + box_rows) of column block 0 (block * bs * 1,152 bytes in,
        // then the row); column block cb is bs * 128 bytes further.
        const int64_t page = lane < live_pages ? __ldg(table + pos / bs) : 0;
        const uint8_t* piece = static_cast<const uint8_t*>(d.latent) + page * bs * (kMlaKeyDim * 2) +
                               int64_t{lane < live_pages ? pos % bs : 0} * 128;
#pragma unroll 1
        for (int cb = 0; cb < kColumnBlocks; ++cb, ++next) {
          const int slot = next % kSlots;
          const int use = next / kSlots;
          if (use > 0) mbarrier_wait(&empty[slot], (use - 1) & 1);
          if (lane == 0) mbarrier_arrive_expect_tx(&full[slot], bytes);
          __syncwarp();
          if (lane < live_pages) {
            if constexpr (kBulk)
              bulk_load_hint(tiles + slot * kBlockBytes + lane * box_rows * 128, piece + int64_t{cb} * bs * 128,
                             uint32_t(box_rows * 128), &full[slot], policy);
            else
              tma_load_3d_hint(tiles + slot * kBlockBytes + lane * box_rows * 128, &latent_map, 0, cb, page_slot,
                               &full[slot], policy);
          }
        }
      }
    }
    launch_dependents();  // the producer is done: only the compute groups hold the trigger back
    return;
  }

  // ---- Compute warpgroups: group g takes the CTA's tiles of parity g.
  const mla_narrow::ThreadPlace t = mla_narrow::thread_place(tid);
  const int g = t.warpgroup;
  const int gtid = tid & 127;  // thread within the group
  uint8_t* q_tile = base;
  uint8_t* p_tile = base + L::kPAt + g * kHeads * 128;
  float* col_max = reinterpret_cast<float*>(base + L::kMaxAt) + g * 4 * kHeads;
  float* col_sum = reinterpret_cast<float*>(base + L::kSumAt) + g * 4 * kHeads;
  float* hand_m = reinterpret_cast<float*>(base + L::kHandAt);  // group 1's maxima [16]
  float* hand_l = hand_m + kHeads;                              // group 1's sums [16]
  float* hand_o = reinterpret_cast<float*>(base + L::kHandOAt);  // a part of group 1's O^T [floats][128]
  const uint32_t q_addr = smem_address(q_tile);
  const uint32_t p_addr = smem_address(p_tile);
  const uint32_t tiles_addr = smem_address(tiles);
  auto consumers_barrier = [] { named_barrier_sync(kConsumersBarrier, kConsumerThreads); };
  constexpr float kNoPositionScale[2] = {1.0f, 1.0f};

  constexpr int kPartTiles = kMTiles / L::kHandParts;  // O^T m-tiles a hand-over part
  if (kTurns && g == 1) named_barrier_arrive(kTurnBarrier, kConsumerThreads);  // group 0 has the first turn

  int it = 0;  // tiles of this CTA before the current segment's, over all its segments
  for (int seg = seg_begin; seg < seg_end; ++seg) {
    const int row = d.segments[3 * seg];
    const int kv_begin = d.segments[3 * seg + 1];
    const int kv_end = d.segments[3 * seg + 2];
    const int num_tiles = (kv_end - kv_begin + kTile - 1) / kTile;

    // Both groups are past their last S^T (Q is free; the hand-over's reuse is
    // ordered by its own mbarriers).
    consumers_barrier();
    mla_narrow::issue_q(q_tile, q, row, d.num_heads, tid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    consumers_barrier();

    mla_narrow::SegmentStateOf<kMTiles> st;
    mla_narrow::reset(st);
    // This group's first tile of the segment: the first of parity g.
    for (int tile = ((g - it) & 1); tile < num_tiles; tile += 2) {
      const int kv0 = kv_begin + tile * kTile;
      const int first = ((it + tile) * kColumnBlocks) % kSlots;
      const int first_use = ((it + tile) * kColumnBlocks) / kSlots;
      auto slot_of = [&](int c) { return first + c < kSlots ? first + c : first + c - kSlots; };
      auto parity_of = [&](int c) { return uint32_t((first_use + (first + c < kSlots ? 0 : 1)) & 1); };
      auto block_addr = [&](int c) { return tiles_addr + uint32_t(slot_of(c) * kBlockBytes); };
      auto wait_block = [&](int c) { mbarrier_wait(&full[slot_of(c)], parity_of(c)); };
      const int valid_rows = kv_end - kv0;
      if (valid_rows < kTile) {
        // Rows past the segment: zeros, once every box has landed.
#pragma unroll
        for (int cb = 0; cb < kColumnBlocks; ++cb) wait_block(cb);
        for (int idx = gtid; idx < (kTile - valid_rows) * kKeyChunks; idx += 128) {
          const int r = valid_rows + idx / kKeyChunks, c = idx % kKeyChunks;
          *reinterpret_cast<uint4*>(tiles + slot_of(c >> 3) * kBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4)) =
              make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async_shared();
        mla_narrow::group_barrier(g);
      }
      float s[8];
      if (kTurns) named_barrier_sync(kTurnBarrier + g, kConsumerThreads);
      s_full<kSChains>(s, q_addr, block_addr, wait_block);
      if (kTurns) named_barrier_arrive(kTurnBarrier + (1 - g), kConsumerThreads);
      __syncwarp();
      if (t.lane == 0) mbarrier_arrive_count(&empty[slot_of(8)], 2);  // the rope block: S only
      mla_narrow::softmax_tile<kFastExp>(s, st, t, valid_rows, kNoPositionScale, d.scale_log2, col_max, p_tile);
      pv_full(st, p_addr, block_addr);
      __syncwarp();
      if (t.lane == 0) {
#pragma unroll
        for (int c = 0; c < 8; ++c) mbarrier_arrive_count(&empty[slot_of(c)], 2);
      }
    }
    it += num_tiles;
    // The merge pass (programmatic_merge) may be scheduled once every CTA is
    // past its last tile (FlashMLA's point): its CTAs' launch then overlaps
    // the grid's epilogues and tail instead of taking SM slots all along.
    if (seg + 1 == seg_end) launch_dependents();

    float sum[4];
    mla_narrow::group_head_sums(st, t, col_sum, sum);
    if constexpr (kSplitPartials) {
      // No hand-over: this group's normalized partial O^T and log2-sum-exp are
      // record 2 x seg + g of the workspace, which the merge pass combines. A
      // group without a tile in the segment (l = 0) writes O = 0 and
      // lse = kNoScore, which weighs nothing there.
      const int heads_here = min(kHeads, d.num_heads);
      float* lse = d.workspace + int64_t{2} * d.num_segments * d.num_heads * kMlaLatentDim;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int h = 8 * j + t.col + e;
          if (h >= heads_here) continue;
          const int k = 2 * j + e;
          const bool any = sum[k] > 0.0f;
          const float inv = any ? 1.0f / sum[k] : 0.0f;
          const int64_t at = (int64_t{2} * seg + g) * d.num_heads + h;
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int i = 0; i < 2; ++i)
              d.workspace[at * kMlaLatentDim + mi * 64 + t.row0 + 8 * i] = st.o[mi][4 * j + 2 * i + e] * inv;
          if (t.lane < 4 && t.wg_warp == 0) lse[at] = any ? st.m[k] + log2f(sum[k]) : mla_narrow::kNoScore;
        }
      continue;
    }
    // The hand-over's uses so far in this CTA (kHandParts a segment): use u
    // completes phase u of hand_full (group 1 wrote it) and of hand_empty
    // (group 0 read it); group 1 writes use u only after phase u - 1 of
    // hand_empty, so neither side is ever more than one phase ahead.
    const int use0 = (seg - seg_begin) * L::kHandParts;
    if (g == 1) {
      // Group 1's maxima and sums (the maxima are the same in every thread of
      // the group for a head; warp 0's lanes 0..3 hold all 16 heads), then its
      // O^T part by part.
#pragma unroll
      for (int part = 0; part < L::kHandParts; ++part) {
        const int u = use0 + part;
        if (u > 0) mbarrier_wait(hand_empty, (u - 1) & 1);  // group 0 has read the last use
        if (part == 0) mla_narrow::hand_over_stats(st, t, sum, hand_m, hand_l);
#pragma unroll
        for (int mi = 0; mi < kPartTiles; ++mi)
#pragma unroll
          for (int i = 0; i < 8; ++i) hand_o[(mi * 8 + i) * 128 + gtid] = st.o[part * kPartTiles + mi][i];
        mbarrier_arrive(hand_full);  // release: this thread's writes above
      }
      continue;  // group 0 writes the segment's result
    }
    mbarrier_wait(hand_full, use0 & 1);  // group 1's maxima, sums and first part are in (acquire)
    float w0[4], w1[4];  // the weights of the two partial states per head
    mla_narrow::hand_over_weights(st, t, sum, hand_m, hand_l, w0, w1);
#pragma unroll
    for (int part = 0; part < L::kHandParts; ++part) {
      if (part > 0) mbarrier_wait(hand_full, (use0 + part) & 1);
#pragma unroll
      for (int mi = 0; mi < kPartTiles; ++mi)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int k = 2 * ((i >> 2) & 1) + (i & 1);  // the head of entry i: 8 j + col + e, i = 4 j + 2 r + e
          float& o = st.o[part * kPartTiles + mi][i];
          o = o * w0[k] + hand_o[(mi * 8 + i) * 128 + gtid] * w1[k];
        }
      mbarrier_arrive(hand_empty);  // done with this use (group 1 may write the next)
    }
    const int row_first = d.row_segment_start[row];
    if (d.paired_merge && d.row_segment_start[row + 1] - row_first == 2) {
      // The receive area and its mbarrier, addressed from hand_o (base itself is not kept past the set-up:
      // live across the tile loop, it spilled).
      uint8_t* pair = reinterpret_cast<uint8_t*>(hand_o) - L::kHandOAt + L::kPairAt;
      mla_pair::exchange_and_store(d, st, t, sum, row, seg - row_first, gtid, reinterpret_cast<float*>(pair),
                                   reinterpret_cast<uint64_t*>(pair + mla_pair::kReceiveBytes), nullptr, out);
      continue;
    }
    mla_narrow::store_handed_over(d, st, t, sum, seg, row, out);
    mla_merge::publish_record(d, row, gtid, [] { mla_narrow::group_barrier(0); });
  }
  // The turn given after the CTA's last tile (or group 1's first, if no tile)
  // is left on the barrier of the group of the tile after it: that group takes it.
  if (kTurns && g == (it & 1)) named_barrier_sync(kTurnBarrier + g, kConsumerThreads);
  if (d.fused_merge)  // the merge folded in (mla_decode_merge.cuh)
    mla_merge::combine_held_rows<kConsumerThreads>(d, seg_begin, seg_end, tid, consumers_barrier, out);
#endif
}

// The driver's tensor-map encoder, looked up once; null if absent.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The bf16 latent pool [slots][576] as [slots][9 column blocks][64 values];
// a box is one column block of min(block_size, 64) consecutive slots.
cudaError_t make_latent_tensor_map(CUtensorMap* map, const MlaDecodeDescriptor& d) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {64, kColumnBlocks, cuuint64_t(int64_t{d.num_blocks} * d.block_size)};
  const cuuint64_t strides[2] = {64 * sizeof(__nv_bfloat16), kMlaKeyDim * sizeof(__nv_bfloat16)};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(d.block_size < kTile ? d.block_size : kTile)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(d.latent), dims, strides,
                            box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorNotSupported;
}

// Raises one variant's shared-memory limit.
template <int kSlots, bool kWholeTile, int kCtasPerSm = 1, bool kFastExp = false>
cudaError_t allow_shared_memory() {
  static_assert((Layout<kSlots>::kSmemBytes + 1024) * kCtasPerSm <= 233472, "the CTAs fit an SM's shared memory");
  const auto kernel = mla_decode_tma_kernel<kSlots, kWholeTile, kCtasPerSm, kFastExp>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<kSlots>::kSmemBytes);
  if (e != cudaSuccess || kCtasPerSm == 1) return e;
  // All of the SM's unified L1 / shared memory as shared, so that the CTAs fit together.
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

template <int kSlots, bool kWholeTile, int kCtasPerSm = 1, bool kFastExp = false>
cudaError_t occupancy_of(int* ctas_per_sm) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm,
                                                       mla_decode_tma_kernel<kSlots, kWholeTile, kCtasPerSm, kFastExp>,
                                                       kThreads, Layout<kSlots>::kSmemBytes);
}

template <int kSlots, bool kFastExp = false, bool kTurns = false, int kSChains = 1, bool kSplitPartials = false,
          bool kBulk = false>
cudaError_t allow_pingpong_shared_memory() {
  using L = PingPongLayout<kSlots>;
  return cudaFuncSetAttribute(mla_decode_tma_pingpong_kernel<kSlots, kFastExp, kTurns, kSChains, kSplitPartials, kBulk>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              L::kHandParts == 1 ? L::kPairedSmemBytes : L::kSmemBytes);
}

template <int kSlots, bool kFastExp = false, bool kTurns = false, int kSChains = 1, bool kSplitPartials = false,
          bool kBulk = false>
cudaError_t pingpong_occupancy_of(int* ctas_per_sm) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      ctas_per_sm, mla_decode_tma_pingpong_kernel<kSlots, kFastExp, kTurns, kSChains, kSplitPartials, kBulk>, kThreads,
      PingPongLayout<kSlots>::kSmemBytes);
}

template <int kSlots, bool kFastExp = false, bool kTurns = false, int kSChains = 1, bool kSplitPartials = false,
          bool kBulk = false>
cudaError_t launch_pingpong(const MlaDecodeDescriptor& d, const CUtensorMap& map, const __nv_bfloat16* q,
                            __nv_bfloat16* out, cudaStream_t stream) {
  constexpr auto kernel = mla_decode_tma_pingpong_kernel<kSlots, kFastExp, kTurns, kSChains, kSplitPartials, kBulk>;
  using L = PingPongLayout<kSlots>;
  if (d.paired_merge && (kSplitPartials || L::kHandParts != 1)) return cudaErrorInvalidValue;
  return mla_merge::launch_decode(kernel, d, kThreads, d.paired_merge ? L::kPairedSmemBytes : L::kSmemBytes, stream,
                                  d, map, q, out);
}

template <int kSlots, bool kWholeTile, int kCtasPerSm = 1, bool kFastExp = false>
cudaError_t launch_variant(const MlaDecodeDescriptor& d, const CUtensorMap& map, const __nv_bfloat16* q,
                           __nv_bfloat16* out, cudaStream_t stream) {
  mla_decode_tma_kernel<kSlots, kWholeTile, kCtasPerSm, kFastExp>
      <<<dim3(1, d.num_ctas), kThreads, Layout<kSlots>::kSmemBytes, stream>>>(d, map, q, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_mla_decode_tma_kernel() {
  static const cudaError_t prepared = [] {
    tensor_map_encoder();  // a miss is reported per launch (the caller falls back)
    for (const cudaError_t e :
         {allow_shared_memory<kTwoStageSlots, false>(), allow_shared_memory<kTwoStageSlots, true>(),
          allow_shared_memory<kPairSlots, false, 2>(), allow_shared_memory<kPairSlots, true, 2>(),
          allow_pingpong_shared_memory<kTwoStageSlots>(),
          allow_shared_memory<kTwoStageSlots, false, 1, true>(), allow_pingpong_shared_memory<kTwoStageSlots, true>(),
          allow_pingpong_shared_memory<kTwoStageSlots, false, true>(),
          allow_pingpong_shared_memory<kTwoStageSlots, false, false, 2>(),
          allow_pingpong_shared_memory<kTwoStageSlots, true, true, 2>(),
          allow_pingpong_shared_memory<kTwoStageSlots, false, false, 1, true>(),
          allow_pingpong_shared_memory<kTwoStageSlots, false, false, 2, true>(),
          allow_pingpong_shared_memory<kTwoStageSlots, false, false, 2, false, true>()})
      if (e != cudaSuccess) return e;
    return cudaSuccess;
  }();
  return prepared;
}

cudaError_t mla_decode_tma_occupancy(MlaDecodeKernel kernel, int* ctas_per_sm) {
  *ctas_per_sm = 0;
  const cudaError_t prepared = prepare_mla_decode_tma_kernel();
  if (prepared != cudaSuccess) return prepared;
  switch (kernel) {
    case MlaDecodeKernel::kTma: return occupancy_of<kTwoStageSlots, false>(ctas_per_sm);
    case MlaDecodeKernel::kTmaTile: return occupancy_of<kTwoStageSlots, true>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPair: return occupancy_of<kPairSlots, false, 2>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPairTile: return occupancy_of<kPairSlots, true, 2>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPong: return pingpong_occupancy_of<kTwoStageSlots>(ctas_per_sm);
    case MlaDecodeKernel::kTmaFastExp: return occupancy_of<kTwoStageSlots, false, 1, true>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPongFastExp: return pingpong_occupancy_of<kTwoStageSlots, true>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPongTurns: return pingpong_occupancy_of<kTwoStageSlots, false, true>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPongTwoChains:
      return pingpong_occupancy_of<kTwoStageSlots, false, false, 2>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPongAll: return pingpong_occupancy_of<kTwoStageSlots, true, true, 2>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPongSplit:
      return pingpong_occupancy_of<kTwoStageSlots, false, false, 1, true>(ctas_per_sm);
    case MlaDecodeKernel::kTmaPingPongSplitTwoChains:
      return pingpong_occupancy_of<kTwoStageSlots, false, false, 2, true>(ctas_per_sm);
    case MlaDecodeKernel::kBulkPingPongTwoChains:
      return pingpong_occupancy_of<kTwoStageSlots, false, false, 2, false, true>(ctas_per_sm);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_mla_decode_tma_main(const MlaDecodeDescriptor& d, const void* q, void* out, cudaStream_t stream) {
  // The tensor-map kernels read token-major rows; the bulk kernel reads swizzled pages. Both need pages that
  // a 64-position tile divides into whole pieces of >= 8 rows, or lies within.
  const bool bulk = d.kernel == MlaDecodeKernel::kBulkPingPongTwoChains;
  const MlaLatentLayout layout = bulk ? MlaLatentLayout::kBf16SwizzledPages : MlaLatentLayout::kPerVectorScale;
  const bool domain = d.latent_element == KvElement::kBF16 && d.latent_layout == layout && d.num_heads <= kHeads &&
                      d.num_blocks > 0 && mla_tile_pieces_fit(d.block_size);
  if (!domain) return cudaErrorNotSupported;
  const cudaError_t prepared = prepare_mla_decode_tma_kernel();
  if (prepared != cudaSuccess) return prepared;
  if (d.num_ctas == 0) return cudaSuccess;
  CUtensorMap map{};  // the bulk kernel takes none (its parameter stays zeros)
  if (!bulk) {
    const cudaError_t e = make_latent_tensor_map(&map, d);
    if (e != cudaSuccess) return e;
  }
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  switch (d.kernel) {
    case MlaDecodeKernel::kBulkPingPongTwoChains:
      return launch_pingpong<kTwoStageSlots, false, false, 2, false, true>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaTile: return launch_variant<kTwoStageSlots, true>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPair: return launch_variant<kPairSlots, false, 2>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPairTile: return launch_variant<kPairSlots, true, 2>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPong: return launch_pingpong<kTwoStageSlots>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaFastExp: return launch_variant<kTwoStageSlots, false, 1, true>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPongFastExp: return launch_pingpong<kTwoStageSlots, true>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPongTurns:
      return launch_pingpong<kTwoStageSlots, false, true>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPongTwoChains:
      return launch_pingpong<kTwoStageSlots, false, false, 2>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPongAll:
      return launch_pingpong<kTwoStageSlots, true, true, 2>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPongSplit:
      return launch_pingpong<kTwoStageSlots, false, false, 1, true>(d, map, qb, ob, stream);
    case MlaDecodeKernel::kTmaPingPongSplitTwoChains:
      return launch_pingpong<kTwoStageSlots, false, false, 2, true>(d, map, qb, ob, stream);
    default: return launch_variant<kTwoStageSlots, false>(d, map, qb, ob, stream);
  }
}

}  // namespace pagoda::kernels::cuda
