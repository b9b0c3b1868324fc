#include "pagoda/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

namespace pagoda::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t argmax(std::span<const float> row) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(row.size()); ++i)
    if (row[i] > row[best]) best = i;
  return best;
}

// log-softmax of the raw row, only for the tokens that are reported (out.token and the top k).
void fill_logprobs(std::span<const float> raw, int32_t top_k, SampledToken& out) {
  float max_logit = raw[argmax(raw)];
  double sum = 0.0;
  // Masked-out tokens (structured outputs) are -inf and add nothing: skipping them keeps a
  // constrained row's cost proportional to the tokens it allows rather than to the vocabulary.
  for (float v : raw)
    if (v != kNegInf) sum += static_cast<double>(std::exp(v - max_logit));
  const float log_z = max_logit + static_cast<float>(std::log(sum));
  out.logprob = raw[out.token] - log_z;
  const int32_t k = std::min<int32_t>(top_k, static_cast<int32_t>(raw.size()));
  if (k <= 0) return;
  std::vector<int32_t> ids(raw.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
  });
  out.top_logprobs.reserve(k);
  for (int32_t i = 0; i < k; ++i) out.top_logprobs.push_back({ids[i], raw[ids[i]] - log_z});
}

}  // namespace

SampledToken score_token(std::span<const float> raw, int32_t token, int32_t top_k) {
  SampledToken out;
  out.token = token;
  fill_logprobs(raw, top_k, out);
  // vLLM's rank: the tokens at least as likely, the token itself included (a tie ranks below).
  out.rank = static_cast<int32_t>(std::count_if(raw.begin(), raw.end(), [&](float v) { return v >= raw[token]; }));
  return out;
}

void apply_token_mask(std::span<float> logits, std::span<const uint64_t> allowed) {
  const size_t n = logits.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = w < allowed.size() ? allowed[w] : 0;
    if (bits == ~uint64_t{0}) continue;
    const size_t base = w * 64;
    const size_t end = std::min(n, base + 64);
    if (bits == 0) {
      std::fill(logits.begin() + static_cast<std::ptrdiff_t>(base), logits.begin() + static_cast<std::ptrdiff_t>(end),
                kNegInf);
      continue;
    }
    for (uint64_t off = ~bits; off != 0; off &= off - 1) {  // only the disallowed bits
      const size_t i = base + static_cast<size_t>(std::countr_zero(off));
      if (i < end) logits[i] = kNegInf;
    }
  }
}

SampledToken Sampler::sample(std::span<const float> raw, const SamplingParams& params,
                             const TokenHistory& history, std::mt19937_64& rng, const LogitRuleContext* rules) {
  std::vector<float> logits(raw.begin(), raw.end());
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (rules != nullptr) apply_logit_rules(logits, params, *rules);

  if (params.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& v = logits[t];
      v = v > 0 ? v / params.repetition_penalty : v * params.repetition_penalty;
    };
    // A token seen in both prompt and output is penalized once.
    for (const auto& [t, c] : history.prompt_counts) penalize(t);
    for (const auto& [t, c] : history.output_counts)
      if (!history.prompt_counts.contains(t)) penalize(t);
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [t, c] : history.output_counts) {
      if (t < 0 || t >= vocab) continue;
      logits[t] -= params.frequency_penalty * static_cast<float>(c) + params.presence_penalty;
    }
  }

  SampledToken out;
  if (params.temperature == 0.0f) {
    out.token = argmax(logits);
    if (logits[out.token] == kNegInf) out.token = argmax(raw);  // every token masked (the header)
    fill_logprobs(raw, params.logprobs.value_or(0), out);
    return out;
  }

  // Softmax with temperature, then truncations expressed as masks.
  const float inv_t = 1.0f / params.temperature;
  float max_logit = logits[argmax(logits)];
  if (max_logit == kNegInf) {
    out.token = argmax(raw);
    fill_logprobs(raw, params.logprobs.value_or(0), out);
    return out;
  }
  std::vector<double> probs(vocab);
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp(static_cast<double>((logits[i] - max_logit) * inv_t));
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;

  if (params.min_p > 0.0f) {
    const double p_max = *std::max_element(probs.begin(), probs.end());
    const double floor = params.min_p * p_max;
    for (double& p : probs)
      if (p < floor) p = 0.0;
  }

  // Candidates sorted by probability, best first (ties by id for determinism).
  std::vector<int32_t> order;
  order.reserve(vocab);
  for (int32_t i = 0; i < vocab; ++i)
    if (probs[i] > 0.0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  if (params.top_k > 0 && static_cast<int32_t>(order.size()) > params.top_k) order.resize(params.top_k);
  if (params.top_p < 1.0f) {
    double kept_mass = 0.0, total = 0.0;
    for (int32_t t : order) total += probs[t];
    size_t keep = 0;
    while (keep < order.size()) {
      kept_mass += probs[order[keep]];
      ++keep;
      if (kept_mass >= params.top_p * total) break;
    }
    order.resize(keep);
  }
  if (order.empty()) {
    out.token = argmax(logits);
  } else {
    double mass = 0.0;
    for (int32_t t : order) mass += probs[t];
    std::uniform_real_distribution<double> uniform(0.0, mass);
    double r = uniform(rng);
    out.token = order.back();
    for (int32_t t : order) {
      r -= probs[t];
      if (r < 0.0) {
        out.token = t;
        break;
      }
    }
  }
  fill_logprobs(raw, params.logprobs.value_or(0), out);
  return out;
}

}  // namespace pagoda::engine
