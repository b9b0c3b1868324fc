#include "pagoda/eval/perplexity.h"

#include <cmath>
#include <vector>

#include "pagoda/eval/log_probs.h"
#include "pagoda/eval/text_windows.h"

namespace pagoda::eval {

StatusOr<PerplexityResult> compute_perplexity(PagedRunner& runner, std::span<const int32_t> tokens,
                                              int32_t window, const ProgressCallback& progress) {
  if (window > runner.options().max_sequence_tokens)
    return invalid_argument_error("window of {} tokens exceeds the runner's {} tokens", window,
                                  runner.options().max_sequence_tokens);
  PAGODA_ASSIGN_OR_RETURN(auto windows, make_windows(static_cast<int64_t>(tokens.size()), window));
  if (windows.empty())
    return invalid_argument_error("{} tokens: at least 2 are needed to predict one", tokens.size());

  const size_t vocab = static_cast<size_t>(runner.vocab_size());
  std::vector<float> logits;
  double total_nll = 0.0;
  for (size_t w = 0; w < windows.size(); ++w) {
    const auto piece = tokens.subspan(windows[w].begin, windows[w].length);
    PAGODA_RETURN_IF_ERROR(runner.score(piece, logits));
    for (size_t i = 0; i + 1 < piece.size(); ++i) {
      const std::span<const float> row(logits.data() + i * vocab, vocab);
      total_nll += log_sum_exp(row) - static_cast<double>(row[piece[i + 1]]);
    }
    if (progress) progress(static_cast<int32_t>(w + 1), static_cast<int32_t>(windows.size()));
  }
  PerplexityResult result;
  result.tokens = predicted_tokens(windows);
  result.windows = static_cast<int32_t>(windows.size());
  result.mean_nll = total_nll / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.mean_nll);
  if (!std::isfinite(result.perplexity))
    return internal_error("perplexity is not finite (mean NLL {})", result.mean_nll);
  return result;
}

}  // namespace pagoda::eval
