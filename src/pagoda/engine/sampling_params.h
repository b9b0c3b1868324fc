#pragma once
// How one request wants its tokens chosen and when it wants to stop. Plain
// data, validated once at submit time (validate_sampling_params) so the engine
// loop never sees a bad value.

#include <cstdint>
#include <optional>
#include <string>
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
  int32_t max_tokens = 16;  // >= 1
  int32_t n = 1;            // choices per request, 1..16; n > 1 forks after prefill
  std::vector<std::string> stop;         // stop strings; matched across token boundaries
  std::vector<int32_t> stop_token_ids;   // in addition to the model's eos ids
  bool ignore_eos = false;
};

// Checks ranges and consistency; the error names the field, e.g.
// "temperature must be in [0, 100], got -1".
Status validate_sampling_params(const SamplingParams& params, int32_t vocab_size);

}  // namespace pagoda::engine
