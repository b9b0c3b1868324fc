#pragma once
// BackendMonitor: the thread that keeps one Backend's picture current.
//
//   - Health: GET /health every health_interval (and at once after poke()).
//     200 puts the backend in rotation; a refused connection takes it out at
//     once, any other failure (timeout, non-200 such as a draining replica's
//     503) after two probes in a row. Transitions are logged.
//   - KV events (kv-aware routing): every poll_interval, while healthy,
//     GET /v1/kv/events?since=<index's next_since> into the backend's
//     PrefixIndex, at once again while the backend says "more" or the index
//     asks for a resync. The page's "load" (admin keys) updates the load.
//   - Load (other policies, or an events page without load): GET /v1/load
//     every poll_interval.
//   - Tokenizer check: whenever the backend is about to join the rotation,
//     GET /v1/models and compare its "tokenizer_fingerprint" with
//     `tokenizer_fingerprint` (the router's own; empty: no check). A
//     different one is logged as a warning naming the backend, which then
//     joins but is routed by load only (its prefix matches are ignored), or,
//     with `strict_tokenizer`, stays out of rotation (checked again at every
//     probe, so a replica restarted with the right model joins). A backend
//     that advertises none, or refuses /v1/models, is logged as unchecked and
//     routed as usual.
//   A refusal (401/403/404) of events or load is retried every 10 s and logged
//   when it starts or changes: until it ends routing sees no prefixes (or no
//   reported load) there.
//
// The backend's api key for these reads is `api_key` (an admin key when the
// replicas use --api-keys; empty: no Authorization header).
//
// Thread safety: start/stop/poke from any thread; stop() joins.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "pagoda/core/status.h"
#include "pagoda/router/backend.h"

namespace httplib {
class Client;
}

namespace pagoda::router {

struct MonitorOptions {
  bool follow_kv_events = false;
  std::string api_key;
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds poll_interval{100};
  std::chrono::milliseconds probe_timeout{2000};
  std::chrono::milliseconds report_timeout{5000};
  std::chrono::milliseconds arrival_allowance{200};  // Backend::settle_prefills
  std::string tokenizer_fingerprint;
  bool strict_tokenizer = false;
  std::function<void(const std::string&)> log;  // one line, no newline
};

class BackendMonitor {
 public:
  BackendMonitor(Backend& backend, MonitorOptions options);
  ~BackendMonitor();

  // One health probe now, on the calling thread (the router's start-up check):
  // ok and the backend in rotation, or the reason it is not.
  Status probe_now();
  void start();
  void stop();
  // Probe health at once (a request saw the backend fail).
  void poke();

 private:
  void run();
  // Returns the failure, ok if 200. `refused`: the connection could not be made.
  Status probe(bool* refused);
  void record_probe(const Status& result, bool refused);
  // The tokenizer check (above); false: keep the backend out of rotation.
  bool check_tokenizer();
  void poll_reports();
  bool poll_events();  // false: stop polling this round
  void poll_load();

  Backend& backend_;
  const MonitorOptions options_;
  std::unique_ptr<httplib::Client> client_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool poked_ = false;
  std::thread thread_;
  int failed_probes_ = 0;
  std::chrono::steady_clock::time_point events_muted_until_{};
  std::chrono::steady_clock::time_point load_muted_until_{};
  int events_refusal_logged_ = 0;  // status last logged; logged again only when it changes
  int load_refusal_logged_ = 0;
  std::string tokenizer_logged_;  // the last check's verdict, logged when it changes
};

}  // namespace pagoda::router
