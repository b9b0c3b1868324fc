#include "pagoda/backend/cpu/kernels/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pagoda::kernels {

void log_softmax(const float* logits, float* out, size_t n) {
  if (n == 0) return;
  const float max_logit = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  const float log_sum = static_cast<float>(std::log(sum));
  for (size_t i = 0; i < n; ++i) out[i] = (logits[i] - max_logit) - log_sum;
}

std::vector<std::pair<int32_t, float>> top_k(const float* row, size_t n, size_t k) {
  k = std::min(k, n);
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), better);
  std::vector<std::pair<int32_t, float>> result;
  result.reserve(k);
  for (size_t i = 0; i < k; ++i) result.emplace_back(ids[i], row[ids[i]]);
  return result;
}

int32_t argmax(const float* row, size_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace pagoda::kernels
