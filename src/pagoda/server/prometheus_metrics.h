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

// The compiled-grammar cache of structured outputs (structured_output.h).
struct GrammarCacheCounters {
  int64_t grammars = 0;   // compiled grammars cached now
  int64_t bytes = 0;      // their memory (CompiledGrammar::memory_bytes)
  int64_t compiled = 0;   // grammars compiled (cache misses)
  int64_t evictions = 0;  // grammars dropped to stay under the cache's count / memory bounds
};
std::string render_grammar_cache_metrics(const GrammarCacheCounters& grammars);

// `tenants`: per-tenant counters, labelled by tenant name (the endpoint is for
// admins only when api keys are on).
std::string render_prometheus_metrics(const engine::EngineStats& stats, const HttpCounters& http,
                                      const std::map<std::string, TenantCounters, std::less<>>& tenants = {});

}  // namespace pagoda::server
