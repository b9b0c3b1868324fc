#include "pagoda/runtime/kv_compression.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>

namespace pagoda::runtime {

namespace {

constexpr std::array<std::pair<KvCompressionPolicy, std::string_view>, 6> kPolicyNames{{
    {KvCompressionPolicy::kNone, "none"},
    {KvCompressionPolicy::kStreaming, "streaming"},
    {KvCompressionPolicy::kH2O, "h2o"},
    {KvCompressionPolicy::kSnapKV, "snapkv"},
    {KvCompressionPolicy::kPyramidKV, "pyramidkv"},
    {KvCompressionPolicy::kEntropy, "entropy"},
}};

// SnapKV's pooling width over neighbouring indices.
constexpr int32_t kPoolWidth = 7;

int32_t floor_budget(const KvCompressionConfig& c) { return c.sink_tokens + c.window; }

// entropy: the share of the mean's scored tokens (budget - sinks - window)
// every head keeps whatever its entropy (runtime/kv_compression.h).
constexpr double kEntropyFloorShare = 0.5;

bool pools_scores(KvCompressionPolicy p) {
  return p == KvCompressionPolicy::kSnapKV || p == KvCompressionPolicy::kPyramidKV ||
         p == KvCompressionPolicy::kEntropy;
}

}  // namespace

std::string_view kv_compression_policy_name(KvCompressionPolicy policy) {
  for (const auto& [p, name] : kPolicyNames)
    if (p == policy) return name;
  return "unknown";
}

StatusOr<KvCompressionPolicy> parse_kv_compression_policy(std::string_view name, std::string_view field) {
  for (const auto& [p, n] : kPolicyNames)
    if (n == name) return p;
  return invalid_argument_error("{} '{}' is not a KV compression policy (none, streaming, h2o, snapkv, pyramidkv, "
                                "entropy)",
                                field, name);
}

Status validate_kv_compression(const KvCompressionConfig& c, std::string_view prefix) {
  // Flags spell the names with dashes ("--kv-sink-tokens"), JSON fields with underscores.
  const bool flag = prefix.starts_with("--");
  const std::string budget = std::string(prefix) + "budget";
  const std::string sinks = std::string(prefix) + (flag ? "sink-tokens" : "sink_tokens");
  const std::string window = std::string(prefix) + "window";
  const std::string policy = flag ? std::string(prefix) + "compression" : std::string(prefix) + "policy";
  if (c.sink_tokens < 0) return invalid_argument_error("{} must be >= 0, got {}", sinks, c.sink_tokens);
  if (c.window < 0) return invalid_argument_error("{} must be >= 0, got {}", window, c.window);
  if (c.span < 0 || c.span > kMaxKvSpan)
    return invalid_argument_error("{}span must be in [0, {}], got {}", prefix, kMaxKvSpan, c.span);
  if (!c.enabled()) {
    if (c.budget != 0)
      return invalid_argument_error("{} {} is set without a KV compression policy ({} is none)", budget, c.budget,
                                    policy);
    return ok_status();
  }
  if (c.budget <= floor_budget(c))
    return invalid_argument_error("{} {} must exceed {} + {} = {} + {} ({} {})", budget, c.budget, sinks, window,
                                  c.sink_tokens, c.window, policy, kv_compression_policy_name(c.policy));
  return ok_status();
}

bool kv_policy_uses_scores(KvCompressionPolicy p) {
  return p != KvCompressionPolicy::kNone && p != KvCompressionPolicy::kStreaming;
}

bool kv_policy_accumulates(KvCompressionPolicy p) { return p == KvCompressionPolicy::kH2O; }

int32_t kv_compaction_capacity(const KvCompressionConfig& c, int32_t num_layers) {
  switch (c.policy) {
    case KvCompressionPolicy::kPyramidKV:
      return num_layers <= 1 ? c.budget : (3 * c.budget + 1) / 2;
    case KvCompressionPolicy::kEntropy: return 2 * c.budget;
    default: return c.budget;
  }
}

int32_t kv_compaction_trigger(const KvCompressionConfig& c, int32_t num_layers, int32_t block_size) {
  return kv_compaction_capacity(c, num_layers) + std::max(1, block_size);
}

std::vector<int32_t> kv_head_budgets(const KvCompressionConfig& c, int32_t num_layers, int32_t num_kv_heads,
                                     std::span<const float> entropy) {
  const size_t n = static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads);
  const int32_t lo = floor_budget(c);
  const int32_t cap = kv_compaction_capacity(c, num_layers);
  std::vector<int32_t> out(n, c.budget);
  if (c.policy == KvCompressionPolicy::kPyramidKV && num_layers > 1) {
    for (int32_t l = 0; l < num_layers; ++l) {
      // Linear from 1.5 x budget (first layer) to 0.5 x budget (last layer).
      const double share = 1.5 - static_cast<double>(l) / (num_layers - 1);
      const int32_t b = std::clamp(static_cast<int32_t>(std::lround(share * c.budget)), lo, cap);
      std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(l) * num_kv_heads, num_kv_heads, b);
    }
  } else if (c.policy == KvCompressionPolicy::kEntropy && entropy.size() == n) {
    // Every head keeps the floor; the rest of the total is shared in proportion to entropy.
    const int32_t head_floor = lo + static_cast<int32_t>(std::floor(kEntropyFloorShare * (c.budget - lo)));
    const double total_extra = static_cast<double>(n) * (c.budget - head_floor);
    double sum = 0.0;
    for (float e : entropy) sum += std::max(0.0f, e);
    for (size_t i = 0; i < n; ++i) {
      const double share = sum > 0.0 ? std::max(0.0f, entropy[i]) / sum : 1.0 / static_cast<double>(n);
      out[i] = std::clamp(head_floor + static_cast<int32_t>(std::floor(share * total_extra)), head_floor, cap);
    }
  }
  return out;
}

