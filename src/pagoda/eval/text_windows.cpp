#include "pagoda/eval/text_windows.h"

#include <algorithm>

namespace pagoda::eval {

StatusOr<std::vector<TokenWindow>> make_windows(int64_t num_tokens, int32_t window) {
  if (window < 2) return invalid_argument_error("window must be at least 2 tokens, got {}", window);
  std::vector<TokenWindow> windows;
  for (int64_t begin = 0; begin < num_tokens; begin += window) {
    const int64_t length = std::min<int64_t>(window, num_tokens - begin);
    if (length >= 2) windows.push_back({begin, length});
  }
  return windows;
}

int64_t predicted_tokens(std::span<const TokenWindow> windows) {
  int64_t total = 0;
  for (const auto& w : windows) total += w.length - 1;
  return total;
}

}  // namespace pagoda::eval
