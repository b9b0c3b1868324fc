#pragma once
// The router's own counters and their Prometheus text (GET /metrics of
// `pagoda route`). Per backend: requests, responses by status class,
// transport errors, health, requests in flight, pending prefill, pooled
// connections, prefix index size and resyncs, the tokenizer check. The HTTP
// front's connections, refusals and deadlines. Router-wide: retries, 503s for want of a healthy
// backend, client disconnects, and for kv-aware decisions the cached-prefix
// length of the chosen backend (a histogram in tokens) with the prompt tokens
// routed, so predicted hits / prompt tokens is the cluster's expected hit rate.
//
// Thread safety: record_* from any thread; render() takes a consistent enough
// view (each counter is read once).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "pagoda/router/backend.h"
#include "pagoda/server/http_front.h"

namespace pagoda::router {

class RouterMetrics {
 public:
  // Bucket upper bounds of the cached-prefix histogram, in tokens.
  static constexpr std::array<int64_t, 12> kPrefixBuckets = {0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

  void record_prefix_match(int64_t cached_tokens, int64_t prompt_tokens);
  std::atomic<int64_t> retries{0};
  std::atomic<int64_t> no_backend{0};          // 503: no healthy backend
  std::atomic<int64_t> client_disconnects{0};  // the client left before the response ended
  std::atomic<int64_t> unhashed_prompts{0};    // kv-aware requests routed without prefix knowledge
  std::atomic<int64_t> busy_refusals{0};       // 429: the router's open requests at their cap

  // `front`: the HTTP front's own counters (connections, refusals, deadlines).
  std::string render(std::span<const std::unique_ptr<Backend>> backends, std::string_view policy,
                     const server::HttpFrontCounters& front) const;

 private:
  mutable std::mutex mutex_;
  std::array<int64_t, kPrefixBuckets.size() + 1> prefix_counts_{};  // last: +Inf
  int64_t prefix_sum_ = 0;
  int64_t prefix_count_ = 0;
  int64_t prompt_tokens_ = 0;
};

}  // namespace pagoda::router
