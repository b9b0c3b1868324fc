#include "pagoda/eval/log_probs.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace pagoda::eval {

double log_sum_exp(std::span<const float> logits) {
  if (logits.empty()) return -std::numeric_limits<double>::infinity();
  const double max = *std::max_element(logits.begin(), logits.end());
  if (!std::isfinite(max)) return max;
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  return max + std::log(sum);
}

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const double normalizer = log_sum_exp(logits);
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - normalizer;
}

int32_t argmax(std::span<const float> logits) {
  assert(!logits.empty());
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double kl_divergence(std::span<const double> log_p, std::span<const double> log_q) {
  assert(log_p.size() == log_q.size());
  double kl = 0.0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    // exp(-inf) * (-inf - x) would be NaN; a zero-probability term contributes nothing.
    if (log_p[i] == -std::numeric_limits<double>::infinity()) continue;
    kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  }
  return kl;
}

}  // namespace pagoda::eval
