#pragma once
// Bridges the scheduler's step (runtime/forward_batch.h) to the attention plan:
// one AttentionSequence per SequenceSlice, in the same order, so query rows of
// the plan are the batch's token rows. The spans point into `batch`, which must
// outlive the plan's create() call (the plan copies what it keeps).

#include <vector>

#include "pagoda/backend/cuda/attention/attention_plan.h"
#include "pagoda/runtime/forward_batch.h"

namespace pagoda::kernels::cuda {

inline std::vector<AttentionSequence> attention_sequences(const ForwardBatch& batch) {
  std::vector<AttentionSequence> sequences;
  sequences.reserve(batch.sequences.size());
  for (const SequenceSlice& slice : batch.sequences)
    sequences.push_back({slice.num_new_tokens, slice.num_cached_tokens, slice.block_table});
  return sequences;
}

}  // namespace pagoda::kernels::cuda
