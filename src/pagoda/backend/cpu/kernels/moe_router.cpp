#include "pagoda/backend/cpu/kernels/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace pagoda::kernels {

namespace {

// Indices of the k largest values, in descending order (ties: lower index first;
// NaN ranks lowest, so the order stays strict and every index valid).
void top_k_indices(const std::vector<float>& values, const std::vector<char>& allowed, size_t k,
                   std::vector<int32_t>& out) {
  out.clear();
  for (size_t i = 0; i < values.size(); ++i)
    if (allowed.empty() || allowed[i]) out.push_back(static_cast<int32_t>(i));
  const size_t n = std::min(k, out.size());
  const auto key = [&values](int32_t i) {
    const float v = values[static_cast<size_t>(i)];
    return std::isnan(v) ? -INFINITY : v;
  };
  std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n), out.end(), [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  });
  out.resize(n);
}

}  // namespace

void moe_route(const float* logits, size_t num_tokens, const MoeConfig& c, const float* correction_bias,
               int32_t* indices, float* weights) {
  const size_t experts = static_cast<size_t>(c.num_experts);
  const size_t k = static_cast<size_t>(c.experts_per_token);
  std::vector<float> scores(experts), choice(experts), group_values;
  std::vector<char> allowed;
  std::vector<int32_t> picked, groups;
  for (size_t t = 0; t < num_tokens; ++t) {
    const float* x = logits + t * experts;
    if (c.scoring == MoeScoring::kSoftmax) {
      const float max_logit = *std::max_element(x, x + experts);
      float sum = 0.0f;
      for (size_t e = 0; e < experts; ++e) {
        scores[e] = std::exp(x[e] - max_logit);
        sum += scores[e];
      }
      for (size_t e = 0; e < experts; ++e) scores[e] /= sum;
    } else {
      for (size_t e = 0; e < experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-x[e]));
    }
    for (size_t e = 0; e < experts; ++e)
      choice[e] = scores[e] + (c.score_correction_bias && correction_bias != nullptr ? correction_bias[e] : 0.0f);

    allowed.clear();
    if (c.group_score != MoeGroupScore::kNone) {
      const size_t num_groups = static_cast<size_t>(c.num_groups);
      const size_t group_size = experts / num_groups;
      group_values.assign(num_groups, 0.0f);
      for (size_t g = 0; g < num_groups; ++g) {
        const float* first = choice.data() + g * group_size;
        if (c.group_score == MoeGroupScore::kMax) {
          group_values[g] = *std::max_element(first, first + group_size);
        } else {  // the sum of the two best
          float best = -INFINITY, second = -INFINITY;
          for (size_t i = 0; i < group_size; ++i) {
            if (first[i] > best) {
              second = best;
              best = first[i];
            } else if (first[i] > second) {
              second = first[i];
            }
          }
          group_values[g] = best + second;
        }
      }
      top_k_indices(group_values, {}, static_cast<size_t>(c.topk_groups), groups);
      allowed.assign(experts, 0);
      for (int32_t g : groups)
        std::fill_n(allowed.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g) * group_size), group_size, 1);
    }
    top_k_indices(choice, allowed, k, picked);

    float sum = 0.0f;
    for (size_t i = 0; i < k; ++i) sum += scores[static_cast<size_t>(picked[i])];
    for (size_t i = 0; i < k; ++i) {
      indices[t * k + i] = picked[i];
      float w = scores[static_cast<size_t>(picked[i])];
      if (c.norm_topk_prob) w = w / (sum + 1e-20f);
      weights[t * k + i] = w * c.routed_scaling_factor;
    }
  }
}

}  // namespace pagoda::kernels
