#include "pagoda/router/router_server.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <strings.h>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/router/proxy_exchange.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/peer_connection.h"

namespace pagoda::router {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr auto kPollInterval = 50ms;

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

bool in_list(std::string_view name, std::initializer_list<std::string_view> list) {
  for (std::string_view n : list)
    if (equals_ignoring_case(name, n)) return true;
  return false;
}

// Headers that describe one hop, not the message (RFC 9110 7.6.1), plus
// httplib's own pseudo headers and what the client library sets itself.
bool skip_request_header(std::string_view name) {
  return in_list(name, {"Host", "Connection", "Keep-Alive", "Transfer-Encoding", "TE", "Trailer", "Upgrade",
                        "Proxy-Connection", "Proxy-Authorization", "Content-Length", "Accept-Encoding",
                        "REMOTE_ADDR", "REMOTE_PORT", "LOCAL_ADDR", "LOCAL_PORT"});
}

bool skip_response_header(std::string_view name) {
  return in_list(name, {"Connection", "Keep-Alive", "Transfer-Encoding", "Trailer", "Upgrade", "Proxy-Connection",
                        "Content-Length", "Content-Type"});
}

void send_error(httplib::Response& res, int status, std::string type, std::string code, std::string message) {
  server::ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  res.status = status;
  res.set_content(e.body(), "application/json");
}

httplib::Request backend_request(const httplib::Request& req) {
  httplib::Request out;
  out.method = req.method;
  out.path = req.target.empty() ? req.path : req.target;
  out.body = req.body;
  std::string forwarded_for;
  for (const auto& [name, value] : req.headers) {
    if (skip_request_header(name)) continue;
    if (equals_ignoring_case(name, "X-Forwarded-For")) {
      forwarded_for = value;
      continue;
    }
    out.headers.emplace(name, value);
  }
  if (!req.remote_addr.empty())
    forwarded_for = forwarded_for.empty() ? req.remote_addr : forwarded_for + ", " + req.remote_addr;
  if (!forwarded_for.empty()) out.headers.emplace("X-Forwarded-For", forwarded_for);
  return out;
}

// A request's share of its backend's in-flight count and pending prefill:
// the prefill part is given back at the first body bytes (end_prefill), the
// rest when the last holder lets go.
class InFlightHold {
 public:
  InFlightHold(Backend& b, int64_t prefill_tokens) : backend_(b), prefill_tokens_(prefill_tokens) {
    ++backend_.in_flight;
    backend_.pending_prefill_tokens += prefill_tokens_;
  }
  ~InFlightHold() {
    end_prefill();
    --backend_.in_flight;
  }
  InFlightHold(const InFlightHold&) = delete;
  InFlightHold& operator=(const InFlightHold&) = delete;
  void end_prefill() {
    if (!prefill_done_.exchange(true)) backend_.pending_prefill_tokens -= prefill_tokens_;
  }

 private:
  Backend& backend_;
  const int64_t prefill_tokens_;
  std::atomic<bool> prefill_done_{false};
};

}  // namespace

struct RouterServer::PromptKeys {
  bool known = false;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> tokens;
  uint64_t seed = 0;
  std::map<int32_t, std::vector<uint64_t>> chains;  // by block size
};

StatusOr<std::unique_ptr<RouterServer>> RouterServer::create(RouterConfig config) {
  if (config.backends.empty()) return invalid_argument_error("--backend: give at least one backend URL");
  if (!(config.load_weight > 0.0) || !std::isfinite(config.load_weight))
    return invalid_argument_error("--load-weight {}: must be a positive number of tokens", config.load_weight);
  for (const auto& [name, value] : {std::pair<const char*, std::chrono::milliseconds>{"--health-interval",
                                                                                     config.health_interval},
                                    {"--poll-interval", config.poll_interval},
                                    {"--connect-timeout", config.connect_timeout},
                                    {"--backend-timeout", config.backend_timeout}})
    if (value.count() <= 0) return invalid_argument_error("{}: must be positive", name);
  if (config.max_connections_per_backend < 1)
    return invalid_argument_error("--max-connections {}: must be >= 1", config.max_connections_per_backend);
  if (config.port < 0 || config.port > 65535) return invalid_argument_error("--port {}: must be in [0, 65535]", config.port);

  std::unique_ptr<RouterServer> router(new RouterServer(std::move(config)));
  const RouterConfig& c = router->config_;
  std::set<std::string> seen;
  BackendOptions options;
  options.max_connections = c.max_connections_per_backend;
  options.connect_timeout = c.connect_timeout;
  for (const std::string& text : c.backends) {
    PAGODA_ASSIGN_OR_RETURN(BackendUrl url, parse_backend_url(text));
    if (!seen.insert(url.text).second) return invalid_argument_error("--backend {}: given twice", url.text);
    router->backends_.push_back(std::make_unique<Backend>(std::move(url), options));
  }
  MonitorOptions monitor;
  monitor.follow_kv_events = c.policy == RoutingPolicy::kKvAware;
  monitor.api_key = c.backend_api_key;
  monitor.health_interval = c.health_interval;
  monitor.poll_interval = c.poll_interval;
  monitor.probe_timeout = std::max(c.connect_timeout, std::chrono::milliseconds(1000));
  monitor.log = c.log;
  for (auto& b : router->backends_) router->monitors_.push_back(std::make_unique<BackendMonitor>(*b, monitor));

  if (c.model_dir.empty()) {
    router->hasher_ = PromptHasher::token_ids_only();
  } else {
    auto hasher = PromptHasher::load(c.model_dir);
    if (!hasher.ok()) return hasher.status();
    router->hasher_ = std::move(*hasher);
  }
  router->install_routes();
  return router;
}

