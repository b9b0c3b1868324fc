#pragma once
// A request's rules on the logits of each row it samples, applied before the
// sampler's penalties and truncations (sampler.h), in vLLM's order:
// allowed_token_ids -> bad_words -> min_tokens -> logit_bias. A banned token's
// logit becomes -inf; a bias is added. Logprobs still describe the model (the
// sampler reads them from the row before these rules).
//
// The device sampler applies none of them: rows of a request with rules in
// force are sampled on the host (Engine::row_sampling_for), so every backend
// gives the same tokens for the same logits.
//
// Thread safety: stateless functions.

#include <cstdint>
#include <span>

#include "pagoda/engine/sampling_params.h"

namespace pagoda::engine {

// What the rules read of the sequence being sampled.
struct LogitRuleContext {
  std::span<const int32_t> output;   // the tokens generated so far, oldest first
  std::span<const int32_t> eos_ids;  // the model's end-of-sequence ids (min_tokens bans them unless ignore_eos)
};

// Whether a rule changes the row after `num_output_tokens` tokens (min_tokens
// stops applying once reached). While one does, rows are sampled on the host
// and jump-forward is off (a forced token would bypass the rules).
bool logit_rules_apply(const SamplingParams& params, int32_t num_output_tokens);

// Applies the rules to one row of logits (vocabulary-sized). Ids outside the
// row are skipped (validate_sampling_params refuses them at submit).
void apply_logit_rules(std::span<float> logits, const SamplingParams& params, const LogitRuleContext& context);

}  // namespace pagoda::engine
