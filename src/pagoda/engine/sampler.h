#pragma once
// Turns one row of logits into one token, applying a request's rules and
// penalties and truncations in a fixed order: the logit rules (logit_rules.h:
// allowed_token_ids, bad_words, min_tokens, logit_bias) -> repetition penalty
// -> frequency/presence penalties -> temperature (0: argmax) -> min-p -> top-k
// -> top-p -> draw.
//
// Logprobs are log-softmax of the raw logits (before penalties and
// temperature), like the OpenAI API: they describe the model, not the sampler.
//
// Thread safety: stateless; the RNG is the caller's (one per sequence), which
// is what makes a seeded request reproducible whatever else is batched with it.

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagoda/engine/logit_rules.h"
#include "pagoda/engine/sampling_params.h"

namespace pagoda::engine {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;                 // of the chosen token (raw distribution)
  std::vector<TokenLogprob> top_logprobs;  // best first; empty unless requested
  int32_t rank = 0;  // score_token: the tokens at least as likely as `token`, itself included (vLLM); else 0
};

// Token counts a sequence has seen, kept incrementally so penalties cost
// O(distinct tokens) per step rather than O(sequence length).
struct TokenHistory {
  std::unordered_map<int32_t, int32_t> prompt_counts;
  std::unordered_map<int32_t, int32_t> output_counts;
  void add_prompt(std::span<const int32_t> tokens) { for (int32_t t : tokens) ++prompt_counts[t]; }
  void add_output(int32_t token) { ++output_counts[token]; }
};

// Whether sample() reads a TokenHistory under these params (a penalty is set): the engine keeps the
// counts only then, since they cost a hash insert per prompt token and per output token.
inline bool needs_token_history(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
}

// Structured outputs: sets logits[t] to -inf for every token whose bit is clear in `allowed`
// (64 tokens per word, little-endian; words past the row are ignored). Run before sample().
void apply_token_mask(std::span<float> logits, std::span<const uint64_t> allowed);

// A token the model was given rather than drew (prompt_logprobs): its logprob in the raw row, its
// rank, and the top_k most likely tokens (best first, ties to the lower id).
SampledToken score_token(std::span<const float> raw, int32_t token, int32_t top_k);

class Sampler {
 public:
  // `logits` has vocab_size entries. Never fails for validated params; if every
  // token is masked (all -inf logits) it falls back to argmax of the raw row.
  // `rules`: the sequence's context for the request's logit rules; null skips
  // them (the caller knows they do not apply: logit_rules_apply).
  static SampledToken sample(std::span<const float> logits, const SamplingParams& params,
                             const TokenHistory& history, std::mt19937_64& rng,
                             const LogitRuleContext* rules = nullptr);
};

}  // namespace pagoda::engine