RouterServer::RouterServer(RouterConfig config)
    : config_(std::move(config)), http_(std::make_unique<httplib::Server>()) {}

RouterServer::~RouterServer() {
  stop();
  for (auto& m : monitors_) m->stop();
}

void RouterServer::log(const std::string& line) const {
  if (config_.log) config_.log(line);
}

std::vector<std::string> RouterServer::check_backends() {
  std::vector<std::string> warnings;
  for (size_t i = 0; i < backends_.size(); ++i) {
    Status s = monitors_[i]->probe_now();
    if (!s.ok())
      warnings.push_back(fmt::format("backend {} is not healthy now ({}); it joins the rotation once /health answers "
                                     "200",
                                     backends_[i]->name(), s.message()));
  }
  return warnings;
}

void RouterServer::start_monitors() {
  for (auto& m : monitors_) m->start();
}

void RouterServer::install_routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(config_.max_body_bytes);
  s.set_read_timeout(30, 0);
  const int threads = config_.http_threads > 0
                          ? config_.http_threads
                          : static_cast<int>(backends_.size()) * config_.max_connections_per_backend + 16;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(std::max(4, threads)); };
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, 500, "server_error", "internal_error", "internal error in the router");
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A backend's own answer (streamed through a provider) or the 499 of a
    // client that left is not the router's to rewrite.
    if (!res.body.empty() || res.content_provider_ || res.status == 499) return;
    const int status = res.status;
    send_error(res, status, "invalid_request_error", status == 404 ? "not_found" : "http_error",
               status == 404   ? fmt::format("no route for {} {}", req.method, req.path.substr(0, 200))
               : status == 413 ? fmt::format("request body over {} bytes", config_.max_body_bytes)
                               : fmt::format("HTTP error {}", status));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { handle_health(res); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(backends_, routing_policy_name(config_.policy)), "text/plain; version=0.0.4");
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle_proxy(req, res, true); });
  s.Post("/v1/chat/completions",
         [this](const httplib::Request& req, httplib::Response& res) { handle_proxy(req, res, true); });
  s.Post("/v1/cache/drop", [this](const httplib::Request& req, httplib::Response& res) { handle_cache_drop(req, res); });
  const auto other = [this](const httplib::Request& req, httplib::Response& res) { handle_proxy(req, res, false); };
  s.Get(R"(/v1/.*)", other);
  s.Post(R"(/v1/.*)", other);
  s.Put(R"(/v1/.*)", other);
  s.Delete(R"(/v1/.*)", other);
}

void RouterServer::handle_health(httplib::Response& res) {
  int healthy = 0;
  for (const auto& b : backends_) healthy += b->healthy() ? 1 : 0;
  const char* status = draining_ ? "draining" : healthy > 0 ? "ok" : "no healthy backend";
  res.status = !draining_ && healthy > 0 ? 200 : 503;
  res.set_content(json{{"status", status},
                       {"backends", backends_.size()},
                       {"healthy_backends", healthy},
                       {"policy", routing_policy_name(config_.policy)}}
                      .dump(),
                  "application/json");
}

void RouterServer::hash_prompt(const httplib::Request& req, PromptKeys& keys) {
  const server::Endpoint endpoint =
      req.path == "/v1/chat/completions" ? server::Endpoint::kChatCompletions : server::Endpoint::kCompletions;
  auto tokens = hasher_->prompt_tokens(req.body, endpoint);
  if (!tokens.ok() || tokens->empty()) return;
  // Any healthy backend can say which namespace this key maps to: they share the key file.
  Backend* asked = nullptr;
  const size_t n = backends_.size();
  const uint64_t start = rotation_.load();
  for (size_t k = 0; k < n && asked == nullptr; ++k)
    if (backends_[(start + k) % n]->healthy()) asked = backends_[(start + k) % n].get();
  if (asked == nullptr) return;
  const auto seed = seeds_.seed_for(req.get_header_value("Authorization"), *asked);
  if (!seed) return;
  keys.known = true;
  keys.seed = *seed;
  keys.prompt_tokens = static_cast<int64_t>(tokens->size());
  keys.tokens = std::move(*tokens);
  for (const auto& b : backends_) {
    const int32_t bs = b->index().block_size();
    if (bs > 0 && keys.chains.count(bs) == 0) keys.chains[bs] = PromptHasher::block_keys(keys.seed, keys.tokens, bs);
  }
}

