#pragma once
// In-context recall ("needle" / word-list recall), the measure token eviction
// is judged by: a list of words is placed in a long prompt of filler text at a
// given depth (tokens between the list's end and the prompt's end); the prompt
// ends with the list's introduction again, and the model, decoding greedily,
// should continue with the same words. Recall token accuracy = generated
// tokens equal to the list's tokens at the same place / list tokens. Run
// through PagedRunner::greedy, so whatever KV settings (dtype, token eviction)
// the runner has are what is measured.
//
// Thread safety: uses the runner; one call at a time.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/eval/paged_runner.h"
#include "pagoda/eval/perplexity.h"  // ProgressCallback

namespace pagoda::eval {

struct RecallSpec {
  std::vector<int32_t> filler;              // haystack text, at least context_tokens long
  std::vector<std::vector<int32_t>> words;  // candidate words (each its tokens), at least list_words
  std::vector<int32_t> intro;               // introduces the list, and ends the prompt as the cue
  std::vector<int32_t> terminator;          // closes the list (e.g. ".\n")
  int32_t list_words = 8;
  int32_t context_tokens = 900;  // prompt length
  std::vector<int32_t> depths = {128, 256, 512, 768};
  int32_t trials = 2;  // per depth, each with other words and filler
  uint64_t seed = 1;
};

struct RecallResult {
  double token_accuracy = 0.0;  // over every trial
  int64_t list_tokens = 0;
  std::vector<double> accuracy_by_depth;  // spec.depths order
  double prefill_seconds = 0.0;           // summed over trials
  double decode_seconds = 0.0;
  int64_t decoded_tokens = 0;
};

// Errors (kInvalidArgument): too little filler or too few words, a depth that
// leaves no room for the list, empty intro; and the runner's errors.
// `progress` (optional) hears (lists done, lists in all) after each trial.
StatusOr<RecallResult> evaluate_recall(PagedRunner& runner, const RecallSpec& spec,
                                       const ProgressCallback& progress = nullptr);

}  // namespace pagoda::eval
