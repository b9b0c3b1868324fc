#pragma once
// Per-tenant admission quotas, decided before a request reaches the engine:
//  - requests in flight (accepted and not yet finished: queued or running),
//    so one tenant cannot fill the engine's shared queue;
//  - tokens per minute: a token bucket holding at most one minute's budget,
//    refilled continuously. A request reserves prompt + n x max_tokens when it
//    is admitted; when it ends, what it did not use is given back (a request
//    whose client left keeps its whole reservation charged).
// The third quota, KV blocks held, is the KV manager's
// (KvCacheManager::set_namespace_block_limit); this class only carries its value.
// A refusal says which quota, and in how many seconds a retry can succeed
// (Retry-After); a request bigger than a whole quota is refused for good.
//
// Thread safety: every method is safe from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "pagoda/server/api_keys.h"
#include "pagoda/server/tenant_usage.h"

namespace pagoda::server {

struct QuotaRefusal {
  Refusal reason = Refusal::kTenantQueue;
  bool ever_possible = true;    // false: this request can never pass (bigger than the whole quota)
  int retry_after_seconds = 1;  // when ever_possible
  std::string message;
};

class TenantQuotas {
 public:
  // `now` in seconds on a monotonic clock (tests pass a fake one).
  explicit TenantQuotas(std::function<double()> now = nullptr);

  // Admits one request reserving `tokens`, or says why not (nothing is
  // reserved then). Every admitted request must be released exactly once.
  // A batched completions request admits its `requests` prompts at once: each
  // counts against the requests in flight.
  std::optional<QuotaRefusal> admit(const std::string& tenant, const TenantLimits& limits, int64_t tokens,
                                    int32_t requests = 1);
  // The request (its `requests` prompts) ended having used `used_tokens` of its reservation.
  void release(const std::string& tenant, const TenantLimits& limits, int64_t reserved_tokens, int64_t used_tokens,
               int32_t requests = 1);

  int32_t requests_in_flight(const std::string& tenant) const;

 private:
  struct State {
    int32_t in_flight = 0;
    double tokens = -1;  // bucket level; < 0: not started (full)
    double updated = 0;  // when `tokens` was last refilled
  };
  void refill(State& s, const TenantLimits& limits, double now) const;

  std::function<double()> now_;
  mutable std::mutex mutex_;
  std::map<std::string, State, std::less<>> states_;
};

}  // namespace pagoda::server
