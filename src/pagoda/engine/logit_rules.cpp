#include "pagoda/engine/logit_rules.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace pagoda::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void ban(std::span<float> logits, int32_t token) {
  if (token >= 0 && token < static_cast<int32_t>(logits.size())) logits[static_cast<size_t>(token)] = kNegInf;
}

// Every token but the allowed ones to -inf, without a vocabulary-sized mask:
// the allowed logits are saved, the row filled, and they are put back.
void keep_only(std::span<float> logits, std::span<const int32_t> allowed) {
  std::vector<std::pair<int32_t, float>> kept;
  kept.reserve(allowed.size());
  for (int32_t t : allowed)
    if (t >= 0 && t < static_cast<int32_t>(logits.size())) kept.emplace_back(t, logits[static_cast<size_t>(t)]);
  std::fill(logits.begin(), logits.end(), kNegInf);
  for (const auto& [t, v] : kept) logits[static_cast<size_t>(t)] = v;
}

}  // namespace

bool logit_rules_apply(const SamplingParams& p, int32_t num_output_tokens) {
  return !p.allowed_token_ids.empty() || !p.bad_words_ids.empty() || num_output_tokens < p.min_tokens ||
         !p.logit_bias.empty();
}

std::vector<int32_t> banned_tokens(const SamplingParams& p, const LogitRuleContext& c) {
  std::vector<int32_t> out;
  for (const auto& word : p.bad_words_ids) {
    if (word.empty()) continue;
    const size_t before = word.size() - 1;  // the tokens the output must end with
    if (before > c.output.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, c.output.end() - static_cast<std::ptrdiff_t>(before)))
      out.push_back(word.back());
  }
  if (static_cast<int64_t>(c.output.size()) < p.min_tokens) {
    if (!p.ignore_eos) out.insert(out.end(), c.eos_ids.begin(), c.eos_ids.end());
    out.insert(out.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
  return out;
}

void apply_logit_rules(std::span<float> logits, const SamplingParams& p, const LogitRuleContext& c) {
  if (!p.allowed_token_ids.empty()) keep_only(logits, p.allowed_token_ids);
  for (int32_t t : banned_tokens(p, c)) ban(logits, t);
  for (const auto& [t, bias] : p.logit_bias)
    if (t >= 0 && t < static_cast<int32_t>(logits.size())) logits[static_cast<size_t>(t)] += bias;
}

}  // namespace pagoda::engine
