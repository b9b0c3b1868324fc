#include "pagoda/eval/agreement.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "pagoda/eval/log_probs.h"
#include "pagoda/eval/text_windows.h"

namespace pagoda::eval {

namespace {

// Running sums of one variant against the baseline.
struct AgreementSums {
  int64_t agreed = 0;
  double kl_sum = 0.0;
  double max_kl = 0.0;
  double nll = 0.0;
};

}  // namespace

StatusOr<std::vector<AgreementResult>> compute_agreement(PagedRunner& baseline,
                                                         std::span<PagedRunner* const> variants,
                                                         std::span<const int32_t> tokens,
                                                         int32_t window,
                                                         const ProgressCallback& progress) {
  if (variants.empty()) return invalid_argument_error("no KV variant to compare with the baseline");
  int64_t limit = baseline.options().max_sequence_tokens;
  for (PagedRunner* variant : variants) {
    if (variant == nullptr) return invalid_argument_error("a variant runner is null");
    if (baseline.vocab_size() != variant->vocab_size())
      return invalid_argument_error("vocabularies differ: baseline {} vs variant {}",
                                    baseline.vocab_size(), variant->vocab_size());
    limit = std::min(limit, variant->options().max_sequence_tokens);
  }
  if (window > limit)
    return invalid_argument_error("window of {} tokens exceeds the runners' {} tokens", window,
                                  limit);
  PAGODA_ASSIGN_OR_RETURN(auto windows, make_windows(static_cast<int64_t>(tokens.size()), window));
  if (windows.empty())
    return invalid_argument_error("{} tokens: at least 2 are needed to predict one", tokens.size());

  const size_t vocab = static_cast<size_t>(baseline.vocab_size());
  std::vector<float> base_logits, variant_logits;
  std::vector<double> base_logp, variant_logp;
  std::vector<AgreementSums> sums(variants.size());
  double base_nll = 0.0;
  for (size_t w = 0; w < windows.size(); ++w) {
    const auto piece = tokens.subspan(windows[w].begin, windows[w].length);
    PAGODA_RETURN_IF_ERROR(baseline.score(piece, base_logits));
    for (size_t i = 0; i + 1 < piece.size(); ++i) {
      log_softmax(std::span<const float>(base_logits.data() + i * vocab, vocab), base_logp);
      base_nll -= base_logp[piece[i + 1]];
    }
    for (size_t v = 0; v < variants.size(); ++v) {
      PAGODA_RETURN_IF_ERROR(variants[v]->score(piece, variant_logits));
      AgreementSums& sum = sums[v];
      for (size_t i = 0; i + 1 < piece.size(); ++i) {
        const std::span<const float> base_row(base_logits.data() + i * vocab, vocab);
        const std::span<const float> variant_row(variant_logits.data() + i * vocab, vocab);
        log_softmax(base_row, base_logp);
        log_softmax(variant_row, variant_logp);
        if (argmax(base_row) == argmax(variant_row)) ++sum.agreed;
        // Rounding can make KL of (nearly) equal distributions a hair below zero.
        const double kl = std::max(0.0, kl_divergence(base_logp, variant_logp));
        sum.kl_sum += kl;
        sum.max_kl = std::max(sum.max_kl, kl);
        sum.nll -= variant_logp[piece[i + 1]];
      }
    }
    if (progress) progress(static_cast<int32_t>(w + 1), static_cast<int32_t>(windows.size()));
  }
  std::vector<AgreementResult> results;
  const int64_t predicted = predicted_tokens(windows);
  const double n = static_cast<double>(predicted);
  for (const AgreementSums& sum : sums) {
    AgreementResult r;
    r.tokens = predicted;
    r.windows = static_cast<int32_t>(windows.size());
    r.top1_agreement = static_cast<double>(sum.agreed) / n;
    r.mean_kl = sum.kl_sum / n;
    r.max_kl = sum.max_kl;
    r.baseline_perplexity = std::exp(base_nll / n);
    r.variant_perplexity = std::exp(sum.nll / n);
    r.perplexity_change_percent = (r.variant_perplexity / r.baseline_perplexity - 1.0) * 100.0;
    results.push_back(r);
  }
  return results;
}

StatusOr<AgreementResult> compute_agreement(PagedRunner& baseline, PagedRunner& variant,
                                            std::span<const int32_t> tokens, int32_t window,
                                            const ProgressCallback& progress) {
  PagedRunner* const variants[] = {&variant};
  PAGODA_ASSIGN_OR_RETURN(auto results, compute_agreement(baseline, variants, tokens, window, progress));
  return results.front();
}

}  // namespace pagoda::eval