int RouterServer::pick_backend(const PromptKeys& keys, const std::vector<bool>& excluded, int64_t* cached_tokens) {
  std::vector<BackendView> views(backends_.size());
  for (size_t i = 0; i < backends_.size(); ++i) {
    const Backend& b = *backends_[i];
    BackendView& v = views[i];
    v.eligible = b.healthy() && !excluded[i];
    v.in_flight = b.in_flight.load();
    v.pending_prefill_tokens = b.pending_prefill_tokens.load();
    if (const auto load = b.reported_load()) {
      v.reported_busy = load->running + load->waiting;
      v.kv_usage = load->kv_usage;
    }
    if (keys.known) {
      const int32_t bs = b.index().block_size();
      const auto chain = keys.chains.find(bs);
      if (bs > 0 && chain != keys.chains.end())
        v.cached_tokens = static_cast<int64_t>(b.index().match_blocks(chain->second)) * bs;
    }
  }
  const RoutingChoice choice =
      choose_backend(config_.policy, views, keys.prompt_tokens, config_.load_weight, rotation_.fetch_add(1));
  *cached_tokens = choice.index >= 0 ? views[choice.index].cached_tokens : 0;
  return choice.index;
}

void RouterServer::handle_proxy(const httplib::Request& req, httplib::Response& res, bool generate) {
  if (draining_)
    return send_error(res, 503, "server_error", "unavailable", "the router is shutting down; retry on another");
  PromptKeys keys;
  if (generate && config_.policy == RoutingPolicy::kKvAware) {
    hash_prompt(req, keys);
    if (!keys.known) ++metrics_.unhashed_prompts;
  }
  std::vector<bool> excluded(backends_.size(), false);
  std::string last_failure;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int64_t cached_tokens = 0;
    const int index = pick_backend(keys, excluded, &cached_tokens);
    if (index < 0) {
      if (attempt == 0) {
        ++metrics_.no_backend;
        return send_error(res, 503, "server_error", "no_healthy_backend",
                          "no healthy backend: every backend of this router is down or unreachable; retry shortly");
      }
      break;
    }
    if (attempt > 0) ++metrics_.retries;
    Backend& backend = *backends_[index];
    auto lease = backend.pool().acquire(config_.pool_wait);
    if (!lease) {
      last_failure = fmt::format("backend {} kept all {} connections busy", backend.name(),
                                 backend.pool().max_connections());
      excluded[index] = true;
      continue;
    }
    auto hold = std::make_shared<InFlightHold>(backend, keys.known ? keys.prompt_tokens - cached_tokens : 0);
    ++backend.requests;
    if (keys.known) {
      const auto chain = keys.chains.find(backend.index().block_size());
      if (chain != keys.chains.end())
        backend.index().note_routed(chain->second, std::chrono::steady_clock::now() + config_.expect_routed_for);
    }
    auto exchange = std::make_shared<ProxyExchange>(std::move(*lease), backend_request(req), config_.backend_timeout,
                                                    config_.max_buffered_bytes);
    // Non-streamed completions send nothing until they finish: watch the
    // client meanwhile, so one that leaves stops the backend's generation too.
    std::optional<ProxyExchange::Head> head;
    std::optional<server::PeerConnection> peer;
    bool peer_searched = false;
    while (!(head = exchange->wait_head(kPollInterval))) {
      if (!peer_searched) {
        peer_searched = true;
        peer = server::PeerConnection::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
      }
      if (peer && peer->closed()) {
        exchange->cancel();
        ++metrics_.client_disconnects;
        res.status = 499;  // nginx's "client closed request": nobody reads it
        return;
      }
    }
    if (!head->received) {
      ++backend.transport_errors;
      last_failure = fmt::format("backend {} failed before answering ({})", backend.name(),
                                 describe_http_error(head->error));
      if (head->error == httplib::Error::Connection && backend.set_healthy(false)) {
        ++backend.health_transitions;
        log(fmt::format("backend {} is down (a request could not connect)", backend.name()));
      }
      monitors_[index]->poke();
      excluded[index] = true;
      continue;
    }
    ++backend.responses_by_class[std::clamp(head->status / 100, 1, 5)];
    if (attempt == 0 && (head->status == 503 || head->status == 429)) {
      bool another = false;
      for (size_t i = 0; i < backends_.size(); ++i)
        another |= static_cast<int>(i) != index && !excluded[i] && backends_[i]->healthy();
      if (another) {
        exchange->cancel();
        excluded[index] = true;
        last_failure = fmt::format("backend {} answered {}", backend.name(), head->status);
        continue;
      }
    }
    if (keys.known) metrics_.record_prefix_match(cached_tokens, keys.prompt_tokens);

    res.status = head->status;
    std::string content_type = "application/octet-stream";
    for (const auto& [name, value] : head->headers) {
      if (equals_ignoring_case(name, "Content-Type")) content_type = value;
      if (!skip_response_header(name)) res.headers.emplace(name, value);
    }
    auto provider = [this, exchange, hold](size_t, httplib::DataSink& sink) {
      std::string chunk;
      for (;;) {
        switch (exchange->next_chunk(&chunk, kPollInterval)) {
          case ProxyExchange::Next::kData:
            hold->end_prefill();
            if (!sink.write(chunk.data(), chunk.size())) {
              ++metrics_.client_disconnects;
              exchange->cancel();
              return false;
            }
            break;
          case ProxyExchange::Next::kEnd:
            sink.done();
            return true;
          case ProxyExchange::Next::kBroken:
            // The backend failed mid-body: cut the client's response short
            // (no final chunk), so the client sees it incomplete.
            return false;
          case ProxyExchange::Next::kPending:
            if (!sink.is_writable()) {
              ++metrics_.client_disconnects;
              exchange->cancel();
              return false;
            }
            break;
        }
      }
    };
    res.set_chunked_content_provider(content_type, std::move(provider),
                                     [exchange](bool success) {
                                       if (!success) exchange->cancel();
                                     });
    return;
  }
  send_error(res, 502, "server_error", "backend_unavailable",
             last_failure.empty() ? "no backend could take the request"
                                  : last_failure + "; the retry found no other healthy backend or failed too");
}

