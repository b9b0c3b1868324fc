#pragma once
// Per-tenant request and token counters, kept by the server: what
// `GET /v1/usage` shows a tenant about itself (with the KV manager's
// per-namespace figures), and never about another tenant.
//
// Tenants come from the api-keys file (or are the one tenant "default"), so
// the book holds a bounded number of entries.
//
// Thread safety: every method is safe from any thread.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "pagoda/engine/request.h"

namespace pagoda::server {

// Why the server refused a request before the engine saw it (or the engine's
// queue refused it): each is answered 429 with Retry-After.
enum class Refusal : uint8_t {
  kQueueFull = 0,      // the engine's queue (--max-queued) is full
  kTenantQueue,        // the tenant's own cap on queued requests
  kTokensPerMinute,    // the tenant's tokens-per-minute budget is spent
  kKvBlocks,           // the request needs more KV blocks than the tenant may hold
  kRequestCost,        // n x max_tokens x logprobs over the cost cap
};
inline constexpr int kNumRefusals = 5;
const char* refusal_name(Refusal refusal);

struct TenantCounters {
  int64_t requests_accepted = 0;    // submitted to the engine
  int64_t requests_finished = 0;    // ended (any reason, a client leaving included)
  int64_t requests_refused[kNumRefusals] = {};
  int64_t prompt_tokens = 0;        // of requests that reached their final delta
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;
};

class TenantUsageBook {
 public:
  void record_accepted(const std::string& tenant);
  void record_refused(const std::string& tenant, Refusal refusal);
  void record_finished(const std::string& tenant, const engine::Usage& usage);
  // Zeros for a tenant never seen.
  TenantCounters counters(const std::string& tenant) const;
  // Every tenant seen, by name (for the admin-only /metrics).
  std::map<std::string, TenantCounters, std::less<>> all() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, TenantCounters, std::less<>> by_tenant_;
};

}  // namespace pagoda::server
