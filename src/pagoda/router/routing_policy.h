#pragma once
// Which backend gets a request: the three policies of `pagoda route`, as one
// pure function over a view of every backend (tests drive it directly).
//
//   round-robin   the next healthy backend in turn.
//   least-loaded  the healthy backend with the least load, where
//                   load = max(requests the router has in flight there,
//                              running + waiting the backend last reported)
//                          + its KV usage (0..1: a full cache weighs one request more).
//                 The router's own count is exact and immediate; the reported one
//                 covers other routers and is at most one poll old.
//   kv-aware      the healthy backend with the lowest
//                   cost = (prompt tokens - tokens of the prompt it holds cached)
//                          + prompt tokens it still has to prefill for requests
//                            this router sent it (pending prefill)
//                          + load_weight * load
//                 i.e. roughly the tokens it must compute before this request's
//                 first token: its own uncached part, the prefills queued ahead
//                 of it, and a price in tokens for every request in flight
//                 (their decode steps share the engine's steps with ours).
//                 With no prefix known anywhere and nothing pending it is
//                 least-loaded.
// Ties go to the first backend in rotation order (`rotation` mod the backend
// count, then onwards), so equal backends take turns.
//
// Thread safety: values and pure functions.

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "pagoda/core/status.h"

namespace pagoda::router {

enum class RoutingPolicy { kKvAware, kRoundRobin, kLeastLoaded };

// "kv-aware" | "round-robin" | "least-loaded"; kInvalidArgument otherwise.
StatusOr<RoutingPolicy> parse_routing_policy(std::string_view name);
std::string_view routing_policy_name(RoutingPolicy policy);

// What the policy sees of one backend.
struct BackendView {
  bool eligible = false;       // healthy and not excluded (a retry skips the backend that failed)
  int64_t in_flight = 0;       // requests this router has open there
  int64_t reported_busy = 0;   // running + waiting, as the backend last reported (0 if unknown)
  double kv_usage = 0.0;       // 0..1, as last reported (0 if unknown)
  int64_t cached_tokens = 0;   // prompt tokens the backend holds cached (kv-aware; 0 if unknown)
  int64_t pending_prefill_tokens = 0;  // uncached prompt tokens of this router's requests not yet answered
};

double backend_load(const BackendView& view);

struct RoutingChoice {
  int index = -1;  // into the views; -1: no eligible backend
  double cost = 0.0;
};

// load_weight > 0 (tokens per request in flight); prompt_tokens >= 0.
RoutingChoice choose_backend(RoutingPolicy policy, std::span<const BackendView> backends, int64_t prompt_tokens,
                             double load_weight, uint64_t rotation);

}  // namespace pagoda::router
