#include "pagoda/server/tenant_usage.h"

namespace pagoda::server {

const char* refusal_name(Refusal refusal) {
  switch (refusal) {
    case Refusal::kQueueFull: return "queue_full";
    case Refusal::kTenantQueue: return "tenant_queue_full";
    case Refusal::kTokensPerMinute: return "tokens_per_minute";
    case Refusal::kKvBlocks: return "kv_blocks";
    case Refusal::kRequestCost: return "request_cost";
  }
  return "unknown";
}

void TenantUsageBook::record_accepted(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  ++by_tenant_[tenant].requests_accepted;
}

void TenantUsageBook::record_refused(const std::string& tenant, Refusal refusal) {
  std::lock_guard lock(mutex_);
  ++by_tenant_[tenant].requests_refused[static_cast<int>(refusal)];
}

void TenantUsageBook::record_finished(const std::string& tenant, const engine::Usage& usage) {
  std::lock_guard lock(mutex_);
  TenantCounters& c = by_tenant_[tenant];
  ++c.requests_finished;
  c.prompt_tokens += usage.prompt_tokens;
  c.completion_tokens += usage.completion_tokens;
  c.cached_prompt_tokens += usage.cached_tokens;
}

TenantCounters TenantUsageBook::counters(const std::string& tenant) const {
  std::lock_guard lock(mutex_);
  const auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? TenantCounters{} : it->second;
}

std::map<std::string, TenantCounters, std::less<>> TenantUsageBook::all() const {
  std::lock_guard lock(mutex_);
  return by_tenant_;
}

}  // namespace pagoda::server
