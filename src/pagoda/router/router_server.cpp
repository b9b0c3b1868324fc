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
#include "pagoda/server/api_keys.h"
#include "pagoda/server/tokenizer_fingerprint.h"

namespace pagoda::router {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

using server::HttpReply;
using server::HttpRequest;
using server::HttpResponse;

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

bool in_list(std::string_view name, std::initializer_list<std::string_view> list) {
  for (std::string_view n : list)
    if (equals_ignoring_case(name, n)) return true;
  return false;
}

// Headers that describe one hop, not the message (RFC 9110 7.6.1), plus what
// the client library sets itself.
bool skip_request_header(std::string_view name) {
  return in_list(name, {"Host", "Connection", "Keep-Alive", "Transfer-Encoding", "TE", "Trailer", "Upgrade",
                        "Proxy-Connection", "Proxy-Authorization", "Content-Length", "Accept-Encoding", "Expect"});
}

// The front writes its own framing and Content-Type (from the reply's content_type).
bool skip_response_header(std::string_view name) {
  return in_list(name, {"Connection", "Keep-Alive", "Transfer-Encoding", "Trailer", "Upgrade", "Proxy-Connection",
                        "Content-Length", "Content-Type"});
}

HttpResponse error_response(int status, std::string type, std::string code, std::string message) {
  server::ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  HttpResponse r;
  r.status = status;
  r.body = e.body();
  return r;
}

HttpReply error_reply(int status, std::string type, std::string code, std::string message) {
  return HttpReply{error_response(status, std::move(type), std::move(code), std::move(message)), nullptr};
}

httplib::Request backend_request(const HttpRequest& req) {
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
  if (!req.remote_address.empty())
    forwarded_for = forwarded_for.empty() ? req.remote_address : forwarded_for + ", " + req.remote_address;
  if (!forwarded_for.empty()) out.headers.emplace("X-Forwarded-For", forwarded_for);
  return out;
}

// A request's share of its backend's in-flight count and pending prefill:
// the prefill ends at the first body bytes (end_prefill), when the backend's
// load report shows it started (Backend::settle_prefills), or with the hold.
class InFlightHold {
 public:
  InFlightHold(Backend& b, int64_t prefill_tokens) : backend_(b), ticket_(b.begin_prefill(prefill_tokens)) {
    ++backend_.in_flight;
  }
  ~InFlightHold() {
    backend_.end_prefill(ticket_);
    --backend_.in_flight;
  }
  InFlightHold(const InFlightHold&) = delete;
  InFlightHold& operator=(const InFlightHold&) = delete;
  void end_prefill() { backend_.end_prefill(ticket_); }

 private:
  Backend& backend_;
  const uint64_t ticket_;
};

// The body of a response the backend broke off: the front closes the client's
// connection without the final chunk, so the client sees it incomplete.
struct BackendBrokeOff : std::runtime_error {
  BackendBrokeOff() : std::runtime_error("the backend broke off its response") {}
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
  if (config.http_threads < 1) return invalid_argument_error("--http-threads {}: must be >= 1", config.http_threads);
  if (config.max_open_requests < 0)
    return invalid_argument_error("--max-open-requests {}: must be >= 0", config.max_open_requests);
  if (config.port < 0 || config.port > 65535) return invalid_argument_error("--port {}: must be in [0, 65535]", config.port);
  if (config.max_open_requests == 0)
    config.max_open_requests = 2 * static_cast<int>(config.backends.size()) * config.max_connections_per_backend;

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
  if (c.model_dir.empty()) {
    router->hasher_ = PromptHasher::token_ids_only();
  } else {
    auto hasher = PromptHasher::load(c.model_dir);
    if (!hasher.ok()) return hasher.status();
    router->hasher_ = std::move(*hasher);
    auto fingerprint = server::tokenizer_fingerprint(c.model_dir);
    if (!fingerprint.ok()) return fingerprint.status();
    router->tokenizer_fingerprint_ = *fingerprint;
  }
  MonitorOptions monitor;
  monitor.follow_kv_events = c.policy == RoutingPolicy::kKvAware;
  monitor.api_key = c.backend_api_key;
  monitor.health_interval = c.health_interval;
  monitor.poll_interval = c.poll_interval;
  monitor.probe_timeout = std::max(c.connect_timeout, std::chrono::milliseconds(1000));
  monitor.arrival_allowance = std::max(2 * c.poll_interval, std::chrono::milliseconds(100));
  monitor.tokenizer_fingerprint = router->tokenizer_fingerprint_;
  monitor.strict_tokenizer = c.strict_tokenizer;
  monitor.log = c.log;
  for (auto& b : router->backends_) router->monitors_.push_back(std::make_unique<BackendMonitor>(*b, monitor));

