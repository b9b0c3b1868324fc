#pragma once
// Plan, then run: PagedAttentionPlan turns one step's sequences (new tokens,
// cached tokens, block tables) into the flat int32 arena and the launch
// geometry the kernels need. Planning is host work, once per step (per batch,
// not per layer): validate, pick the kernel and the split-K factor, lay out
// the arena. The caller copies arena() to device memory (one cudaMemcpyAsync)
// and asks descriptor() for the value the launches take; the launches
// themselves (attention_kernels.h) allocate nothing and never synchronize, so
// they can be captured in a CUDA graph and replayed for every layer.
//
// Thread safety: a plan is an immutable value after create().

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/backend/cuda/attention/attention_descriptor.h"

namespace pagoda::kernels::cuda {

struct AttentionConfig {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // divides num_q_heads: MHA (equal), GQA, MQA (1)
  int32_t head_dim = 0;      // decode: 64, 128, 256; prefill: 64, 128
  int32_t block_size = 16;   // power of two, 1..256
  int32_t num_blocks = 0;    // blocks in the pool: every block id must be below it
  float scale = 0.0f;        // 0: 1 / sqrt(head_dim)
  // Pool element types. Quantized pools (fp8 / int8 / int4) run in decode only,
  // at head_dim 64 or 128, K and V in the same format or K int8 with V int4;
  // a step with more than one new token in some sequence is refused
  // (unimplemented), so the caller can fall back.
  KvElement key_element = KvElement::kBF16;
  KvElement value_element = KvElement::kBF16;
};

// One sequence of the step, in query-row order (as runtime/forward_batch.h's SequenceSlice).
struct AttentionSequence {
  int32_t num_new_tokens = 0;     // >= 1
  int32_t num_cached_tokens = 0;  // >= 0; may end mid-block
  std::span<const int32_t> block_table;  // covers num_cached_tokens + num_new_tokens positions
};

// What the planner needs to know about the GPU (cudaDeviceProp: multiProcessorCount;
// peak DRAM bandwidth from the memory clock and bus width, 0 when unknown).
struct AttentionDeviceInfo {
  int32_t num_sms = 132;
  double peak_dram_gbps = 0.0;
};

struct AttentionPlanOptions {
  // Decode: KV positions per split. 0 picks it so the grid fills about two waves
  // of the GPU (one for fp8 / int8 / int4, whose units read half the bytes per
  // position or less); tests set it small to exercise the merge. Rounded up to a
  // multiple of 4.
  int32_t split_tokens = 0;
  // Use the prefill (tensor-core) kernel even when every sequence has one new token.
  bool force_prefill = false;
  // Prefill on mma.sync even where the wgmma kernel applies (head_dim 128):
  // for comparisons and as a fallback.
  bool portable_prefill = false;
  // Graph mode (decode only), on when graph_sequences > 0: the descriptor is the
  // same for every step with at most graph_sequences sequences, so one launch
  // captured in a CUDA graph replays for all of them after the arena copy.
  //  - sequence i is query row i; rows [num sequences, graph_sequences) are
  //    padding: no KV, output zeros;
  //  - the work list has a fixed capacity (graph_work_item_capacity); unused
  //    items name sequence -1 and exit at once; the merge pass always runs;
  //  - block tables come last in the arena, graph_block_table_stride entries
  //    per sequence, so every other offset is fixed.
  int32_t graph_sequences = 0;
  int32_t graph_block_table_stride = 0;  // >= blocks of the longest sequence ever planned
  // Graph mode: the block tables stay in the caller's device memory instead of
  // being copied into the arena: graph_block_tables[i * graph_block_table_stride
  // + j] is block j of sequence i, for at least the blocks each sequence needs
  // (a runner's own per-step table upload). The arena then ends before the
  // tables (kilobytes, where embedded tables are graph_sequences x stride
  // entries: 16 MB at 512 sequences and a 131,072-token context in blocks of
  // 16), and descriptor() points the kernels there; the pointer must stay
  // valid, at the same address, for as long as launches captured from the
  // plan's descriptor replay. Null: the tables are copied into the arena.
  const int32_t* graph_block_tables = nullptr;
  // Decode on CUDA cores even for bf16 / fp8 / int8 pools at head_dim 64 / 128
  // (which run on tensor cores by default): for comparisons.
  bool decode_cuda_cores = false;
};

// Device pointers of one layer's pool.
struct PagedKvPointers {
  const void* key = nullptr;    // [num_blocks, block_size, num_kv_heads, head_dim]
  const void* value = nullptr;  // same shape
  const void* key_scale = nullptr;    // quantized KV: 4-byte scale records (kv_quant.h); null for bf16
  const void* value_scale = nullptr;
  // fp8 written with fixed per-tensor scales (AttentionDescriptor::key_tensor_scale); 0: per vector.
  float key_tensor_scale = 0.0f;
  float value_tensor_scale = 0.0f;
};

class PagedAttentionPlan {
 public:
  // Errors (invalid_argument / unimplemented) name the field and value: head
  // ratio, head_dim, block size, a sequence with no new token, a block table
  // too short or holding an id outside [0, num_blocks), unsupported KV dtype.
  static StatusOr<PagedAttentionPlan> create(const AttentionConfig& config,
                                             std::span<const AttentionSequence> sequences,
                                             const AttentionDeviceInfo& device = {},
                                             const AttentionPlanOptions& options = {});

