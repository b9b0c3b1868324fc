#pragma once
// The contract between whoever schedules work (the engine, `pagoda generate`,
// `pagoda eval`) and a model forward on any backend. The caller owns the KV
// block ids (from the KV manager); the model only reads and writes KV memory at
// the slots those ids name. Built once per step on the host ("plan"), then
// consumed by the backend ("run").

#include <cstdint>
#include <limits>
#include <vector>

namespace pagoda {

// One sequence's share of a step: `num_new_tokens` tokens (a prefill chunk, or 1
// for decode) appended after `num_cached_tokens` tokens whose K/V already sit in
// the pool. Attention for new token i (0-based) sees positions
// [0, num_cached_tokens + i] (causal).
struct SequenceSlice {
  int32_t token_offset = 0;       // index of this sequence's first new token in ForwardBatch::token_ids
  int32_t num_new_tokens = 0;     // >= 1
  int32_t num_cached_tokens = 0;  // tokens already in the KV pool for this sequence
  // Block ids covering positions [0, num_cached_tokens + num_new_tokens); block j
  // holds positions [j * block_size, (j + 1) * block_size). Same ids in every layer.
  std::vector<int32_t> block_table;
  // Which new tokens need logits (usually only the last of the final prefill
  // chunk, or every decode token; all of them for perplexity).
  bool logits_for_all_new_tokens = false;
  bool logits_for_last_token = true;

  // Token eviction (runtime/kv_compression.h), only on runners with
  // RunnerCapabilities::compacts_kv. kv_state != 0 names the runner's state
  // for this sequence (attention mass, per-head kept lengths after a
  // compaction); the engine uses its sequence id. With it, num_cached_tokens
  // and the block table count cache indices (after compaction fewer than the
  // positions, which stay the true ones).
  int64_t kv_state = 0;
  bool kv_state_reset = false;  // the sequence starts (again): drop what the runner kept under kv_state
  // New tokens at cache index >= this add their attention distribution (mass
  // per attended index, entropy) to the state; the int32 maximum: none do.
  int32_t score_from_index = std::numeric_limits<int32_t>::max();
};

// A new token whose id the caller has not seen yet: the token the runner
// sampled for logits row `source_row` of the step launched just before this
// one (ModelRunner::launch; overlapped steps). token_ids holds 0 there.
struct DeferredToken {
  int32_t token_index = 0;  // into ForwardBatch::token_ids
  int32_t source_row = 0;   // a device-sampled row of the previous launched step
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // new tokens of every sequence, concatenated in order
  std::vector<int32_t> positions;  // absolute position of each new token (RoPE), same length
  std::vector<SequenceSlice> sequences;
  // Only in a batch handed to ModelRunner::launch while the step launched
  // before it is not collected: ascending token_index, each at most once.
  std::vector<DeferredToken> deferred_tokens;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // Rows of logits the forward produces, in order of sequences and then tokens.
  int32_t num_logit_rows() const {
    int32_t rows = 0;
    for (const auto& s : sequences)
      rows += s.logits_for_all_new_tokens ? s.num_new_tokens : (s.logits_for_last_token ? 1 : 0);
    return rows;
  }
};

}  // namespace pagoda