  server::HttpFrontConfig front = c.front;
  front.host = c.host;
  front.port = c.port;
  front.worker_threads = c.http_threads;
  front.limits.max_body_bytes = c.max_body_bytes;
  router->front_ = std::make_unique<server::HttpFront>(std::move(front));
  router->install_routes();
  return router;
}

RouterServer::RouterServer(RouterConfig config) : config_(std::move(config)) {}

RouterServer::~RouterServer() {
  stop();
  front_.reset();  // closes every connection: their exchanges end before the backends go
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
      warnings.push_back(fmt::format("backend {} is not healthy now ({}); it joins the rotation once /health answers 200{}",
                                     backends_[i]->name(), s.message(),
                                     config_.strict_tokenizer && !tokenizer_fingerprint_.empty()
                                         ? " and its tokenizer matches"
                                         : ""));
  }
  return warnings;
}

void RouterServer::start_monitors() {
  for (auto& m : monitors_) m->start();
}

void RouterServer::install_routes() {
  using server::RouteRuns;
  server::HttpFront& f = *front_;
  f.route("GET", "/health", RouteRuns::kOnLoop, [this](HttpRequest&) { return handle_health(); });
  f.route("GET", "/metrics", RouteRuns::kOnWorker, [this](HttpRequest&) {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_.render(backends_, routing_policy_name(config_.policy), front_->counters());
    return HttpReply{std::move(r), nullptr};
  });
  f.route("POST", "/v1/completions", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_proxy(r, true); });
  f.route("POST", "/v1/chat/completions", RouteRuns::kOnWorker,
          [this](HttpRequest& r) { return handle_proxy(r, true); });
  f.route("POST", "/v1/cache/drop", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_cache_drop(r); });
  for (const char* path : {"/tokenize", "/detokenize"})  // vLLM's, outside /v1/
    f.route("POST", path, RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_proxy(r, false); });
  for (const char* method : {"GET", "POST", "PUT", "DELETE"})
    f.route_prefix(method, "/v1/", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_proxy(r, false); });
}

HttpReply RouterServer::handle_health() {
  int healthy = 0;
  for (const auto& b : backends_) healthy += b->healthy() ? 1 : 0;
  const char* status = draining_ ? "draining" : healthy > 0 ? "ok" : "no healthy backend";
  HttpResponse r;
  r.status = !draining_ && healthy > 0 ? 200 : 503;
  r.body = json{{"status", status},
                {"backends", backends_.size()},
                {"healthy_backends", healthy},
                {"policy", routing_policy_name(config_.policy)}}
               .dump();
  return HttpReply{std::move(r), nullptr};
}

