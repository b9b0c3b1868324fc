#include "pagoda/router/routing_policy.h"

#include <algorithm>

namespace pagoda::router {

StatusOr<RoutingPolicy> parse_routing_policy(std::string_view name) {
  if (name == "kv-aware") return RoutingPolicy::kKvAware;
  if (name == "round-robin") return RoutingPolicy::kRoundRobin;
  if (name == "least-loaded") return RoutingPolicy::kLeastLoaded;
  return invalid_argument_error("--policy '{}': expected kv-aware, round-robin or least-loaded",
                                std::string(name.substr(0, 64)));
}

std::string_view routing_policy_name(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kKvAware: return "kv-aware";
    case RoutingPolicy::kRoundRobin: return "round-robin";
    case RoutingPolicy::kLeastLoaded: return "least-loaded";
  }
  return "unknown";
}

double backend_load(const BackendView& view) {
  return static_cast<double>(std::max(view.in_flight, view.reported_busy)) + std::clamp(view.kv_usage, 0.0, 1.0);
}

RoutingChoice choose_backend(RoutingPolicy policy, std::span<const BackendView> backends, int64_t prompt_tokens,
                             double load_weight, uint64_t rotation) {
  RoutingChoice best;
  const size_t n = backends.size();
  if (n == 0) return best;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (rotation + k) % n;
    const BackendView& b = backends[i];
    if (!b.eligible) continue;
    double cost = 0.0;
    switch (policy) {
      case RoutingPolicy::kRoundRobin:
        return RoutingChoice{static_cast<int>(i), 0.0};
      case RoutingPolicy::kLeastLoaded:
        cost = backend_load(b);
        break;
      case RoutingPolicy::kKvAware: {
        const int64_t cached = std::clamp<int64_t>(b.cached_tokens, 0, std::max<int64_t>(prompt_tokens, 0));
        cost = static_cast<double>(std::max<int64_t>(prompt_tokens, 0) - cached) +
               static_cast<double>(std::max<int64_t>(b.pending_prefill_tokens, 0)) + load_weight * backend_load(b);
        break;
      }
    }
    if (best.index < 0 || cost < best.cost) best = RoutingChoice{static_cast<int>(i), cost};
  }
  return best;
}

}  // namespace pagoda::router
