#pragma once
// The device-side contract of the paged MLA decode (mla_decode.h has the
// whole story and the planner): the descriptor the kernels read and the
// launches. C++17 (included from .cu files).
//
// Thread safety: launches are stream-ordered; the descriptor is a plain value.

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"

namespace pagoda::kernels::cuda {

inline constexpr int32_t kMlaLatentDim = 512;  // kv_lora_rank: V dim and the first K values
inline constexpr int32_t kMlaRopeDim = 64;     // qk_rope_head_dim
inline constexpr int32_t kMlaKeyDim = kMlaLatentDim + kMlaRopeDim;

// How the latent is stored.
enum class MlaLatentLayout : int32_t {
  // bf16: token-major rows of 576 values. fp8: runtime/kv_quant.h's fp8, 576
  // codes a vector in the pool's codes, one f32 scale record a vector in
  // latent_scale.
  kPerVectorScale = 0,
  // fp8 only: FlashMLA's 656-byte records (runtime/mla_fp8_layout.h): 512
  // codes, 4 f32 scales (one per 128 latent values), the 64 rope values in
  // bf16; no separate scale records.
  kFlashMla656 = 1,
  // bf16 only, block_size % 8 == 0: swizzled pages (runtime/mla_latent_layout.h,
  // kSwizzled128): a page is 9 column blocks of block_size rows x 128 bytes,
  // each row's 16-byte chunks XOR-swizzled by the row, so a column block copies
  // into the kernels' tile layout as is. The cp.async kernels read it; the
  // tensor-map (TMA) kernels do not (their boxes assume token-major rows).
  kBf16SwizzledPages = 2,
};

// The block sizes of the kernels that fill a 64-position tile by whole page
// pieces (the tensor-map kernels' boxes, the bulk kernel's copies): pages the
// tile divides into pieces of >= 8 rows (8, 16, 32), or that hold whole tiles.
constexpr bool mla_tile_pieces_fit(int32_t block_size) {
  return block_size > 0 && (block_size % 64 == 0 || block_size == 8 || block_size == 16 || block_size == 32);
}

// Which decode kernel a plan launches.
enum class MlaDecodeKernel : int32_t {
  kDefault = 0,  // plan option only: the environment's choice (mla_decode.h)
  // Every format and head count: the compute threads gather tiles with 16-byte
  // cp.async through the block table.
  kCpAsync = 1,
  // bf16 latent, at most 16 heads, block_size 8 / 16 / 32 / multiple of 64: a
  // producer warp loads the tiles with tensor-map copies (TMA) into two stages
  // of whole tiles, one mbarrier per column block (mla_decode_tma.cu).
  kTma = 2,
  // 3, 5, 9: the 23-slot ring variants (kTmaRing, kTmaRingTile,
  // kTmaPingPongRing), removed: their slots changed readers from use to use,
  // so a reader's parity wait could run two phases ahead (docs/KERNELS.md v17),
  // and they measured no faster.
  // kTma's two stages with v8's producer schedule: one wait for a whole tile's
  // 9 slots, then all of its boxes issued at once (kTma: one column block a
  // round). Same results bit for bit.
  kTmaTile = 4,
  // kTma's domain and math with one tile's 9 column-block slots (112 KB of
  // shared memory) and two CTAs per SM (the plan schedules 2 x num_sms CTAs):
  // one CTA's loads and barriers overlap the other's MMAs. kTmaPair issues a
  // column block a round, kTmaPairTile a whole tile.
  kTmaPair = 6,
  kTmaPairTile = 7,
  // kTma's domain, loader (two stages, a column block a round) and plan, with
  // the two compute warpgroups each owning whole tiles (FlashMLA's schedule):
  // warpgroup g computes the CTA's tiles of parity g (all of S^T and all 512
  // latent dims of O^T), so one group's softmax runs beside the other's MMAs
  // and no CTA-wide barrier separates tiles; the two partial results of a
  // segment are combined at its end. Not bit-equal to kTma (S^T is summed in
  // one chain, the partial O^T combined): within the tests' bound.
  kTmaPingPong = 8,
  // kTma with the softmax shortened: the scale folded into the exponent's
  // FFMA, exp2 as a bare ex2.approx.ftz (other roundings: within the tests'
  // bound, not bit-equal to kTma).
  kTmaFastExp = 10,
  // kTmaPingPong with kTmaFastExp's softmax (within the tests' bound).
  kTmaPingPongFastExp = 11,
  // kTmaPingPong with turns: the two groups' S^T MMA chains strictly alternate
  // (named barriers), so one group's softmax and P V run beside the other's
  // S^T, as FlashMLA orders them. Same arithmetic as kTmaPingPong.
  kTmaPingPongTurns = 12,
  // kTmaPingPong with S^T in two independent accumulator chains (even and odd
  // K steps, added at the end): another summation order, within the tests' bound.
  kTmaPingPongTwoChains = 13,
  // kTmaPingPong with all three of the above: fast exp, turns, two chains.
  kTmaPingPongAll = 14,
  // kTmaPingPong without a hand-over between the groups: each warpgroup ends a
  // segment by writing its own normalized partial O and log2-sum-exp to the
  // split workspace (two records a segment, group g's at 2 x segment + g) and
  // the merge pass combines them with the row's other records, so the groups
  // share no shared memory but Q. The merge pass always runs. Within the
  // tests' bound of kTmaPingPong (another combination order).
  kTmaPingPongSplit = 15,
  // kTmaPingPongSplit with kTmaPingPongTwoChains' S^T (two accumulator chains).
  kTmaPingPongSplitTwoChains = 16,
  // FlashMLA's 656-byte fp8 records (kFlashMla656), at most 16 heads, block
  // sizes that are multiples of 16 or divide 16: kTmaPingPongTwoChains'
  // schedule and math, the records copied raw by the producer warp (1-D bulk
  // copies into slots of 16 records) and dequantized to bf16 by the compute
  // group that owns the tile (mla_decode_tma_fp8.cu). The same bf16 values as
  // the cp.async kernel's conversion; within the tests' bound.
  kTmaFp8 = 17,
  // kTmaPingPongTwoChains over swizzled bf16 pages (kBf16SwizzledPages), at
  // most 16 heads, block sizes 8 / 16 / 32 / multiples of 64: the producer warp
  // fills each column-block slot with 1-D bulk copies, one a page (a column
  // block of a page is one contiguous piece already in the tile's swizzle), no
  // tensor map. The same tiles and math as kTmaPingPongTwoChains on the
  // token-major copy of the pool: the same bits (docs/MLA_SWIZZLED_PAGES.md).
  kBulkPingPongTwoChains = 18,
};

// The TMA-fed variants (kTma .. kTmaPingPongSplitTwoChains over bf16 latents, kTmaFp8 over
// FlashMLA's fp8 records, kBulkPingPongTwoChains over swizzled bf16 pages).
constexpr bool is_tma_kernel(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kTma || k == MlaDecodeKernel::kTmaTile || k == MlaDecodeKernel::kTmaPair ||
         k == MlaDecodeKernel::kTmaPairTile || k == MlaDecodeKernel::kTmaPingPong ||
         k == MlaDecodeKernel::kTmaFastExp || k == MlaDecodeKernel::kTmaPingPongFastExp ||
         k == MlaDecodeKernel::kTmaPingPongTurns || k == MlaDecodeKernel::kTmaPingPongTwoChains ||
         k == MlaDecodeKernel::kTmaPingPongAll || k == MlaDecodeKernel::kTmaPingPongSplit ||
         k == MlaDecodeKernel::kTmaPingPongSplitTwoChains || k == MlaDecodeKernel::kTmaFp8 ||
         k == MlaDecodeKernel::kBulkPingPongTwoChains;
}

// Partial records a kernel writes per segment into the split workspace (2:
// kTmaPingPongSplit*, one a compute warpgroup; such a plan always merges).
constexpr int mla_decode_partials_per_segment(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kTmaPingPongSplit || k == MlaDecodeKernel::kTmaPingPongSplitTwoChains ? 2 : 1;
}

// Kernels that can fold the merge in (MlaDecodeDescriptor::fused_merge): the
// ping-pong kernels whose groups hand over (tma_fp8 among them), so a segment
// is one record.
constexpr bool mla_decode_can_fuse_merge(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kTmaPingPong || k == MlaDecodeKernel::kTmaPingPongFastExp ||
         k == MlaDecodeKernel::kTmaPingPongTurns || k == MlaDecodeKernel::kTmaPingPongTwoChains ||
         k == MlaDecodeKernel::kTmaPingPongAll || k == MlaDecodeKernel::kBulkPingPongTwoChains ||
         k == MlaDecodeKernel::kTmaFp8;
}

// Kernels that can fold the merge in between the two CTAs of a cluster
// (MlaDecodeDescriptor::paired_merge, mla_decode_pair.cuh): the same as
// mla_decode_can_fuse_merge (the bf16 ping-pong kernels keep a receive area of
// their own, tma_fp8 lends its staging slots).
constexpr bool mla_decode_can_pair_merge(MlaDecodeKernel k) { return mla_decode_can_fuse_merge(k); }

// CTAs a kernel runs per SM (a head tile's wave is num_sms x this).
constexpr int mla_decode_ctas_per_sm(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kTmaPair || k == MlaDecodeKernel::kTmaPairTile ? 2 : 1;
}

// What the kernels read (device pointers; plain value, passed by value).
struct MlaDecodeDescriptor {
  int32_t num_rows = 0;
  int32_t num_heads = 0;
  int32_t block_size = 0;
  int32_t num_blocks = 0;     // blocks in the pool (the TMA kernel's tensor-map extent)
  int32_t num_ctas = 0;       // CTAs per head tile
  int32_t num_segments = 0;
  int32_t max_splits = 1;     // most segments of one row: > 1 runs the merge pass (fixed plans: always 2)
  int32_t partials_per_segment = 1;  // workspace records a segment (mla_decode_partials_per_segment): > 1 merges
  float scale_log2 = 0.0f;    // scale * log2(e)
  KvElement latent_element = KvElement::kBF16;
  MlaLatentLayout latent_layout = MlaLatentLayout::kPerVectorScale;
  MlaDecodeKernel kernel = MlaDecodeKernel::kCpAsync;  // kDefault is not valid here
  // Launch the merge pass as a programmatic dependent launch: its CTAs are
  // scheduled while the decode grid runs (the ping-pong kernels allow it once
  // every CTA is past its last tile, the others at entry) and wait for its
  // results in griddepcontrol.wait, which hides the merge's launch latency.
  // Off: a plain launch after the decode grid.
  bool programmatic_merge = false;
  // The merge folded into the decode kernel (MlaDecodePlan::fused_merge; the
  // kernels of mla_decode_can_fuse_merge only): the CTAs holding a split row's
  // segments combine it themselves once all of its records are written
  // (mla_decode_merge.cuh), and padding rows get their zeros there, so no
  // merge pass runs. merge_counters: the plan arena's [num_rows][2] counters
  // (zero before a launch, and again after it).
  bool fused_merge = false;
  int32_t* merge_counters = nullptr;
  // The merge folded in between cluster pairs instead (MlaDecodePlan::paired_merge;
  // mla_decode_can_pair_merge kernels; fused_merge is then false): every split row
  // has two segments, the only segments of CTAs 2i and 2i + 1, which the launch
  // makes a cluster of two; they trade their records' halves in shared memory
  // (mla_decode_pair.cuh). num_ctas is even; no counters, no workspace reads.
  bool paired_merge = false;
  // Arena views: segments [num_segments][3] = (row, kv_begin, kv_end);
  // row_segment_start [num_rows + 1]; cta_segment_start [num_ctas + 1];
  // block_table_start [num_rows]; block_tables.
  const int32_t* segments = nullptr;
  const int32_t* row_segment_start = nullptr;
  const int32_t* cta_segment_start = nullptr;
  const int32_t* block_table_start = nullptr;
  const int32_t* block_tables = nullptr;
  const void* latent = nullptr;        // codes
  const float* latent_scale = nullptr;  // fp8 per-vector scales: the records; else null
  // Split rows: partial outputs [num_segments x partials_per_segment,
  // num_heads, 512] f32 (normalized), then log2-sum-exp [num_segments x
  // partials_per_segment, num_heads] (segment s's records at s x
  // partials_per_segment + p).
  float* workspace = nullptr;
};

// Raises the kernels' shared-memory limits (once; launches also do it on first
// use). Call before capturing a launch in a graph.
cudaError_t prepare_mla_decode_kernels();

// Enqueues the decode (and the merge pass when some row is split) on `stream`.
// q [num_rows, num_heads, 576] bf16, out [num_rows, num_heads, 512] bf16 (not
// aliasing q or the pool). Returns the launch error.
cudaError_t launch_mla_decode(const MlaDecodeDescriptor& desc, const void* q, void* out, cudaStream_t stream);

// Internal to launch_mla_decode (mla_decode_tma.cu): raises the TMA kernel's
// shared-memory limit and looks up the driver's tensor-map encoder (once);
// enqueues only the TMA kernel's main pass (the caller runs the merge).
// cudaErrorNotSupported when the driver has no tensor-map encoder, the pool
// cannot be described as a tensor map, or the descriptor is outside the
// kernel's domain (the planner's tma_applies).
cudaError_t prepare_mla_decode_tma_kernel();
// The CTAs of a TMA variant the device runs per SM at once (the CUDA
// occupancy calculator, after the shared-memory limits are raised): 1 for the
// one-CTA variants, 2 expected for kTmaPair / kTmaPairTile. Tests and the bench
// check it; cudaErrorInvalidValue for a kernel that is not a TMA variant.
cudaError_t mla_decode_tma_occupancy(MlaDecodeKernel kernel, int* ctas_per_sm);
cudaError_t launch_mla_decode_tma_main(const MlaDecodeDescriptor& desc, const void* q, void* out,
                                       cudaStream_t stream);
// The same three for kTmaFp8 (mla_decode_tma_fp8.cu; no tensor map: 1-D bulk copies).
cudaError_t prepare_mla_decode_tma_fp8_kernel();
cudaError_t mla_decode_tma_fp8_occupancy(int* ctas_per_sm);
cudaError_t launch_mla_decode_tma_fp8_main(const MlaDecodeDescriptor& desc, const void* q, void* out,
                                           cudaStream_t stream);

}  // namespace pagoda::kernels::cuda