void RouterServer::hash_prompt(const HttpRequest& req, PromptKeys& keys) {
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
  const auto seed =
      seeds_.seed_for(std::string(req.header("Authorization")), std::string(req.header(server::kUserSaltHeader)), *asked);
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
    v.pending_prefill_tokens = b.pending_prefill_tokens();
    if (const auto load = b.reported_load()) {
      v.reported_busy = load->running + load->waiting;
      v.kv_usage = load->kv_usage;
    }
    // A backend that tokenizes differently holds none of our hashes: load only.
    if (keys.known && b.tokenizer_check() != Backend::TokenizerCheck::kMismatch) {
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

// One proxied request, driven by the client's connection: picks a backend,
// runs the exchange, retries once on another backend if the first fails
// before its first response byte (or answers 429/503), then passes the
// response through as it arrives. Every method runs on the connection's
// strand (never two at once); none blocks for long (a retry's exchange starts
// a thread; a replaced one is cancelled first, so joining it is prompt).
class RouterServer::ProxyReply final : public server::ReplySource {
 public:
  ProxyReply(RouterServer& router, PromptKeys keys, httplib::Request request)
      : router_(router), keys_(std::move(keys)), request_(std::move(request)),
        excluded_(router.backends_.size(), false) {}
  ~ProxyReply() override {
    exchange_.reset();
    hold_.reset();
    --router_.open_requests_;
  }

  void start(std::function<void()> wake) override {
    wake_ = std::move(wake);
    launch();
  }

  server::ReplyPiece pull() override {
    server::ReplyPiece piece;
    if (broken_) {
      finished_ = true;  // the close that follows is the backend's doing, not the client's
      throw BackendBrokeOff();
    }
    while (!head_sent_ && !error_) {
      const auto head = exchange_->head();
      if (!head) return piece;  // still waiting: the exchange wakes us
      if (accept_head(*head)) {
        head_sent_ = true;
        piece.has_head = true;
        piece.streamed = true;
        piece.head.status = head->status;
        piece.head.content_type = "application/octet-stream";
        for (const auto& [name, value] : head->headers) {
          if (equals_ignoring_case(name, "Content-Type")) piece.head.content_type = value;
          if (!skip_response_header(name)) piece.head.headers.emplace_back(name, value);
        }
      }
    }
    if (error_) {
      piece.has_head = true;
      piece.head = std::move(*error_);
      piece.done = true;
      error_.reset();
      finished_ = true;
      return piece;
    }
    std::string data;
    switch (exchange_->next_chunk(&data)) {
      case ProxyExchange::Next::kData:
        hold_->end_prefill();
        piece.data = std::move(data);
        break;
      case ProxyExchange::Next::kEnd:
        piece.done = true;
        finished_ = true;
        break;
      case ProxyExchange::Next::kBroken:
        // Never invent bytes: the head (if it goes out now) and what came are
        // all the client gets, and the connection closes.
        if (!piece.has_head) {
          finished_ = true;
          throw BackendBrokeOff();
        }
        broken_ = true;
        break;
      case ProxyExchange::Next::kPending:
        break;
    }
    return piece;
  }

  void cancel() override {
    if (exchange_) exchange_->cancel();
    if (!finished_) ++router_.metrics_.client_disconnects;
    finished_ = true;
  }

 private:
  // Picks a backend for this attempt and starts the exchange; sets error_
  // when there is none.
  void launch() {
    int64_t cached_tokens = 0;
    const int index = router_.pick_backend(keys_, excluded_, &cached_tokens);
    if (index < 0) {
      if (attempt_ == 0) {
        ++router_.metrics_.no_backend;
        error_ = error_response(503, "server_error", "no_healthy_backend",
                                "no healthy backend: every backend of this router is down or unreachable; retry "
                                "shortly");
      } else {
        fail_after_retry();
      }
      return;
    }
    if (attempt_ > 0) ++router_.metrics_.retries;
    index_ = index;
    cached_tokens_ = cached_tokens;
    Backend& backend = *router_.backends_[index];
    exchange_.reset();
    hold_ = std::make_unique<InFlightHold>(backend, keys_.known ? keys_.prompt_tokens - cached_tokens : 0);
    ++backend.requests;
    if (keys_.known) {
      const auto chain = keys_.chains.find(backend.index().block_size());
      if (chain != keys_.chains.end())
        backend.index().note_routed(chain->second,
                                    std::chrono::steady_clock::now() + router_.config_.expect_routed_for);
    }
    const RouterConfig& c = router_.config_;
    exchange_ = std::make_unique<ProxyExchange>(backend.pool(), c.pool_wait, request_, c.backend_timeout,
                                                c.max_buffered_bytes, wake_);
  }

  // The attempt's head: true to pass it on; false when another attempt was
  // started or error_ set.
  bool accept_head(const ProxyExchange::Head& head) {
    Backend& backend = *router_.backends_[index_];
    if (!head.received) {
      if (head.pool_exhausted) {
        last_failure_ = fmt::format("backend {} kept all {} connections busy", backend.name(),
                                    backend.pool().max_connections());
      } else {
        ++backend.transport_errors;
        last_failure_ = fmt::format("backend {} failed before answering ({})", backend.name(),
                                    describe_http_error(head.error));
        if (head.error == httplib::Error::Connection && backend.set_healthy(false)) {
          ++backend.health_transitions;
          router_.log(fmt::format("backend {} is down (a request could not connect)", backend.name()));
        }
        router_.monitors_[index_]->poke();
      }
      return retry();
    }
    ++backend.responses_by_class[std::clamp(head.status / 100, 1, 5)];
    if (attempt_ == 0 && (head.status == 503 || head.status == 429)) {
      bool another = false;
      for (size_t i = 0; i < router_.backends_.size(); ++i)
        another |= static_cast<int>(i) != index_ && !excluded_[i] && router_.backends_[i]->healthy();
      if (another) {
        exchange_->cancel();
        last_failure_ = fmt::format("backend {} answered {}", backend.name(), head.status);
        return retry();
      }
    }
    if (keys_.known) router_.metrics_.record_prefix_match(cached_tokens_, keys_.prompt_tokens);
    return true;
  }

  bool retry() {
    excluded_[index_] = true;
    hold_.reset();
    if (++attempt_ >= 2) {
      fail_after_retry();
      return false;
    }
    launch();
    return false;
  }

  void fail_after_retry() {
    error_ = error_response(502, "server_error", "backend_unavailable",
                            last_failure_.empty()
                                ? "no backend could take the request"
                                : last_failure_ + "; the retry found no other healthy backend or failed too");
  }

  RouterServer& router_;
  const PromptKeys keys_;
  const httplib::Request request_;  // copied for each attempt
  std::vector<bool> excluded_;
  std::function<void()> wake_;
  int attempt_ = 0;
  int index_ = -1;
  int64_t cached_tokens_ = 0;
  std::unique_ptr<InFlightHold> hold_;
  std::unique_ptr<ProxyExchange> exchange_;
  std::optional<HttpResponse> error_;
  std::string last_failure_;
  bool head_sent_ = false;
  bool broken_ = false;
  bool finished_ = false;
};

HttpReply RouterServer::handle_proxy(HttpRequest& req, bool generate) {
  if (draining_)
    return error_reply(503, "server_error", "unavailable", "the router is shutting down; retry on another");
  if (open_requests_.fetch_add(1) >= config_.max_open_requests) {
    --open_requests_;
    ++metrics_.busy_refusals;
    HttpReply busy = error_reply(429, "server_error", "router_busy",
                                 fmt::format("the router has {} requests open, its limit; retry shortly",
                                             config_.max_open_requests));
    busy.response.headers.emplace_back("Retry-After", std::to_string(std::max(1, config_.front.retry_after_seconds)));
    return busy;
  }
  PromptKeys keys;
  if (generate && config_.policy == RoutingPolicy::kKvAware) {
    hash_prompt(req, keys);
    if (!keys.known) ++metrics_.unhashed_prompts;
  }
  // From here the reply owns the open-request count.
  return HttpReply::deferred(std::make_shared<ProxyReply>(*this, std::move(keys), backend_request(req)));
}

HttpReply RouterServer::handle_cache_drop(HttpRequest& req) {
  if (draining_)
    return error_reply(503, "server_error", "unavailable", "the router is shutting down; retry on another");
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
      HttpResponse r;
      r.status = answer.status;
      r.content_type = answer.get_header_value("Content-Type");
      r.body = answer.body;
      return HttpReply{std::move(r), nullptr};
    }
    const json j = json::parse(answer.body, nullptr, false);
    if (j.is_object() && j.contains("dropped_blocks") && j["dropped_blocks"].is_number_integer())
      dropped += j["dropped_blocks"].get<int64_t>();
    ++answered;
  }
  if (healthy == 0) {
    ++metrics_.no_backend;
    return error_reply(503, "server_error", "no_healthy_backend",
                       "no healthy backend: every backend of this router is down or unreachable; retry shortly");
  }
  if (answered == 0) return error_reply(502, "server_error", "backend_unavailable", last_failure);
  HttpResponse r;
  r.body = json{{"object", "cache.drop"}, {"dropped_blocks", dropped}, {"backends", answered}}.dump();
  return HttpReply{std::move(r), nullptr};
}

StatusOr<int> RouterServer::bind() {
  PAGODA_ASSIGN_OR_RETURN(const int port, front_->bind());
  config_.port = port;
  return port;
}

Status RouterServer::serve() {
  Status s = front_->serve();
  for (auto& m : monitors_) m->stop();
  return s;
}

void RouterServer::stop() {
  draining_ = true;
  if (front_) front_->stop(config_.shutdown_grace);
}

}  // namespace pagoda::router