void kv_span_scores(std::span<float> s, int32_t span) {
  if (span <= 0 || s.size() < 2) return;
  // Backwards, so that s[i - k] is still the unspanned score when s[i] is written.
  for (size_t i = s.size() - 1; i > 0; --i) {
    float best = s[i], weight = 1.0f;
    for (int32_t k = 1; k <= span && static_cast<size_t>(k) <= i; ++k) {
      weight *= kKvSpanDecay;
      best = std::max(best, weight * s[i - static_cast<size_t>(k)]);
    }
    s[i] = best;
  }
}

std::vector<int32_t> select_kept_tokens(const KvCompressionConfig& c, int32_t budget, int32_t num_valid,
                                        std::span<const float> scores) {
  std::vector<int32_t> kept;
  if (num_valid <= 0) return kept;
  if (budget >= num_valid) {
    kept.resize(static_cast<size_t>(num_valid));
    std::iota(kept.begin(), kept.end(), 0);
    return kept;
  }
  budget = std::max(budget, 0);
  const int32_t sinks = std::min(c.sink_tokens, budget);
  // Streaming keeps the most recent budget - sinks; the others the window, then by score.
  const int32_t recent = c.policy == KvCompressionPolicy::kStreaming ? budget - sinks
                                                                     : std::min(c.window, budget - sinks);
  const int32_t middle_begin = sinks, middle_end = num_valid - recent;
  const int32_t by_score = budget - sinks - recent;
  for (int32_t i = 0; i < sinks; ++i) kept.push_back(i);
  if (by_score > 0 && middle_end > middle_begin) {
    std::vector<float> s(static_cast<size_t>(middle_end - middle_begin), 0.0f);
    const bool have_scores = static_cast<int32_t>(scores.size()) == num_valid;
    for (int32_t i = middle_begin; have_scores && i < middle_end; ++i) {
      if (!pools_scores(c.policy)) {
        s[static_cast<size_t>(i - middle_begin)] = scores[static_cast<size_t>(i)];
        continue;
      }
      const int32_t a = std::max(0, i - kPoolWidth / 2), b = std::min(num_valid, i + kPoolWidth / 2 + 1);
      float sum = 0.0f;
      for (int32_t j = a; j < b; ++j) sum += scores[static_cast<size_t>(j)];
      s[static_cast<size_t>(i - middle_begin)] = sum / static_cast<float>(b - a);
    }
    if (have_scores && pools_scores(c.policy)) kv_span_scores(s, c.span);
    std::vector<int32_t> order(s.size());
    std::iota(order.begin(), order.end(), 0);
    const size_t take = std::min(order.size(), static_cast<size_t>(by_score));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end(),
                      [&](int32_t x, int32_t y) { return s[x] != s[y] ? s[x] > s[y] : x > y; });
    order.resize(take);
    std::sort(order.begin(), order.end());
    for (int32_t o : order) kept.push_back(middle_begin + o);
  }
  for (int32_t i = std::max(middle_end, sinks); i < num_valid; ++i) kept.push_back(i);
  return kept;
}

}  // namespace pagoda::runtime
