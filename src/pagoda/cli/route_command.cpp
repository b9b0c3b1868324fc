// `pagoda route`: one OpenAI-compatible address in front of several
// `pagoda serve` replicas (router/router_server.h; design in docs/ROUTER.md).
//
//   pagoda serve --model models/pagoda-tiny --port 8001 &
//   pagoda serve --model models/pagoda-tiny --port 8002 &
//   pagoda route --model models/pagoda-tiny --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 --port 8000
//
// Prints "pagoda route: ... listening on http://HOST:PORT" on stdout once it
// accepts connections; warnings (a backend unreachable at start) and health
// changes go to stderr. SIGTERM or SIGINT: new requests get 503, in-flight
// ones have --shutdown-grace seconds to finish, then the router exits 0.

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/http_front_flags.h"
#include "pagoda/router/router_server.h"

namespace pagoda::cli {
namespace {

volatile std::sig_atomic_t g_route_signal = 0;

struct RouteOptions {
  std::vector<std::string> backends;
  std::string policy = "kv-aware";
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string backend_api_key;
  double load_weight = 32.0;
  double health_interval_s = 1.0;
  double poll_interval_s = 0.1;
  double backend_timeout_s = 600.0;
  int max_connections = 64;
  int http_threads = 4;
  int max_open_requests = 0;
  bool strict_tokenizer = false;
  HttpFrontFlags http;
};

std::chrono::milliseconds seconds_flag(double seconds, const char* flag) {
  if (!(seconds > 0.0) || seconds > 86400.0) fail(fmt::format("{} {}: must be in (0, 86400] seconds", flag, seconds));
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000.0)));
}

void run_route(const RouteOptions& opt) {
  auto policy = router::parse_routing_policy(opt.policy);
  if (!policy.ok()) fail(policy.status().message());
  if (*policy == router::RoutingPolicy::kKvAware && opt.model.empty())
    fail("--policy kv-aware needs --model DIR: the model directory the backends serve (its tokenizer and chat "
         "template turn prompts into the blocks the backends cache); or choose --policy least-loaded");

  static std::mutex log_mutex;
  router::RouterConfig config;
  config.backends = opt.backends;
  config.policy = *policy;
  config.host = opt.host;
  config.port = opt.port;
  config.model_dir = opt.model;
  config.backend_api_key = opt.backend_api_key;
  config.load_weight = opt.load_weight;
  config.health_interval = seconds_flag(opt.health_interval_s, "--health-interval");
  config.poll_interval = seconds_flag(opt.poll_interval_s, "--poll-interval");
  config.backend_timeout = seconds_flag(opt.backend_timeout_s, "--backend-timeout");
  config.max_connections_per_backend = opt.max_connections;
  config.http_threads = opt.http_threads;
  config.max_open_requests = opt.max_open_requests;
  config.strict_tokenizer = opt.strict_tokenizer;
  if (Status s = apply_http_front_flags(opt.http, "--max-client-connections", config.front, &config.shutdown_grace);
      !s.ok())
    fail(s.message());
  config.log = [](const std::string& line) {
    std::lock_guard lock(log_mutex);
    std::fprintf(stderr, "pagoda route: %s\n", line.c_str());
  };

  auto created = router::RouterServer::create(std::move(config));
  if (!created.ok()) fail(created.status().message());
  router::RouterServer& server = **created;

  struct sigaction action {};
  action.sa_handler = [](int sig) { g_route_signal = sig; };
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a peer that leaves mid-write is an error return, not a crash

  for (const std::string& warning : server.check_backends()) std::fprintf(stderr, "pagoda route: warning: %s\n",
                                                                          warning.c_str());
  auto port = server.bind();
  if (!port.ok()) fail(port.status().message());
  server.start_monitors();

  std::atomic<bool> served{false};
  std::thread signal_thread([&] {
    while (!served) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int sig = g_route_signal;
      if (sig == 0) continue;
      std::fprintf(stderr, "pagoda route: signal %d, draining\n", sig);
      server.begin_drain();
      // Stops accepting; replies in progress get --shutdown-grace, then every
      // connection closes and serve() returns.
      server.stop();
      return;
    }
  });

  int healthy = 0;
  for (const auto& b : server.backends()) healthy += b->healthy() ? 1 : 0;
  std::printf("pagoda route: policy %s over %zu backends (%d healthy), listening on http://%s:%d\n",
              std::string(router::routing_policy_name(*policy)).c_str(), server.backends().size(), healthy,
              opt.host.c_str(), *port);
  std::fflush(stdout);
  Status status = server.serve();
  served = true;
  signal_thread.join();
  if (!status.ok()) fail(status.message());
  std::fprintf(stderr, "pagoda route: stopped\n");
}

}  // namespace

