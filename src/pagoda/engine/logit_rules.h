#pragma once
// A request's rules on the logits of each row it samples, applied before the
// sampler's penalties and truncations (sampler.h), in vLLM's order:
// allowed_token_ids -> bad_words -> min_tokens -> logit_bias. A banned token's
// logit becomes -inf; a bias is added. Logprobs still describe the model (the
// sampler reads them from the row before these rules).
//
// A runner that edits logits on the device (runtime::RowSampling::logit_edits)
// gets them as per-token edits (banned_tokens, logit_bias) and applies them in
// this order; allowed_token_ids (a whole-row rule) keeps a request's rows on the
// host sampler (Engine::row_sampling_for).
//
// Thread safety: stateless functions.

#include <cstdint>
#include <span>
#include <vector>

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

// The tokens bad_words and min_tokens ban in this context (a token may repeat): the last token of each
// bad word whose other tokens the output ends with; under min_tokens the eos ids (unless ignore_eos) and
// stop_token_ids.
std::vector<int32_t> banned_tokens(const SamplingParams& params, const LogitRuleContext& context);

}  // namespace pagoda::engine
