#pragma once
// /metrics in the Prometheus text exposition format (version 0.0.4), written
// by hand: KV usage, prefix-cache hit rate in tokens and misses by reason,
// queue length, preemptions, request outcomes, and histograms of time to first
// token, inter-token latency and step time.
//
// Thread safety: pure function over snapshots.

#include <cstdint>
#include <map>
#include <string>

#include "pagoda/engine/engine.h"
#include "pagoda/server/tenant_usage.h"

namespace pagoda::server {

struct HttpCounters {
  std::map<int, int64_t> responses_by_status;  // HTTP status -> count
  int64_t client_disconnects = 0;              // streams aborted because the client left
};

// `tenants`: per-tenant counters, labelled by tenant name (the endpoint is for
// admins only when api keys are on).
std::string render_prometheus_metrics(const engine::EngineStats& stats, const HttpCounters& http,
                                      const std::map<std::string, TenantCounters, std::less<>>& tenants = {});

}  // namespace pagoda::server
