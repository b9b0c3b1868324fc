#pragma once
// Token eviction ("KV compression"): the policies, their settings and the
// backend-neutral arithmetic every backend shares (docs/KV_CACHE.md, "Token
// eviction").
//
// A sequence under a policy keeps at most about `budget` KV tokens per layer
// and KV head. When its cached length passes budget + one block, the engine
// asks the runner to compact it (ModelRunner::compact_kv): per (layer, KV
// head) the kept tokens are chosen (select_kept_tokens) and rewritten, in
// order, into fresh blocks; the old blocks go back to the pool. Cached keys
// carry their RoPE phase, so kept tokens keep their true positions and new
// tokens are fed at their true positions (ForwardBatch::positions), while
// their cache index is the compacted one.
//
// Per-head budgets (pyramidkv, entropy) differ, but all heads of a sequence
// share one block table: the compacted region [0, compacted_length) holds,
// for head (l, h), its kept tokens at [0, kept[l][h]) and holes at
// [kept[l][h], compacted_length) that attention skips; tokens appended later
// follow at compacted_length. So the blocks a sequence holds follow the
// largest head budget (kv_compaction_capacity), and the smaller budgets save
// attention reads, not memory, in this layout.
//
// Policies:
//  streaming  the first sink_tokens plus the most recent tokens (StreamingLLM).
//  h2o        sinks + window + heavy hitters by attention mass accumulated from
//             every query the sequence computed (H2O), kept across compactions.
//  snapkv     sinks + window + the tokens the observation window (the last
//             `window` queries before a compaction) attended most, scores
//             average-pooled over neighbouring indices (SnapKV), then carried
//             forward over the `span` tokens after each one (below); scores
//             start afresh after each compaction.
//  pyramidkv  snapkv's scores with budgets that fall linearly with depth, from
//             1.5 x budget at the first layer to 0.5 x budget at the last (mean: budget).
//  entropy    snapkv's scores; each (layer, KV head) keeps sinks + window plus
//             half the mean's scored tokens, and the rest of layers x heads x
//             budget is shared in proportion to the mean entropy of its
//             observation window's attention (normalized by log context):
//             focused (low-entropy) heads keep fewer, diffuse heads more, capped
//             at 2 x budget; within a head the tokens with the most mass are kept.
//
// The span (pagoda's addition to the pooled policies, `span` > 0): a token's
// score is at least 0.97^k times the pooled score of the token k <= span
// places before it, so the continuation of an attended passage is kept with
// it. The observation window attends to where a passage starts (the cue that
// recalls a list attends to the list's first word); the queries that copy it
// later attend to each next token in turn, which plain SnapKV has already
// evicted. span 0 is SnapKV's published selection. The half-budget floor of
// entropy has the same cause: the heads that copy are the focused ones, and a
// budget in proportion to entropy alone starves them (docs/KV_CACHE.md).
//
// Thread safety: pure functions.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::runtime {

enum class KvCompressionPolicy : uint8_t { kNone, kStreaming, kH2O, kSnapKV, kPyramidKV, kEntropy };

std::string_view kv_compression_policy_name(KvCompressionPolicy policy);
// kInvalidArgument naming `field` (a flag or JSON field) for an unknown name.
StatusOr<KvCompressionPolicy> parse_kv_compression_policy(std::string_view name, std::string_view field);

struct KvCompressionConfig {
  KvCompressionPolicy policy = KvCompressionPolicy::kNone;
  int32_t budget = 0;       // KV tokens kept per layer and KV head (mean over heads for pyramidkv / entropy)
  int32_t sink_tokens = 4;  // first tokens always kept
  int32_t window = 32;      // most recent tokens always kept; also the observation window of the scores
  int32_t span = 16;        // snapkv / pyramidkv / entropy: tokens after an attended one kept with it (0: off)
  // Compact between prefill chunks too (not only once the prompt is in): the
  // eval harness measures perplexity this way, token chunk by chunk.
  bool compact_during_prefill = false;

  bool enabled() const { return policy != KvCompressionPolicy::kNone; }
  bool operator==(const KvCompressionConfig&) const = default;
};

// Names the settings as `prefix` + name ("--kv-" for flags, "kv_compression."
// for the API): kInvalidArgument for a budget below sink_tokens + window + 1,
// negative sinks or window, a span outside [0, kMaxKvSpan], or a budget
// without a policy.
inline constexpr int32_t kMaxKvSpan = 256;
[[nodiscard]] Status validate_kv_compression(const KvCompressionConfig& config, std::string_view flag_prefix);

// Does the policy score tokens by attention (all but streaming)?
bool kv_policy_uses_scores(KvCompressionPolicy policy);
// Does it keep accumulated mass across compactions (h2o) rather than start afresh?
bool kv_policy_accumulates(KvCompressionPolicy policy);

// The largest per-head budget: the slots a compacted sequence keeps (its
// compacted_length is min(its length, this)).
int32_t kv_compaction_capacity(const KvCompressionConfig& config, int32_t num_layers);
// Compaction is due when a sequence's cached length passes this (budget + one
// block, so a decoding sequence is compacted once per block, not per token).
int32_t kv_compaction_trigger(const KvCompressionConfig& config, int32_t num_layers, int32_t block_size);

// Per-(layer, KV head) budgets, [num_layers * num_kv_heads], each in
// [sink_tokens + window, capacity]. `entropy` (entropy policy only): the mean
// attention entropy of each head over its observation window, normalized to
// [0, 1]; ignored by the others.
std::vector<int32_t> kv_head_budgets(const KvCompressionConfig& config, int32_t num_layers, int32_t num_kv_heads,
                                     std::span<const float> entropy = {});

// Which of a head's `num_valid` cached tokens (in index order) to keep:
// `budget` of them (all if num_valid <= budget): the first sink_tokens, the
// last `window`, and the rest by highest score (streaming: the most recent).
// `scores` has num_valid entries (ignored by streaming); for snapkv,
// pyramidkv and entropy they are first averaged over a 7-wide neighbourhood,
// then carried forward over `span` (kv_span_scores). Returns ascending
// indices into [0, num_valid). Ties go to the more recent token.
std::vector<int32_t> select_kept_tokens(const KvCompressionConfig& config, int32_t budget, int32_t num_valid,
                                        std::span<const float> scores);

// The span's decay per token: a token k places after a scored one gets at
// least kKvSpanDecay^k of its score.
inline constexpr float kKvSpanDecay = 0.97f;
// In place over `s` (one head's pooled middle scores, in index order):
// s[i] = max(s[i], max over 1 <= k <= min(span, i) of d_k * s_old[i - k]),
// with d_k the float product of k factors kKvSpanDecay, multiplied in that
// order (the GPU's select computes the same floats).
void kv_span_scores(std::span<float> s, int32_t span);

}  // namespace pagoda::runtime
