#pragma once
// Next-token distribution math for the quality harness, in double precision so that
// summing NLL over ~10^5 tokens and KL divergences of nearly equal distributions stay exact
// well below the differences being measured (a KV variant vs the baseline).
//
// A "row" is one position's logits over the vocabulary (f32, as the model returns them).
// Thread safety: pure functions.

#include <cstdint>
#include <span>
#include <vector>

namespace pagoda::eval {

// log(sum(exp(logits))), computed stably.
double log_sum_exp(std::span<const float> logits);

// out[i] = logits[i] - log_sum_exp(logits); out is resized to logits.size().
void log_softmax(std::span<const float> logits, std::vector<double>& out);

// Index of the largest logit; the lowest index wins ties (as torch.argmax).
int32_t argmax(std::span<const float> logits);

// KL(p || q) = sum_i p_i (log p_i - log q_i), from log-probabilities of equal length (>= 0,
// up to rounding; the caller clamps if it needs a non-negative figure).
double kl_divergence(std::span<const double> log_p, std::span<const double> log_q);

}  // namespace pagoda::eval
