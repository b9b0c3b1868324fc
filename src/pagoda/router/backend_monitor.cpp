#include "pagoda/router/backend_monitor.h"

#include <utility>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

namespace pagoda::router {

namespace {

constexpr auto kMuteAfterRefusal = std::chrono::seconds(10);
constexpr int kMaxPagesPerRound = 32;

void set_timeouts(httplib::Client& c, std::chrono::milliseconds timeout) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  const time_t sec = static_cast<time_t>(us / 1000000), usec = static_cast<time_t>(us % 1000000);
  c.set_connection_timeout(sec, usec);
  c.set_read_timeout(sec, usec);
  c.set_write_timeout(sec, usec);
}

std::string first_line(const std::string& body) {
  std::string s = body.substr(0, std::min<size_t>(body.size(), 200));
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

}  // namespace

BackendMonitor::BackendMonitor(Backend& backend, MonitorOptions options)
    : backend_(backend), options_(std::move(options)),
      client_(std::make_unique<httplib::Client>(backend.url().host, backend.url().port)) {
  client_->set_keep_alive(true);
}

BackendMonitor::~BackendMonitor() { stop(); }

void BackendMonitor::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void BackendMonitor::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackendMonitor::poke() {
  {
    std::lock_guard lock(mutex_);
    poked_ = true;
  }
  wake_.notify_all();
}

Status BackendMonitor::probe(bool* refused) {
  *refused = false;
  set_timeouts(*client_, options_.probe_timeout);
  auto res = client_->Get("/health");
  if (!res) {
    *refused = res.error() == httplib::Error::Connection;
    return io_error("GET /health: {}", describe_http_error(res.error()));
  }
  if (res->status != 200) return io_error("GET /health answered {}: {}", res->status, first_line(res->body));
  return ok_status();
}

bool BackendMonitor::check_tokenizer() {
  if (options_.tokenizer_fingerprint.empty()) return true;
  set_timeouts(*client_, options_.report_timeout);
  httplib::Headers headers;
  if (!options_.api_key.empty()) headers.emplace("Authorization", "Bearer " + options_.api_key);
  auto res = client_->Get("/v1/models", headers);
  std::string advertised;
  std::string why_unknown;
  if (!res) {
    why_unknown = fmt::format("GET /v1/models: {}", describe_http_error(res.error()));
  } else if (res->status != 200) {
    why_unknown = fmt::format("GET /v1/models answered {}", res->status);
  } else {
    const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
    if (j.is_object() && j.contains("data") && j["data"].is_array())
      for (const auto& model : j["data"])
        if (model.is_object() && model.contains("tokenizer_fingerprint") && model["tokenizer_fingerprint"].is_string())
          advertised = model["tokenizer_fingerprint"].get<std::string>();
    if (advertised.empty()) why_unknown = "it advertises no tokenizer_fingerprint in /v1/models";
  }
  std::string verdict;
  bool join = true;
  if (!why_unknown.empty()) {
    backend_.set_tokenizer_check(Backend::TokenizerCheck::kUnknown);
    verdict = fmt::format("warning: backend {}: tokenizer not checked ({}); routed as if it matched",
                          backend_.name(), why_unknown);
  } else if (advertised == options_.tokenizer_fingerprint) {
    backend_.set_tokenizer_check(Backend::TokenizerCheck::kMatch);
  } else {
    backend_.set_tokenizer_check(Backend::TokenizerCheck::kMismatch);
    join = !options_.strict_tokenizer;
    verdict = fmt::format(
        "warning: backend {} tokenizes differently from --model (tokenizer fingerprint {}, the router's {}): {}",
        backend_.name(), advertised.substr(0, 16), options_.tokenizer_fingerprint.substr(0, 16),
        join ? "it is routed by load only (--strict-tokenizer keeps it out)"
             : "kept out of rotation (--strict-tokenizer) until it serves the same tokenizer");
  }
  if (verdict != tokenizer_logged_ && !verdict.empty() && options_.log) options_.log(verdict);
  tokenizer_logged_ = verdict;
  return join;
}

void BackendMonitor::record_probe(const Status& result, bool refused) {
  if (result.ok()) {
    failed_probes_ = 0;
    if (!backend_.healthy() && !check_tokenizer()) return;
    if (backend_.set_healthy(true)) {
      ++backend_.health_transitions;
      if (options_.log) options_.log(fmt::format("backend {} is up", backend_.name()));
    }
    return;
  }
  ++failed_probes_;
  if (!backend_.healthy() || (!refused && failed_probes_ < 2)) return;
  if (backend_.set_healthy(false)) {
    ++backend_.health_transitions;
    backend_.set_reported_load(std::nullopt);
    if (options_.log) options_.log(fmt::format("backend {} is down ({})", backend_.name(), result.message()));
  }
}

Status BackendMonitor::probe_now() {
  bool refused = false;
  Status s = probe(&refused);
  record_probe(s, /*refused=*/true);  // at start-up any failure leaves it out until a probe succeeds
  if (s.ok() && !backend_.healthy())
    return failed_precondition_error("its tokenizer differs from --model's (--strict-tokenizer)");
  return s;
}

bool BackendMonitor::poll_events() {
  const auto now = std::chrono::steady_clock::now();
  if (now < events_muted_until_) return false;
  set_timeouts(*client_, options_.report_timeout);
  httplib::Headers headers;
  if (!options_.api_key.empty()) headers.emplace("Authorization", "Bearer " + options_.api_key);
  const uint64_t since = backend_.index().next_since();
  const auto asked = std::chrono::steady_clock::now();
  auto res = client_->Get(fmt::format("/v1/kv/events?since={}&max_events=4096", since), headers);
  if (!res) return false;  // health probes decide what that means
  if (res->status != 200) {
    backend_.index().reset();
    events_muted_until_ = now + kMuteAfterRefusal;
    if (std::exchange(events_refusal_logged_, res->status) != res->status && options_.log)
      options_.log(fmt::format("backend {}: GET /v1/kv/events answered {} ({}); kv-aware routing sees no prefixes "
                               "there until it answers (--backend-api-key: an admin key of the replicas)",
                               backend_.name(), res->status, first_line(res->body)));
    return false;
  }
  events_refusal_logged_ = 0;
  auto page = parse_kv_events_page(res->body);
  if (!page.ok()) {
    backend_.index().reset();
    if (options_.log) options_.log(fmt::format("backend {}: {}", backend_.name(), page.status().message()));
    return false;
  }
  if (page->load) {
    backend_.set_reported_load(page->load);
    backend_.settle_prefills(*page->load, asked, options_.arrival_allowance);
  }
  const auto applied = backend_.index().apply(*page);
  return applied == PrefixIndex::ApplyResult::kResync || (applied == PrefixIndex::ApplyResult::kApplied && page->more);
}

void BackendMonitor::poll_load() {
  const auto now = std::chrono::steady_clock::now();
  if (now < load_muted_until_) return;
  set_timeouts(*client_, options_.report_timeout);
  httplib::Headers headers;
  if (!options_.api_key.empty()) headers.emplace("Authorization", "Bearer " + options_.api_key);
  const auto asked = std::chrono::steady_clock::now();
  auto res = client_->Get("/v1/load", headers);
  if (!res) return;
  if (res->status != 200) {
    backend_.set_reported_load(std::nullopt);
    load_muted_until_ = now + kMuteAfterRefusal;
    if (std::exchange(load_refusal_logged_, res->status) != res->status && options_.log)
      options_.log(fmt::format("backend {}: GET /v1/load answered {} ({}); routing uses the router's own request "
                               "counts there",
                               backend_.name(), res->status, first_line(res->body)));
    return;
  }
  load_refusal_logged_ = 0;
  auto load = parse_backend_load(res->body);
  backend_.set_reported_load(load.ok() ? std::optional<BackendLoad>(*load) : std::nullopt);
  if (load.ok()) backend_.settle_prefills(*load, asked, options_.arrival_allowance);
}

void BackendMonitor::poll_reports() {
  bool load_from_events = false;
  if (options_.follow_kv_events) {
    for (int page = 0; page < kMaxPagesPerRound && poll_events(); ++page) {
    }
    load_from_events = std::chrono::steady_clock::now() >= events_muted_until_ && backend_.reported_load().has_value();
  }
  if (!load_from_events) poll_load();
}

void BackendMonitor::run() {
  using Clock = std::chrono::steady_clock;
  auto next_probe = Clock::now();
  for (;;) {
    bool probe_due = false;
    {
      std::unique_lock lock(mutex_);
      const auto wake_at = std::min(next_probe, Clock::now() + options_.poll_interval);
      wake_.wait_until(lock, wake_at, [&] { return stopping_ || poked_; });
      if (stopping_) return;
      probe_due = poked_ || Clock::now() >= next_probe;
      poked_ = false;
    }
    if (probe_due) {
      bool refused = false;
      Status s = probe(&refused);
      record_probe(s, refused);
      next_probe = Clock::now() + options_.health_interval;
    }
    if (backend_.healthy()) poll_reports();
  }
}

}  // namespace pagoda::router