  AttentionKernel kernel() const { return kernel_; }
  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_work_items() const { return num_work_items_; }
  int32_t max_splits() const { return max_splits_; }

  // The int32 arena to copy to the device (4-byte aligned destination).
  std::span<const int32_t> arena() const { return arena_; }
  size_t arena_bytes() const { return arena_.size() * sizeof(int32_t); }
  // Device bytes to reserve for the arena: arena_bytes(), or in graph mode the
  // arena of graph_sequences full block-table rows (fixed for the bucket).
  size_t arena_capacity_bytes() const { return arena_capacity_bytes_; }
  bool graph_mode() const { return graph_mode_; }
  // Split-K scratch the launch needs (0 when no sequence is split); 256-byte aligned.
  size_t workspace_bytes() const { return workspace_bytes_; }

  // The descriptor for one layer: device_arena is the device copy of arena(),
  // workspace at least workspace_bytes() (may be null when that is 0).
  AttentionDescriptor descriptor(const int32_t* device_arena, const PagedKvPointers& kv,
                                 float* workspace) const;

  // Graph mode: work items of a plan for `graph_sequences` sequences. Enough
  // for any lengths with the automatic split (which aims at a grid of at most
  // 4 CTAs per SM, two waves of 2; one wave for 1-byte codes: <= that many /
  // head tiles items plus one per sequence).
  static int32_t graph_work_item_capacity(const AttentionConfig& config, int32_t graph_sequences,
                                          const AttentionDeviceInfo& device = {});
  // Graph mode: split-K workspace bytes, the same for every step of the bucket.
  static size_t graph_workspace_bytes(const AttentionConfig& config, int32_t graph_sequences,
                                      const AttentionDeviceInfo& device = {});

 private:
  PagedAttentionPlan() = default;
  static StatusOr<PagedAttentionPlan> create_graph_decode(const AttentionConfig& config,
                                                          std::span<const AttentionSequence> sequences,
                                                          const AttentionDeviceInfo& device,
                                                          const AttentionPlanOptions& options);

  AttentionConfig config_;
  AttentionKernel kernel_ = AttentionKernel::kPrefill;
  int32_t num_sequences_ = 0;
  int32_t num_tokens_ = 0;
  int32_t num_work_items_ = 0;
  int32_t max_splits_ = 1;
  int32_t q_heads_per_cta_ = 1;
  int32_t tokens_per_tile_ = 0;
  size_t workspace_bytes_ = 0;
  size_t arena_capacity_bytes_ = 0;
  bool graph_mode_ = false;
  bool decode_cuda_cores_ = false;
  const int32_t* external_block_tables_ = nullptr;  // options.graph_block_tables
  std::vector<int32_t> arena_;
  // Offsets (in int32) of each array inside the arena.
  size_t query_start_at_ = 0, kv_length_at_ = 0, block_table_start_at_ = 0, block_tables_at_ = 0,
         work_items_at_ = 0, split_start_at_ = 0;
};

}  // namespace pagoda::kernels::cuda
