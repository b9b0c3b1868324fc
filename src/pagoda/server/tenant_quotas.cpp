#include "pagoda/server/tenant_quotas.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace pagoda::server {

TenantQuotas::TenantQuotas(std::function<double()> now) : now_(std::move(now)) {
  if (!now_) {
    now_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
}

void TenantQuotas::refill(State& s, const TenantLimits& limits, double now) const {
  const double capacity = static_cast<double>(limits.tokens_per_minute);
  if (s.tokens < 0) s.tokens = capacity;
  s.tokens = std::min(capacity, s.tokens + (now - s.updated) * capacity / 60.0);
  s.updated = now;
}

std::optional<QuotaRefusal> TenantQuotas::admit(const std::string& tenant, const TenantLimits& limits,
                                                int64_t tokens, int32_t requests) {
  const double now = now_();
  std::lock_guard lock(mutex_);
  State& s = states_[tenant];
  if (limits.max_requests_in_flight > 0 && requests > limits.max_requests_in_flight) {
    QuotaRefusal r;
    r.reason = Refusal::kTenantQueue;
    r.ever_possible = false;
    r.message = fmt::format("this request batches {} prompts, more than your tenant's {} requests in flight; send "
                            "at most {} prompts per request",
                            requests, limits.max_requests_in_flight, limits.max_requests_in_flight);
    return r;
  }
  if (limits.max_requests_in_flight > 0 && s.in_flight + requests > limits.max_requests_in_flight) {
    QuotaRefusal r;
    r.reason = Refusal::kTenantQueue;
    r.message = fmt::format("your tenant has {} requests in flight, its limit; retry when one finishes", s.in_flight);
    return r;
  }
  if (limits.tokens_per_minute > 0) {
    if (tokens > limits.tokens_per_minute) {
      QuotaRefusal r;
      r.reason = Refusal::kTokensPerMinute;
      r.ever_possible = false;
      r.message = fmt::format("this request reserves {} tokens (prompt + n x max_tokens), over your tenant's whole "
                              "budget of {} tokens per minute; lower max_tokens or n",
                              tokens, limits.tokens_per_minute);
      return r;
    }
    refill(s, limits, now);
    if (static_cast<double>(tokens) > s.tokens) {
      const double rate = static_cast<double>(limits.tokens_per_minute) / 60.0;
      QuotaRefusal r;
      r.reason = Refusal::kTokensPerMinute;
      r.retry_after_seconds = std::max(1, static_cast<int>(std::ceil((static_cast<double>(tokens) - s.tokens) / rate)));
      r.message = fmt::format("your tenant's budget of {} tokens per minute is spent; this request needs {} more "
                              "tokens of budget, back in about {} s",
                              limits.tokens_per_minute, static_cast<int64_t>(std::ceil(tokens - s.tokens)),
                              r.retry_after_seconds);
      return r;
    }
    s.tokens -= static_cast<double>(tokens);
  }
  s.in_flight += requests;
  return std::nullopt;
}

void TenantQuotas::release(const std::string& tenant, const TenantLimits& limits, int64_t reserved_tokens,
                           int64_t used_tokens, int32_t requests) {
  const double now = now_();
  std::lock_guard lock(mutex_);
  State& s = states_[tenant];
  s.in_flight = std::max(0, s.in_flight - requests);
  if (limits.tokens_per_minute > 0) {
    refill(s, limits, now);
    const int64_t unused = std::max<int64_t>(0, reserved_tokens - used_tokens);
    s.tokens = std::min(static_cast<double>(limits.tokens_per_minute), s.tokens + static_cast<double>(unused));
  }
}

int32_t TenantQuotas::requests_in_flight(const std::string& tenant) const {
  std::lock_guard lock(mutex_);
  const auto it = states_.find(tenant);
  return it == states_.end() ? 0 : it->second.in_flight;
}

}  // namespace pagoda::server
