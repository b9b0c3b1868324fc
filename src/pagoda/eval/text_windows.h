#pragma once
// How the quality harness cuts a token sequence for scoring, identical to
// tools/train/train.py (which produced the transformers figures we compare against):
// consecutive, non-overlapping windows of `window` tokens; each window is scored from an empty
// KV cache and predicts every token but its first (window - 1 predictions); a last window of a
// single token predicts nothing and is dropped.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::eval {

struct TokenWindow {
  int64_t begin = 0;   // index of the first token in the whole sequence
  int64_t length = 0;  // >= 2
};

// Errors: window < 2 (kInvalidArgument).
StatusOr<std::vector<TokenWindow>> make_windows(int64_t num_tokens, int32_t window);

// Tokens predicted over all windows: sum of (length - 1).
int64_t predicted_tokens(std::span<const TokenWindow> windows);

}  // namespace pagoda::eval
