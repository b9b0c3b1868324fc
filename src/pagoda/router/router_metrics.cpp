#include "pagoda/router/router_metrics.h"

#include <fmt/format.h>

namespace pagoda::router {

namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// Label values are backend URLs (host, port); escape what Prometheus requires.
std::string label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

template <typename F>
void per_backend(std::string& out, std::span<const std::unique_ptr<Backend>> backends, const char* name,
                 const char* type, const char* help, F value) {
  header(out, name, type, help);
  for (const auto& b : backends) out += fmt::format("{}{{backend=\"{}\"}} {}\n", name, label(b->name()), value(*b));
}

}  // namespace

void RouterMetrics::record_prefix_match(int64_t cached_tokens, int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  size_t bucket = 0;
  while (bucket < kPrefixBuckets.size() && cached_tokens > kPrefixBuckets[bucket]) ++bucket;
  ++prefix_counts_[bucket];
  prefix_sum_ += cached_tokens;
  ++prefix_count_;
  prompt_tokens_ += prompt_tokens;
}

std::string RouterMetrics::render(std::span<const std::unique_ptr<Backend>> backends, std::string_view policy,
                                  const server::HttpFrontCounters& front) const {
  std::string out;
  header(out, "pagoda_router_info", "gauge", "The router's routing policy.");
  out += fmt::format("pagoda_router_info{{policy=\"{}\"}} 1\n", policy);
  per_backend(out, backends, "pagoda_router_backend_healthy", "gauge", "1 while the backend is in rotation.",
              [](const Backend& b) { return b.healthy() ? 1 : 0; });
  per_backend(out, backends, "pagoda_router_backend_requests_total", "counter",
              "Requests sent to the backend (retries included).", [](const Backend& b) { return b.requests.load(); });
  header(out, "pagoda_router_backend_responses_total", "counter", "Backend responses by status class.");
  for (const auto& b : backends)
    for (int c = 1; c <= 5; ++c)
      out += fmt::format("pagoda_router_backend_responses_total{{backend=\"{}\",code=\"{}xx\"}} {}\n",
                         label(b->name()), c, b->responses_by_class[c].load());
  per_backend(out, backends, "pagoda_router_backend_transport_errors_total", "counter",
              "Exchanges that got no response (refused, reset, timed out).",
              [](const Backend& b) { return b.transport_errors.load(); });
  per_backend(out, backends, "pagoda_router_backend_in_flight", "gauge", "Requests open at the backend.",
              [](const Backend& b) { return b.in_flight.load(); });
  per_backend(out, backends, "pagoda_router_backend_pending_prefill_tokens", "gauge",
              "Uncached prompt tokens of requests sent there whose prefill has not started (no first "
              "byte yet, and the backend's load report does not show them started).",
              [](const Backend& b) { return b.pending_prefill_tokens(); });
  per_backend(out, backends, "pagoda_router_backend_prefills_settled_by_load_total", "counter",
              "Requests counted as started from the backend's load report before their first byte "
              "(non-streamed ones).",
              [](const Backend& b) { return b.prefills_settled_by_load(); });
  per_backend(out, backends, "pagoda_router_backend_tokenizer_match", "gauge",
              "1: the backend's tokenizer fingerprint is the router's; 0: it differs (routed by load "
              "only); -1: not known.",
              [](const Backend& b) {
                switch (b.tokenizer_check()) {
                  case Backend::TokenizerCheck::kMatch: return 1;
                  case Backend::TokenizerCheck::kMismatch: return 0;
                  default: return -1;
                }
              });
  per_backend(out, backends, "pagoda_router_backend_connections_lent", "gauge", "Pooled connections in use.",
              [](Backend& b) { return b.pool().lent(); });
  per_backend(out, backends, "pagoda_router_backend_index_blocks", "gauge",
              "Cached blocks the router knows of at the backend.",
              [](const Backend& b) { return b.index().num_blocks(); });
  per_backend(out, backends, "pagoda_router_backend_index_synced", "gauge",
              "1 once the router follows the backend's KV events.",
              [](const Backend& b) { return b.index().synced() ? 1 : 0; });
  per_backend(out, backends, "pagoda_router_backend_index_resyncs_total", "counter",
              "Times the prefix index started over (event gap, backend restart).",
              [](const Backend& b) { return b.index().resyncs(); });
  per_backend(out, backends, "pagoda_router_backend_health_transitions_total", "counter",
              "Times the backend entered or left rotation.",
              [](const Backend& b) { return b.health_transitions.load(); });

  header(out, "pagoda_router_retries_total", "counter", "Requests retried on another backend.");
  out += fmt::format("pagoda_router_retries_total {}\n", retries.load());
  header(out, "pagoda_router_no_healthy_backend_total", "counter", "Requests answered 503: no healthy backend.");
  out += fmt::format("pagoda_router_no_healthy_backend_total {}\n", no_backend.load());
  header(out, "pagoda_router_client_disconnects_total", "counter", "Clients that left before their response ended.");
  out += fmt::format("pagoda_router_client_disconnects_total {}\n", client_disconnects.load());
  header(out, "pagoda_router_unhashed_prompts_total", "counter",
         "kv-aware requests routed by load alone (prompt or namespace unknown).");
  out += fmt::format("pagoda_router_unhashed_prompts_total {}\n", unhashed_prompts.load());

  header(out, "pagoda_router_http_connections_open", "gauge", "Client connections open at the router.");
  out += fmt::format("pagoda_router_http_connections_open {}\n", front.connections_open);
  header(out, "pagoda_router_http_connections_refused_total", "counter",
         "Client connections refused (503) over the connection cap.");
  out += fmt::format("pagoda_router_http_connections_refused_total {}\n", front.connections_refused);
  header(out, "pagoda_router_http_busy_refusals_total", "counter",
         "Requests answered 429 at once: the handler queue or the router's open requests were full.");
  out += fmt::format("pagoda_router_http_busy_refusals_total {}\n", front.busy_refusals + busy_refusals.load());
  header(out, "pagoda_router_http_timeouts_total", "counter", "Client requests cut off by a read deadline.");
  out += fmt::format("pagoda_router_http_timeouts_total{{phase=\"header\"}} {}\n", front.header_timeouts);
  out += fmt::format("pagoda_router_http_timeouts_total{{phase=\"body\"}} {}\n", front.body_timeouts);
  header(out, "pagoda_router_http_slow_readers_dropped_total", "counter",
         "Clients dropped for not reading their streamed response.");
  out += fmt::format("pagoda_router_http_slow_readers_dropped_total {}\n", front.slow_readers_dropped);
  header(out, "pagoda_router_http_responses_total", "counter", "Responses the router sent, by status.");
  for (const auto& [status, n] : front.responses_by_status)
    out += fmt::format("pagoda_router_http_responses_total{{code=\"{}\"}} {}\n", status, n);

  std::lock_guard lock(mutex_);
  header(out, "pagoda_router_prefix_match_tokens", "histogram",
         "kv-aware: prompt tokens the chosen backend was known to hold cached.");
  int64_t cumulative = 0;
  for (size_t i = 0; i < kPrefixBuckets.size(); ++i) {
    cumulative += prefix_counts_[i];
    out += fmt::format("pagoda_router_prefix_match_tokens_bucket{{le=\"{}\"}} {}\n", kPrefixBuckets[i], cumulative);
  }
  cumulative += prefix_counts_.back();
  out += fmt::format("pagoda_router_prefix_match_tokens_bucket{{le=\"+Inf\"}} {}\n", cumulative);
  out += fmt::format("pagoda_router_prefix_match_tokens_sum {}\npagoda_router_prefix_match_tokens_count {}\n",
                     prefix_sum_, prefix_count_);
  header(out, "pagoda_router_routed_prompt_tokens_total", "counter",
         "kv-aware: prompt tokens of the requests in the histogram.");
  out += fmt::format("pagoda_router_routed_prompt_tokens_total {}\n", prompt_tokens_);
  return out;
}

}  // namespace pagoda::router
