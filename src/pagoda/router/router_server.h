#pragma once
// RouterServer: `pagoda route`, an OpenAI-compatible HTTP front over several
// `pagoda serve` replicas (the backends).
//
// Routes:
//   POST /v1/completions, /v1/chat/completions   to one backend, by the policy
//                                                (routing_policy.h)
//   GET  /v1/models and any other /v1/... path   to one backend, least loaded
//   POST /v1/cache/drop                          to every healthy backend (a
//                                                conversation may be cached on any);
//                                                the answer sums "dropped_blocks"
//   GET  /health                                 the router's own: 200 while at least
//                                                one backend is healthy, else 503
//   GET  /metrics                                the router's own (router_metrics.h)
//
// Pass-through: the request's method, target, body and headers go to the
// backend as they came (less hop-by-hop headers and Accept-Encoding, plus
// X-Forwarded-For); the backend's status, headers and body bytes come back as
// they are, streamed as they arrive (SSE included), so api keys, tenants and
// every error stay the backends' business.
//
// Failures: a backend that fails before its first response byte (refused,
// reset, timed out) or answers 429/503 is tried once more on another healthy
// backend; a backend that cannot even be connected to leaves rotation at once.
// A failure after the first byte cuts the client's response (the router never
// invents bytes). No healthy backend: 503 with the OpenAI error object, code
// "no_healthy_backend"; a failed retry: 502, code "backend_unavailable".
//
// kv-aware routing: the router renders and tokenizes the prompt as the
// backends do (prompt_hasher.h, from --model), learns the caller's namespace
// seed from a backend (namespace_seeds.h), hashes the prompt's blocks and
// looks them up in each backend's PrefixIndex, fed by a BackendMonitor per
// backend. docs/ROUTER.md has the whole design.
//
// The client side is the hardened HTTP front of `pagoda serve`
// (server/http_front.h: listen backlog, header and body deadlines, body cap,
// connection cap, 429 when the handler queue is full). Handlers run on its
// workers only to parse and hash the prompt and pick a backend; the exchange
// with the backend runs on a thread of its own (proxy_exchange.h) and feeds
// the client's connection as bytes arrive, so a long generation holds no
// worker. Requests open at once are capped (max_open_requests; past it 429
// with Retry-After at once), which bounds those threads too. A client that
// leaves is noticed by the front and cancels its backend exchange.
//
// Thread safety: handlers run on the front's workers and event loop; stop()
// and begin_drain() may be called from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/router/backend.h"
#include "pagoda/router/backend_monitor.h"
#include "pagoda/router/namespace_seeds.h"
#include "pagoda/router/prompt_hasher.h"
#include "pagoda/router/router_metrics.h"
#include "pagoda/router/routing_policy.h"
#include "pagoda/server/http_front.h"

namespace pagoda::router {

struct RouterConfig {
  std::vector<std::string> backends;  // URLs (backend_url.h), at least one, no duplicates
  RoutingPolicy policy = RoutingPolicy::kKvAware;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  // Tokenizer and chat template for kv-aware routing of text and chat prompts
  // (the backends' model directory); empty: token-id prompts only.
  std::string model_dir;
  // Bearer key for the backends' /v1/kv/events and /v1/load (an admin key
  // when they use --api-keys); empty: no header.
  std::string backend_api_key;
  double load_weight = 32.0;  // kv-aware: tokens one request in flight costs (routing_policy.h)
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds poll_interval{100};
  // kv-aware: how long a prompt just routed counts as cached at its backend
  // before the backend's events confirm it (prefix_index.h).
  std::chrono::milliseconds expect_routed_for{3000};
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds backend_timeout{600000};  // longest wait for backend bytes
  std::chrono::milliseconds pool_wait{30000};         // longest wait for a free pooled connection
  int max_connections_per_backend = 64;
  int http_threads = 4;  // the front's handler workers (prompt parsing and hashing)
  // Requests open at once (waiting for a pooled connection or exchanging);
  // past it 429 at once. 0: 2 x backends x max_connections_per_backend.
  int max_open_requests = 0;
  // The client side: deadlines, connection cap, listen backlog, body cap
  // (front.limits.max_body_bytes is set from max_body_bytes). Its host,
  // port and worker_threads come from the fields above.
  server::HttpFrontConfig front;
  std::chrono::milliseconds shutdown_grace{10000};  // stop(): replies in progress may finish within it
  // The tokenizer check (backend_monitor.h): with --model, a backend whose
  // tokenizer fingerprint differs is routed by load only, or with
  // strict_tokenizer kept out of rotation.
  bool strict_tokenizer = false;
  size_t max_body_bytes = 8u << 20;
  size_t max_buffered_bytes = 1u << 20;  // per exchange, backend -> client
  std::function<void(const std::string&)> log;  // one line, no newline; may be empty
};

class RouterServer {
 public:
  // Validates the configuration (kInvalidArgument naming the flag) and loads
  // the tokenizer; contacts no backend.
  static StatusOr<std::unique_ptr<RouterServer>> create(RouterConfig config);
  ~RouterServer();

  // Probes every backend once; returns a warning line for each that is not
  // healthy now (it joins the rotation once a probe succeeds).
  std::vector<std::string> check_backends();
  // The router's tokenizer fingerprint (server/tokenizer_fingerprint.h) of
  // --model; "" without one (no check).
  const std::string& tokenizer_fingerprint() const { return tokenizer_fingerprint_; }
  // Starts the monitors (health, KV events, load).
  void start_monitors();
  StatusOr<int> bind();
  // Serves until stop() has closed every connection.
  Status serve();
  // New requests get 503; in-flight ones continue.
  void begin_drain() { draining_ = true; }
  // Stops accepting; replies in progress get shutdown_grace, then every
  // connection closes and serve() returns.
  void stop();
  // Requests open now (waiting for a backend connection or exchanging).
  int64_t open_requests() const { return open_requests_.load(); }

  const std::vector<std::unique_ptr<Backend>>& backends() const { return backends_; }

 private:
  explicit RouterServer(RouterConfig config);
  struct PromptKeys;
  class ProxyReply;
  void install_routes();
  server::HttpReply handle_proxy(server::HttpRequest& req, bool generate);
  server::HttpReply handle_cache_drop(server::HttpRequest& req);
  server::HttpReply handle_health();
  // The prompt's block keys per block size in use (kv-aware generate requests).
  void hash_prompt(const server::HttpRequest& req, PromptKeys& keys);
  int pick_backend(const PromptKeys& keys, const std::vector<bool>& excluded, int64_t* cached_tokens);
  void log(const std::string& line) const;

  RouterConfig config_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<BackendMonitor>> monitors_;
  std::unique_ptr<PromptHasher> hasher_;
  NamespaceSeeds seeds_;
  RouterMetrics metrics_;
  std::string tokenizer_fingerprint_;
  std::unique_ptr<server::HttpFront> front_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> open_requests_{0};
  std::atomic<uint64_t> rotation_{0};
};

}  // namespace pagoda::router
