#pragma once
// Paged MLA (multi-head latent attention) decode on Hopper, in the absorbed
// form (docs/MLA.md): every query row attends over the cached latent vectors
// of its sequence as MQA with K = the whole 576-value vector (kv_lora_rank 512
// + the 64 roped values) and V = its first 512 values.
//
//   q   [num_rows, num_heads, 576] bf16: per head q_nope already multiplied by
//       W_UK (512 values), then the roped q_pe (64).
//   out [num_rows, num_heads, 512] bf16: softmax(q . K * scale) V over the row's
//       cache positions [0, context_len).
//   latent pool: CudaKvPool's K sub-pool of a KvPoolShape with latent = true:
//       codes [num_blocks, block_size, 1, 576] in bf16 or fp8 e4m3, and for fp8
//       one f32 scale record per vector at slot b * block_size + s
//       (runtime/kv_quant.h with num_kv_heads 1 and kv_scale_groups(576, fp8) = 1);
//       or (MlaLatentLayout::kFlashMla656) one 656-byte record per slot in
//       FlashMLA's fp8 layout (runtime/mla_fp8_layout.h).
//
// Rows, not sequences: decode plans one row per sequence; a prefill can use it
// as a slow fallback with one row per prompt token (context_len = position + 1),
// rows of a sequence sharing one block table.
//
// Plan, then run, as PagedAttentionPlan (attention_plan.h): create() validates
// and splits the rows' KV ranges into segments spread evenly over the GPU's
// SMs (a CTA may run several segments in turn; a row split over several is
// merged by a second pass); the caller copies arena() to the device, reserves
// workspace_bytes() of scratch and launches with descriptor(). Launches only
// enqueue work (no allocation, no synchronization): graph-capturable for a
// fixed plan.
//
// Thread safety: a plan is an immutable value after create(); launches are
// stream-ordered.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/attention_plan.h"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"
#include "pagoda/core/status.h"

namespace pagoda::kernels::cuda {

struct MlaDecodeConfig {
  int32_t num_heads = 0;   // query heads, 1..1024 (tiles of 64 heads share each latent read)
  int32_t block_size = 0;  // tokens per cache block, >= 1 (any, not only powers of two)
  int32_t num_blocks = 0;  // blocks in the pool: every block id must be below it
  float scale = 0.0f;      // softmax scale (> 0, finite), yarn's mscale included by the caller
  KvElement latent_element = KvElement::kBF16;  // kBF16 or kFP8E4M3
  // kFP8E4M3: the pool's records are FlashMLA's 656 bytes
  // (runtime/mla_fp8_layout.h) or codes + scale records. kBF16: token-major
  // rows (kPerVectorScale) or swizzled pages (kBf16SwizzledPages).
  MlaLatentLayout latent_layout = MlaLatentLayout::kPerVectorScale;
};

// One query row.
struct MlaDecodeRow {
  int32_t context_len = 0;               // >= 1: attends to cache positions [0, context_len)
  std::span<const int32_t> block_table;  // at least ceil(context_len / block_size) ids
};

// How split rows are combined: a merge pass after the decode kernel, or the
// merge folded into the decode kernel (MlaDecodeDescriptor::fused_merge).
enum class MlaMergeMode : int32_t {
  kDefault = 0,  // the environment's PAGODA_MLA_MERGE: "pass", "fused" or "fused_global"; unset or empty: fused
  kPass = 1,
  // Where the kernel can (mla_decode_can_fuse_merge) and the grid is one CTA per SM at most; by cluster
  // pairs (MlaDecodePlan::paired_merge) where the plan's split rows pair up, else through counters.
  kFused = 2,
  kFusedGlobal = 3,  // kFused never by pairs: always the counters (a diagnostic, the A/B of the pairs)
};

struct MlaDecodeOptions {
  // KV positions per segment, one segment per CTA (rounded up to a multiple of
  // 64). 0: automatic, the rows' tiles balanced over one wave of the GPU.
  // Tests set it small to exercise the merge.
  int32_t split_tokens = 0;
  // Fixed (CUDA-graph) mode when > 0: the arena is laid out for fixed_rows rows
  // (the graph bucket; rows.size() may be smaller, the rest are padding rows
  // whose output is zeros) with block tables at fixed_block_table_stride ids a
  // row, the grid is one whole wave and the workspace is sized for the most
  // segments fixed_rows rows can need, so descriptor() (given the same device
  // buffers) is identical for every plan of the same config, fixed_rows and
  // stride: a launch captured once replays correctly after each later plan's
  // arena is copied to the same device address. The merge (pass or folded) always runs.
  // Requires split_tokens 0 and every row's blocks to fit the stride.
  int32_t fixed_rows = 0;
  int32_t fixed_block_table_stride = 0;
  // Fixed mode: the block tables stay in the caller's device memory instead of
  // being copied into the arena: fixed_block_tables[i * fixed_block_table_stride
  // + j] is block j of row i, for at least the blocks each row needs (a
  // runner's own per-step table upload, one row a sequence). The arena then
  // ends before the tables and descriptor() points the
  // kernels there; the pointer must stay valid at the same address while
  // launches captured from the descriptor replay. Null: copied into the arena
  // (fixed_rows x stride entries).
  const int32_t* fixed_block_tables = nullptr;
  // Which kernel (mla_decode_descriptor.h, MlaDecodeKernel). kDefault: the
  // environment's PAGODA_MLA_DECODE_KERNEL ("auto", "cp_async", a TMA
  // variant's name, e.g. "tma_pingpong_2chain" or "tma_fp8"; read once per
  // process); unset or "auto": the bf16 TMA kernel where it applies with pages
  // of a multiple of 64 positions, kTmaFp8 for FlashMLA fp8 records at pages
  // of a multiple of 16 positions, else cp.async.
  // The TMA variants (is_tma_kernel) apply only where the TMA kernel does (bf16 latent, at most
  // 16 heads, block_size 8, 16, 32 or a multiple of 64); other plans fall back
  // to the cp.async kernels (fp8 latents, more heads, other block sizes), and
  // kernel() says which was taken. kTmaFp8 applies only to FlashMLA's fp8
  // records (kFlashMla656), at most 16 heads, block sizes that are multiples
  // of 16 or divide 16.
  MlaDecodeKernel kernel = MlaDecodeKernel::kDefault;
  // The automatic split's per-CTA budgets (split_tokens 0). false: every CTA
  // the same whole number of tiles, a segment costing one tile more (the
  // rounding can leave SMs idle). true: the total spread over all num_sms /
  // head-tile CTAs, budgets differing by at most a quarter tile, a segment
  // costing a quarter tile more (mla_decode_plan.cpp).
  bool spread_budget = false;
  // kFused applies to the ping-pong kernels with a hand-over and tma_fp8 (the automatic
  // TMA and bulk kernels among them) when the plan's grid has at most one CTA
  // per SM, since a CTA waits there for the other CTAs of its rows; other plans
  // keep the merge pass, and fused_merge() says which was taken. The arena then
  // holds two counters a row, which the kernel leaves at zero, unless the plan
  // folds it by cluster pairs (paired_merge(): split rows of two segments alone
  // on CTAs 2i and 2i + 1, bf16 ping-pong kernels, not fixed plans).
  MlaMergeMode merge = MlaMergeMode::kDefault;
};

class MlaDecodePlan {
 public:
  // Errors (invalid_argument / unimplemented) name the field and value:
  // num_heads, block_size, num_blocks, scale, latent_element, a row's
  // context_len (0 is refused), a block table too short or holding an id
  // outside [0, num_blocks). Zero rows give an empty plan (launch does nothing).
  static StatusOr<MlaDecodePlan> create(const MlaDecodeConfig& config, std::span<const MlaDecodeRow> rows,
                                        const AttentionDeviceInfo& device = {},
                                        const MlaDecodeOptions& options = {});

