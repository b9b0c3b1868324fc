#include "pagoda/engine/sampling_params.h"

#include <algorithm>
#include <cmath>

namespace pagoda::engine {

Status validate_sampling_params(const SamplingParams& p, int32_t vocab_size) {
  // NaN fails every comparison, so each check is written as "!(in range)".
  if (!(p.temperature >= 0.0f && p.temperature <= 100.0f))
    return invalid_argument_error("temperature must be in [0, 100], got {}", p.temperature);
  if (p.top_k < 0) return invalid_argument_error("top_k must be >= 0, got {}", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return invalid_argument_error("top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return invalid_argument_error("min_p must be in [0, 1], got {}", p.min_p);
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 10.0f))
    return invalid_argument_error("repetition_penalty must be in (0, 10], got {}", p.repetition_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return invalid_argument_error("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return invalid_argument_error("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  if (p.logprobs && (*p.logprobs < 0 || *p.logprobs > 20))
    return invalid_argument_error("logprobs must be in [0, 20], got {}", *p.logprobs);
  if (p.prompt_logprobs && (*p.prompt_logprobs < 0 || *p.prompt_logprobs > 20))
    return invalid_argument_error("prompt_logprobs must be in [0, 20], got {}", *p.prompt_logprobs);
  if (p.max_tokens < 0 || (p.max_tokens == 0 && !p.prompt_logprobs))
    return invalid_argument_error("max_tokens must be >= 1 (0 only with prompt_logprobs), got {}", p.max_tokens);
  if (p.n < 1 || p.n > 16) return invalid_argument_error("n must be in [1, 16], got {}", p.n);
  if (p.stop.size() > 16) return invalid_argument_error("stop accepts at most 16 strings, got {}", p.stop.size());
  for (const auto& s : p.stop) {
    if (s.empty()) return invalid_argument_error("stop strings must not be empty");
    if (s.size() > 256) return invalid_argument_error("stop strings must be at most 256 bytes, got {}", s.size());
  }
  if (p.stop_token_ids.size() > 256)
    return invalid_argument_error("stop_token_ids accepts at most 256 ids, got {}", p.stop_token_ids.size());
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= vocab_size)
      return invalid_argument_error("stop_token_ids: {} is outside the vocabulary [0, {})", id, vocab_size);
  if (p.allowed_token_ids.size() > std::min<size_t>(kMaxAllowedTokenIds, static_cast<size_t>(vocab_size)))
    return invalid_argument_error("allowed_token_ids accepts at most {} ids, got {}",
                                  std::min<size_t>(kMaxAllowedTokenIds, static_cast<size_t>(vocab_size)),
                                  p.allowed_token_ids.size());
  for (int32_t id : p.allowed_token_ids)
    if (id < 0 || id >= vocab_size)
      return invalid_argument_error("allowed_token_ids: {} is outside the vocabulary [0, {})", id, vocab_size);
  if (p.bad_words_ids.size() > kMaxBadWordSequences)
    return invalid_argument_error("bad_words gives at most {} token sequences, got {}", kMaxBadWordSequences,
                                  p.bad_words_ids.size());
  for (const auto& word : p.bad_words_ids) {
    if (word.empty() || word.size() > kMaxBadWordTokens)
      return invalid_argument_error("bad_words: a word must be 1 to {} tokens, got {}", kMaxBadWordTokens,
                                    word.size());
    for (int32_t id : word)
      if (id < 0 || id >= vocab_size)
        return invalid_argument_error("bad_words: token {} is outside the vocabulary [0, {})", id, vocab_size);
  }
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return invalid_argument_error("min_tokens must be in [0, max_tokens = {}], got {}", p.max_tokens, p.min_tokens);
  if (p.logit_bias.size() > kMaxLogitBiasTokens)
    return invalid_argument_error("logit_bias accepts at most {} tokens, got {}", kMaxLogitBiasTokens,
                                  p.logit_bias.size());
  std::vector<int32_t> biased;
  biased.reserve(p.logit_bias.size());
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size)
      return invalid_argument_error("logit_bias: token {} is outside the vocabulary [0, {})", id, vocab_size);
    if (!(bias >= -100.0f && bias <= 100.0f))
      return invalid_argument_error("logit_bias: the bias of token {} must be in [-100, 100], got {}", id, bias);
    biased.push_back(id);
  }
  std::sort(biased.begin(), biased.end());
  if (auto twice = std::adjacent_find(biased.begin(), biased.end()); twice != biased.end())
    return invalid_argument_error("logit_bias: token {} is given twice", *twice);
  return ok_status();
}

}  // namespace pagoda::engine
