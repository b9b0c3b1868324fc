#pragma once
// The host half of "plan, then run": a ForwardBatch becomes flat per-token
// arrays that the CUDA forward reads from fixed device buffers. Pure host code
// (no CUDA calls), so it is unit-tested without a GPU.
//
// Per new token t (rows in ForwardBatch order, then padding rows up to the graph bucket):
//   token_ids[t], positions[t]    as in the batch (padding: 0, 0)
//   slots[t]                      flat KV slot block * block_size + offset (padding: -1 = no write)
//   token_sequence[t]             row of block_tables holding t's sequence (padding: 0)
//   kv_begin[t], kv_end[t]        visible key indices [begin, end): causal, sliding window
//                                 (padding: 0, 0 = attend to nothing)
// Per logits row r: logit_rows[r] = token row whose hidden state gives it (padding rows: themselves).
// block_tables: [num_sequences, block_table_stride], only the blocks each sequence needs.
//
// Thread safety: functions of their arguments; the arrays belong to the caller.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/runtime/forward_batch.h"

namespace pagoda::cuda {

struct StepLayout {
  int32_t max_num_tokens = 0;      // rows of the per-token arrays
  int32_t max_num_seqs = 0;        // rows of block_tables
  int32_t block_table_stride = 0;  // blocks per row of block_tables
};

struct StepMetadata {
  int32_t* token_ids = nullptr;
  int32_t* positions = nullptr;
  int64_t* slots = nullptr;
  int32_t* token_sequence = nullptr;
  int32_t* kv_begin = nullptr;
  int32_t* kv_end = nullptr;
  int32_t* logit_rows = nullptr;
  int32_t* block_tables = nullptr;
};

// Bytes of one metadata region (each array 256-byte aligned), and the arrays
// inside a region starting at `base` (256-byte aligned, e.g. cudaMalloc'd).
size_t step_metadata_bytes(const StepLayout& layout);
StepMetadata bind_step_metadata(void* base, const StepLayout& layout);

// Decode batch sizes that get a CUDA graph: 1, 2, 4, 8, 16, 24, 32, 48, 64, 80,
// 96, 112, 128, then every 32, always ending at max_num_seqs.
std::vector<int32_t> decode_graph_buckets(int32_t max_num_seqs);

// The bucket a pure decode step (every sequence 1 new token that needs logits)
// pads to; 0 when the step is not a pure decode, is larger than
// max_graph_batch (when > 0), or fits no bucket.
int32_t choose_graph_bucket(const ForwardBatch& batch, std::span<const int32_t> buckets, int32_t max_graph_batch);

// Blocks of the longest block table the step needs (each sequence's cached + new
// tokens), at least 1: the width of block_tables a step has to upload; the
// entries past a sequence's own blocks are never read.
int32_t step_block_table_width(const ForwardBatch& batch, int32_t block_size);

// Fills `m` for a batch the caller has validated (block tables cover every
// token, num_tokens <= padded_tokens <= layout rows). Returns the number of logits rows.
int32_t fill_step_metadata(const ForwardBatch& batch, int32_t block_size, int32_t sliding_window,
                           int32_t block_table_stride, int32_t padded_tokens, const StepMetadata& m);

}  // namespace pagoda::cuda