  int32_t num_rows() const { return num_rows_; }
  int32_t num_segments() const { return num_segments_; }
  int32_t num_ctas() const { return num_ctas_; }
  int32_t max_splits() const { return max_splits_; }
  // The kernel the plan's launches run: kCpAsync or a TMA variant (never kDefault).
  MlaDecodeKernel kernel() const { return kernel_; }
  // The int32 arena to copy to the device (4-byte aligned destination).
  std::span<const int32_t> arena() const { return arena_; }
  size_t arena_bytes() const { return arena_.size() * sizeof(int32_t); }
  // Split-K scratch the launch needs (0 when no row is split).
  size_t workspace_bytes() const { return workspace_bytes_; }
  // The merge is folded into the decode kernel (options.merge kFused or kFusedGlobal, taken).
  bool fused_merge() const { return fused_merge_; }
  // ... and folded by cluster pairs (MlaDecodeDescriptor::paired_merge): no counters in the arena, no
  // workspace.
  bool paired_merge() const { return paired_merge_; }

  // device_arena: the device copy of arena() (written by launches with the
  // merge folded in: its counters, left at zero; one launch at a time);
  // latent / latent_scale: the layer's K codes and (fp8) scale records;
  // workspace: workspace_bytes().
  MlaDecodeDescriptor descriptor(int32_t* device_arena, const void* latent, const void* latent_scale,
                                 float* workspace) const;

 private:
  MlaDecodePlan() = default;
  static MlaDecodePlan lay_out_fixed(MlaDecodePlan plan, std::span<const MlaDecodeRow> rows,
                                     const AttentionDeviceInfo& device, const MlaDecodeOptions& options,
                                     std::vector<int32_t> segments, std::vector<int32_t> row_start,
                                     std::vector<int32_t> cta_start);
  MlaDecodeConfig config_;
  MlaDecodeKernel kernel_ = MlaDecodeKernel::kCpAsync;
  int32_t num_rows_ = 0, num_segments_ = 0, num_ctas_ = 0, max_splits_ = 1;
  size_t workspace_bytes_ = 0;
  bool fused_merge_ = false, paired_merge_ = false;
  std::vector<int32_t> arena_;
  size_t row_segment_start_at_ = 0, cta_segment_start_at_ = 0, merge_counters_at_ = 0, block_table_start_at_ = 0,
         block_tables_at_ = 0;
  const int32_t* external_block_tables_ = nullptr;  // options.fixed_block_tables
};

// The planner's view of CUDA device `device`: its SMs and its peak DRAM
// bandwidth (2 x memory clock x bus width; the automatic kernel choice at small
// pages depends on it).
cudaError_t query_attention_device_info(int device, AttentionDeviceInfo* info);

}  // namespace pagoda::kernels::cuda
