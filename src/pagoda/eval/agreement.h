#pragma once
// Agreement between a KV variant (quantized, evicted, shared, latent...) and the uncompressed
// baseline: both runners score the same windows (text_windows.h protocol), and at every predicted
// position the two next-token distributions are compared.
//
//   top1_agreement  fraction of positions where both argmaxes are the same token
//   mean_kl         mean KL(baseline || variant) in nats; max_kl the worst position
//   perplexity      of each, and the variant's relative change
//
// Identical runners give agreement 1 and KL 0 exactly (a test checks it).
// Thread safety: uses both runners; one call at a time per runner.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/eval/paged_runner.h"
#include "pagoda/eval/perplexity.h"

namespace pagoda::eval {

struct AgreementResult {
  int64_t tokens = 0;  // predicted positions compared
  int32_t windows = 0;
  double top1_agreement = 0.0;
  double mean_kl = 0.0;
  double max_kl = 0.0;
  double baseline_perplexity = 0.0;
  double variant_perplexity = 0.0;
  // (variant / baseline - 1) * 100
  double perplexity_change_percent = 0.0;
};

// Errors: the runners disagree on the vocabulary, a bad window, too few tokens, runner errors.
StatusOr<AgreementResult> compute_agreement(PagedRunner& baseline, PagedRunner& variant,
                                            std::span<const int32_t> tokens, int32_t window,
                                            const ProgressCallback& progress = nullptr);

// Several variants against one baseline, which is scored once per window (a dtype sweep costs
// 1 + variants runs instead of 2 x variants). Results in the order of `variants`; each equals
// what compute_agreement(baseline, *variants[i], ...) returns.
StatusOr<std::vector<AgreementResult>> compute_agreement(PagedRunner& baseline,
                                                         std::span<PagedRunner* const> variants,
                                                         std::span<const int32_t> tokens,
                                                         int32_t window,
                                                         const ProgressCallback& progress = nullptr);

}  // namespace pagoda::eval
