#pragma once
// How one request wants its tokens chosen and when it wants to stop. Plain
// data, validated once at submit time (validate_sampling_params) so the engine
// loop never sees a bad value.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::engine {

struct SamplingParams {
  // 0 means greedy (argmax); otherwise logits are divided by it. Range [0, 100].
  float temperature = 1.0f;
  int32_t top_k = 0;        // 0: off; else keep the k most likely tokens
  float top_p = 1.0f;       // (0, 1]: keep the smallest set whose mass reaches top_p
  float min_p = 0.0f;       // [0, 1]: drop tokens below min_p * p(most likely)
  // HF/vLLM-style multiplicative penalty on every token already in prompt or
  // output: logit > 0 ? logit / r : logit * r. 1 = off. Range (0, 10].
  float repetition_penalty = 1.0f;
  // OpenAI-style additive penalties over generated tokens only:
  // logit -= frequency_penalty * count + presence_penalty * (count > 0). Range [-2, 2].
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // With a seed the same request yields the same tokens (choice i uses seed + i).
  std::optional<uint64_t> seed;
  // Top-k log-probabilities to report per generated token (0..20); nullopt: none.
  std::optional<int32_t> logprobs;
  // vLLM's prompt_logprobs: for every prompt token after the first, its logprob and rank under the
  // model given the tokens before it, with this many top alternatives (0..20); nullopt: none.
  // Such a request computes its whole prompt (the prefix cache is not read: a cached position
  // has no logits) and may set max_tokens = 0 to score the prompt alone.
  std::optional<int32_t> prompt_logprobs;
  int32_t max_tokens = 16;  // >= 1, or 0 with prompt_logprobs
  int32_t n = 1;            // choices per request, 1..16; n > 1 forks after prefill
  std::vector<std::string> stop;         // stop strings; matched across token boundaries
  bool include_stop_str_in_output = false;  // the text ends with the stop string that matched (vLLM)
  bool skip_special_tokens = true;  // special tokens write no text (vLLM); tokens and logprobs keep them
  std::vector<int32_t> stop_token_ids;   // in addition to the model's eos ids
  bool ignore_eos = false;
  // Rules on the logits before penalties and sampling (engine/logit_rules.h), in this order:
  // allowed_token_ids (vLLM): when non-empty, only these tokens can be sampled.
  std::vector<int32_t> allowed_token_ids;
  // bad_words as token sequences (vLLM's bad_words, which the server tokenizes): the last token
  // of a sequence cannot be sampled where the output so far ends with the tokens before it.
  std::vector<std::vector<int32_t>> bad_words_ids;
  // min_tokens (vLLM): before this many output tokens neither an eos id (unless ignore_eos) nor
  // a stop_token_ids id can be sampled, and stop strings are not matched. In [0, max_tokens].
  int32_t min_tokens = 0;
  // logit_bias (OpenAI): (token, bias in [-100, 100]) added to the token's logit; distinct tokens.
  // -100 in effect bans a token, +100 all but forces it.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Limits on the lists a request may give (their checks cost a pass over each per sampled token).
inline constexpr size_t kMaxAllowedTokenIds = size_t{1} << 20;
inline constexpr size_t kMaxBadWordSequences = 256;
inline constexpr size_t kMaxBadWordTokens = 64;
inline constexpr size_t kMaxLogitBiasTokens = 1024;

// Checks ranges and consistency; the error names the field, e.g.
// "temperature must be in [0, 100], got -1".
Status validate_sampling_params(const SamplingParams& params, int32_t vocab_size);

}  // namespace pagoda::engine