void RouterServer::handle_cache_drop(const httplib::Request& req, httplib::Response& res) {
  if (draining_)
    return send_error(res, 503, "server_error", "unavailable", "the router is shutting down; retry on another");
  int64_t dropped = 0;
  int answered = 0;
  int healthy = 0;
  std::string last_failure;
  for (auto& b : backends_) {
    if (!b->healthy()) continue;
    ++healthy;
    auto lease = b->pool().acquire(config_.pool_wait);
    if (!lease) {
      last_failure = fmt::format("backend {} kept all its connections busy", b->name());
      continue;
    }
    httplib::Request out = backend_request(req);
    httplib::Client& client = lease->client();
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(config_.backend_timeout).count();
    client.set_read_timeout(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
    httplib::Response answer;
    httplib::Error error = httplib::Error::Success;
    ++b->requests;
    if (!client.send(out, answer, error)) {
      lease->discard();
      ++b->transport_errors;
      last_failure = fmt::format("backend {} failed ({})", b->name(), describe_http_error(error));
      continue;
    }
    ++b->responses_by_class[std::clamp(answer.status / 100, 1, 5)];
    if (answer.status != 200) {  // the backend's verdict (bad key, bad body) is the answer
      res.status = answer.status;
      res.set_content(answer.body, answer.get_header_value("Content-Type"));
      return;
    }
    const json j = json::parse(answer.body, nullptr, false);
    if (j.is_object() && j.contains("dropped_blocks") && j["dropped_blocks"].is_number_integer())
      dropped += j["dropped_blocks"].get<int64_t>();
    ++answered;
  }
  if (healthy == 0) {
    ++metrics_.no_backend;
    return send_error(res, 503, "server_error", "no_healthy_backend",
                      "no healthy backend: every backend of this router is down or unreachable; retry shortly");
  }
  if (answered == 0) return send_error(res, 502, "server_error", "backend_unavailable", last_failure);
  res.status = 200;
  res.set_content(json{{"object", "cache.drop"}, {"dropped_blocks", dropped}, {"backends", answered}}.dump(),
                  "application/json");
}

StatusOr<int> RouterServer::bind() {
  if (config_.port == 0) {
    const int port = http_->bind_to_any_port(config_.host);
    if (port <= 0) return io_error("cannot bind {} on any port", config_.host);
    config_.port = port;
    return port;
  }
  if (!http_->bind_to_port(config_.host, config_.port))
    return io_error("cannot bind {}:{} (in use, or not permitted)", config_.host, config_.port);
  return config_.port;
}

Status RouterServer::serve() {
  const bool ok = http_->listen_after_bind();
  for (auto& m : monitors_) m->stop();
  if (!ok && !draining_) return io_error("the HTTP server stopped unexpectedly");
  return ok_status();
}

void RouterServer::stop() {
  draining_ = true;
  if (http_) http_->stop();
}

}  // namespace pagoda::router
