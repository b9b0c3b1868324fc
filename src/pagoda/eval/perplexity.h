#pragma once
// Perplexity of a token sequence under the model, through the paged KV path (PagedRunner), with
// the window protocol of text_windows.h: perplexity = exp(total NLL / predicted tokens), natural
// log. The same protocol produced the transformers figure in models/pagoda-tiny/train_report.json.
//
// Thread safety: uses the runner; one call at a time per runner.

#include <cstdint>
#include <functional>
#include <span>

#include "pagoda/core/status.h"
#include "pagoda/eval/paged_runner.h"

namespace pagoda::eval {

struct PerplexityResult {
  double perplexity = 0.0;
  double mean_nll = 0.0;  // nats per predicted token
  int64_t tokens = 0;     // predicted tokens
  int32_t windows = 0;
};

// Called after every window with (windows done, windows in all).
using ProgressCallback = std::function<void(int32_t done, int32_t total)>;

// Errors: window < 2 or larger than the runner's max_sequence_tokens, fewer than 2 tokens,
// and whatever the runner reports.
StatusOr<PerplexityResult> compute_perplexity(PagedRunner& runner, std::span<const int32_t> tokens,
                                              int32_t window,
                                              const ProgressCallback& progress = nullptr);

}  // namespace pagoda::eval
