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
#include <map>
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
  // Uncached prompt tokens of those requests whose prefill has not started
  // yet, as far as the router can tell: work queued ahead of a new request.
  int64_t pending_prefill_tokens() const { return pending_prefill_tokens_.load(); }

  // A request's prefill, pending from begin_prefill (it was routed here) until
  // the first of: end_prefill (its first body bytes arrived, or it ended), or
  // a load report that shows the backend has started it (settle_prefills).
  // Returns a ticket for end_prefill.
  uint64_t begin_prefill(int64_t tokens);
  void end_prefill(uint64_t ticket);  // idempotent
  // A load report (`waiting` + `queued` requests not started) read from a
  // request sent at `asked`: of the prefills begun before `asked -
  // arrival_allowance` (time for a routed request to reach the backend's
  // queue), all but the newest `waiting + queued` have started there (the
  // backend admits in arrival order). Other clients' requests in that count
  // only make this keep more prefills pending than are.
  void settle_prefills(const BackendLoad& load, std::chrono::steady_clock::time_point asked,
                       std::chrono::milliseconds arrival_allowance);
  int64_t prefills_settled_by_load() const { return prefills_settled_.load(); }

  // The backend's tokenizer + chat template fingerprint as checked when it
  // joined (docs/ROUTER.md "Tokenizer check"): kMatch, or a reason the
  // router's prompt hashes may not be the backend's.
  enum class TokenizerCheck { kUnchecked, kMatch, kMismatch, kUnknown };
  TokenizerCheck tokenizer_check() const { return tokenizer_check_.load(); }
  void set_tokenizer_check(TokenizerCheck c) { tokenizer_check_ = c; }

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

  struct PendingPrefill {
    std::chrono::steady_clock::time_point routed;
    int64_t tokens = 0;
  };
  mutable std::mutex prefill_mutex_;
  std::map<uint64_t, PendingPrefill> pending_prefills_;  // by ticket: in routing order
  uint64_t next_ticket_ = 1;
  std::atomic<int64_t> pending_prefill_tokens_{0};
  std::atomic<int64_t> prefills_settled_{0};
  std::atomic<TokenizerCheck> tokenizer_check_{TokenizerCheck::kUnchecked};
};

}  // namespace pagoda::router
