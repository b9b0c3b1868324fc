#pragma once
// Backend: one `pagoda serve` replica behind the router, and everything the
// router knows about it: health, the load it reports, the requests the router
// has open there, its prefix index, its connection pool and its counters.
//
// Health: a backend starts out of rotation and joins when a /health probe
// answers 200 (backend_monitor.h); it leaves on a failed probe, or at once
// when a request cannot even connect to it.
//
// Thread safety: every method may be called from any thread.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "pagoda/router/backend_reports.h"
#include "pagoda/router/backend_url.h"
#include "pagoda/router/connection_pool.h"
#include "pagoda/router/prefix_index.h"

namespace pagoda::router {

struct BackendOptions {
  int max_connections = 64;
  std::chrono::milliseconds connect_timeout{2000};
};

class Backend {
 public:
  Backend(BackendUrl url, const BackendOptions& options);

  const BackendUrl& url() const { return url_; }
  const std::string& name() const { return url_.text; }

  bool healthy() const { return healthy_.load(); }
  // Returns true if this changed the state.
  bool set_healthy(bool healthy) { return healthy_.exchange(healthy) != healthy; }

  // Latest report, or nullopt if none (or the backend does not share it).
  std::optional<BackendLoad> reported_load() const;
  void set_reported_load(std::optional<BackendLoad> load);

  ConnectionPool& pool() { return pool_; }
  PrefixIndex& index() { return index_; }
  const PrefixIndex& index() const { return index_; }

  // Requests this router has open there (from backend pick to the end of the response).
  std::atomic<int64_t> in_flight{0};
  // Uncached prompt tokens of those requests, until their first body bytes
  // arrive (the prefill is done) or they end: work queued ahead of a new one.
  std::atomic<int64_t> pending_prefill_tokens{0};

  // Counters for /metrics.
  std::atomic<int64_t> requests{0};          // exchanges started (retries included)
  std::atomic<int64_t> transport_errors{0};  // no response: refused, reset, timed out
  std::array<std::atomic<int64_t>, 6> responses_by_class{};  // [status / 100], 0 unused
  std::atomic<int64_t> health_transitions{0};

 private:
  const BackendUrl url_;
  std::atomic<bool> healthy_{false};
  mutable std::mutex load_mutex_;
  std::optional<BackendLoad> load_;
  ConnectionPool pool_;
  PrefixIndex index_;
};

}  // namespace pagoda::router
