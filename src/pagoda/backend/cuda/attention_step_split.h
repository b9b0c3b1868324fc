#pragma once
// The host half of how FastAttention (fast_attention.h) splits one step into
// attention launches: plain functions over the scheduler's ForwardBatch, no
// GPU, so the unit tests (label unit, run in CI) cover them.
//
//  - The scheduler puts decodes first: count_leading_decodes() says how many
//    leading sequences have one new token (they go to the split-K decode
//    kernel; the rest, from their first query row on, to the prefill kernel).
//  - Prompt chunks over a quantized pool read a bf16 scratch copy of their
//    blocks: remap_blocks_to_scratch() lists the pool blocks they read, each
//    once however many chunks share it, in first-seen order, and renumbers the
//    chunks' block tables into that list.
//
// Thread safety: pure functions.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/runtime/forward_batch.h"

namespace pagoda::cuda {

// How many sequences at the front of `sequences` have exactly one new token.
size_t count_leading_decodes(std::span<const SequenceSlice> sequences);

struct ScratchRemap {
  std::vector<int32_t> sources;              // scratch block j is pool block sources[j]
  std::vector<std::vector<int32_t>> tables;  // per sequence: its used blocks as scratch ids
};

// Only the blocks covering each sequence's num_cached_tokens + num_new_tokens
// positions count (a longer table's tail is ignored). nullopt: a table too
// short for its sequence, or a block id outside [0, num_blocks) (the attention
// plan would refuse the step too; the caller falls back).
std::optional<ScratchRemap> remap_blocks_to_scratch(std::span<const SequenceSlice> sequences, int32_t block_size,
                                                    int32_t num_blocks);

}  // namespace pagoda::cuda
