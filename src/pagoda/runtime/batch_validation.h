#pragma once
// Checks a ForwardBatch against the KV pool and the model before any backend
// touches memory: every backend runs the same checks (one copy), so a bad plan
// is an error that names the sequence, row or block, never an out-of-bounds
// write.
//
// Thread safety: plain functions.

#include <cstdint>
#include <limits>

#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda::runtime {

// What the backend can take in one forward, beyond the pool's shape.
struct BatchLimits {
  int32_t vocab_size = 0;  // token ids must be in [0, vocab_size)
  int64_t max_num_tokens = std::numeric_limits<int64_t>::max();
  int64_t max_num_seqs = std::numeric_limits<int64_t>::max();
  int64_t max_sequence_tokens = std::numeric_limits<int64_t>::max();  // cached + new, per sequence
  // The runner resolves ForwardBatch::deferred_tokens itself (its own launch()); otherwise a batch with
  // any is refused (execute() would run them as token 0).
  bool deferred_tokens = false;
};

// kInvalidArgument naming the first inconsistency: token ids / positions of
// different lengths, ids outside the vocabulary, negative positions, slices
// that do not tile the token rows, a block table too short for the slice or
// naming a block outside the pool, more tokens / sequences than `limits`, or
// deferred tokens where `limits` takes none.
[[nodiscard]] Status validate_forward_batch(const ForwardBatch& batch, const KvPoolShape& pool,
                                            const BatchLimits& limits);

// kInvalidArgument when a pool was made for another model or KV layout:
// layers, KV heads, head dim, block size and dtypes must all match.
[[nodiscard]] Status check_pool_matches(const KvPoolShape& pool, const KvPoolShape& expected);

}  // namespace pagoda::runtime