void add_route_command(CLI::App& app) {
  auto opt = std::make_shared<RouteOptions>();
  CLI::App* cmd = app.add_subcommand(
      "route",
      "One OpenAI-compatible address in front of several `pagoda serve` replicas.\n"
      "  pagoda serve --model models/pagoda-tiny --port 8001 &\n"
      "  pagoda serve --model models/pagoda-tiny --port 8002 &\n"
      "  pagoda route --model models/pagoda-tiny --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002\n"
      "Clients talk to the router exactly as to one server (same endpoints, api keys passed through, streaming "
      "byte for byte). kv-aware routing (the default) sends each request to the replica that already holds the "
      "longest part of its prompt in its KV cache, unless the prefills queued there and its requests in flight "
      "(priced by --load-weight) cost more than the cached tokens save. It reads the replicas' KV events "
      "(GET /v1/kv/events): with --api-keys on the replicas, give it an admin key (--backend-api-key). A replica "
      "that is down leaves the rotation within seconds and rejoins when healthy; a request whose replica fails "
      "before answering is retried once on another. Prints 'listening on http://HOST:PORT' on stdout once it "
      "accepts connections. docs/ROUTER.md explains the design.");
  cmd->add_option("--backend", opt->backends,
                  "A replica's address, http://HOST:PORT (repeat the flag, or separate with commas)")
      ->required()
      ->delimiter(',');
  cmd->add_option("--policy", opt->policy,
                  "kv-aware (prefix cache, then load), least-loaded (requests in flight + reported load), or "
                  "round-robin")
      ->capture_default_str();
  cmd->add_option("--model", opt->model,
                  "The model directory the replicas serve: its tokenizer and chat template let the router hash "
                  "prompts as the replicas do (required by kv-aware)");
  cmd->add_option("--host", opt->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", opt->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--backend-api-key", opt->backend_api_key,
                  "Key the router reads the replicas' KV events and load with (an \"admin\": true key of their "
                  "--api-keys file); also from $PAGODA_BACKEND_API_KEY")
      ->envname("PAGODA_BACKEND_API_KEY");
  cmd->add_option("--load-weight", opt->load_weight,
                  "kv-aware: what one more request in flight on a replica costs, in prompt tokens to compute; "
                  "higher spreads load, lower follows the cache")
      ->capture_default_str();
  cmd->add_option("--health-interval", opt->health_interval_s, "Seconds between /health probes of each replica")
      ->capture_default_str();
  cmd->add_option("--poll-interval", opt->poll_interval_s, "Seconds between reads of each replica's KV events / load")
      ->capture_default_str();
  cmd->add_option("--backend-timeout", opt->backend_timeout_s,
                  "Longest wait, in seconds, for the next bytes from a replica (a non-streamed completion sends "
                  "nothing until it is done)")
      ->capture_default_str();
  cmd->add_option("--max-connections", opt->max_connections,
                  "Connections the router keeps to each replica at most (requests past it wait)")
      ->capture_default_str();
  cmd->add_option("--http-threads", opt->http_threads,
                  "Threads that parse and hash prompts (the exchanges with replicas run on threads of their own)")
      ->capture_default_str();
  cmd->add_option("--max-open-requests", opt->max_open_requests,
                  "Requests open at once, past which new ones get 429 with Retry-After at once (default: 2 x "
                  "replicas x max-connections)");
  cmd->add_flag("--strict-tokenizer", opt->strict_tokenizer,
                "Keep a replica whose tokenizer fingerprint (GET /v1/models) differs from --model's out of "
                "rotation; without it such a replica gets a warning and is routed by load only");
  add_http_front_flags(*cmd, opt->http, "--max-client-connections");
  cmd->callback([opt] { run_route(*opt); });
}

}  // namespace pagoda::cli
