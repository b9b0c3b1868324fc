#include "pagoda/eval/agreement.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "pagoda/eval/log_probs.h"
#include "pagoda/eval/text_windows.h"

namespace pagoda::eval {

StatusOr<AgreementResult> compute_agreement(PagedRunner& baseline, PagedRunner& variant,
                                            std::span<const int32_t> tokens, int32_t window,
                                            const ProgressCallback& progress) {
  if (baseline.vocab_size() != variant.vocab_size())
    return invalid_argument_error("vocabularies differ: baseline {} vs variant {}",
                                  baseline.vocab_size(), variant.vocab_size());
  const int64_t limit =
      std::min(baseline.options().max_sequence_tokens, variant.options().max_sequence_tokens);
  if (window > limit)
    return invalid_argument_error("window of {} tokens exceeds the runners' {} tokens", window,
                                  limit);
  PAGODA_ASSIGN_OR_RETURN(auto windows, make_windows(static_cast<int64_t>(tokens.size()), window));
  if (windows.empty())
    return invalid_argument_error("{} tokens: at least 2 are needed to predict one", tokens.size());

  const size_t vocab = static_cast<size_t>(baseline.vocab_size());
  std::vector<float> base_logits, variant_logits;
  std::vector<double> base_logp, variant_logp;
  AgreementResult result;
  int64_t agreed = 0;
  double kl_sum = 0.0, base_nll = 0.0, variant_nll = 0.0;
  for (size_t w = 0; w < windows.size(); ++w) {
    const auto piece = tokens.subspan(windows[w].begin, windows[w].length);
    PAGODA_RETURN_IF_ERROR(baseline.score(piece, base_logits));
    PAGODA_RETURN_IF_ERROR(variant.score(piece, variant_logits));
    for (size_t i = 0; i + 1 < piece.size(); ++i) {
      const std::span<const float> base_row(base_logits.data() + i * vocab, vocab);
      const std::span<const float> variant_row(variant_logits.data() + i * vocab, vocab);
      log_softmax(base_row, base_logp);
      log_softmax(variant_row, variant_logp);
      if (argmax(base_row) == argmax(variant_row)) ++agreed;
      // Rounding can make KL of (nearly) equal distributions a hair below zero.
      const double kl = std::max(0.0, kl_divergence(base_logp, variant_logp));
      kl_sum += kl;
      result.max_kl = std::max(result.max_kl, kl);
      base_nll -= base_logp[piece[i + 1]];
      variant_nll -= variant_logp[piece[i + 1]];
    }
    if (progress) progress(static_cast<int32_t>(w + 1), static_cast<int32_t>(windows.size()));
  }
  result.tokens = predicted_tokens(windows);
  result.windows = static_cast<int32_t>(windows.size());
  const double n = static_cast<double>(result.tokens);
  result.top1_agreement = static_cast<double>(agreed) / n;
  result.mean_kl = kl_sum / n;
  result.baseline_perplexity = std::exp(base_nll / n);
  result.variant_perplexity = std::exp(variant_nll / n);
  result.perplexity_change_percent =
      (result.variant_perplexity / result.baseline_perplexity - 1.0) * 100.0;
  return result;
}

}  // namespace pagoda::eval
