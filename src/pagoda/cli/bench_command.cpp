// `pagoda bench serve`: a load generator against a running `pagoda serve` (or
// any OpenAI-compatible server). Streams /v1/completions with token-id prompts
// at several concurrency levels and reports throughput, time to first token
// (TTFT) and inter-token latency (ITL); writes CSV rows and a PNG plot
// (gnuplot). A progress bar runs on stderr.
//
//   pagoda bench serve --url http://127.0.0.1:8000 [--model pagoda-tiny] \
//       --concurrency 1,2,4,8 --requests 32 --prompt-tokens 128 --output-tokens 32 \
//       --csv bench/serve/results.csv --plot bench/serve/latency.png
//
// The customer-service case of the source article: --shared-prefix-tokens 2000
// --prompt-tokens 100 (a shared system prompt plus ~100 unique tokens each);
// run it against a server with and without --no-prefix-cache, with --label.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"

namespace pagoda::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;
  std::string api_key;
  std::vector<int> concurrency = {1, 2, 4, 8};
  int requests = 32;  // per concurrency level
  int prompt_tokens = 128;
  int shared_prefix_tokens = 0;
  int output_tokens = 32;
  int vocab_low = 10, vocab_high = 250;  // token ids drawn from [low, high): valid for every fixture
  int warmup = 1;
  uint64_t seed = 1;
  std::string label = "default";
  std::string csv;
  std::string plot;
  bool no_progress = false;
  // Fields merged into every request body, e.g. {"response_format": {"type": "json_object"}}
  // to measure what structured outputs cost.
  std::string extra_body;
  json extra;
};

struct RequestResult {
  bool ok = false;
  std::string error;
  // What kind of failure, for the summary: the server's error code
  // ("kv_cache_capacity", "queue_full", ...), else "HTTP <status>", "connection" or "no tokens".
  std::string failure_kind;
  double ttft_s = 0, latency_s = 0;
  std::vector<double> itl_s;
  int output_tokens = 0, prompt_tokens = 0, cached_tokens = 0;
};

struct LevelSummary {
  int concurrency = 0, requests = 0, failed = 0;
  std::map<std::string, int> failures;  // failure kind -> requests
  double wall_s = 0, output_tok_s = 0, total_tok_s = 0, req_s = 0;
  double ttft_mean = 0, ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;
  double itl_mean = 0, itl_p50 = 0, itl_p99 = 0;
  double latency_mean = 0, cached_fraction = 0;
};

// "code: message" of an OpenAI error object ({"message", "type", "code", ...}); the code (or type)
// is also returned as the failure's kind.
std::pair<std::string, std::string> describe_api_error(const json& error) {
  std::string kind;
  if (error.contains("code") && error["code"].is_string()) kind = error["code"].get<std::string>();
  if (kind.empty() && error.contains("type") && error["type"].is_string()) kind = error["type"].get<std::string>();
  const std::string message =
      error.contains("message") && error["message"].is_string() ? error["message"].get<std::string>() : "error";
  return {kind.empty() ? message : kind + ": " + message, kind};
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

// One streamed completion; TTFT is the first chunk carrying text, ITL the gaps after it.
RequestResult run_one(const BenchOptions& opt, const std::vector<int32_t>& prompt) {
  RequestResult r;
  httplib::Client client(opt.url);
  client.set_read_timeout(600, 0);
  client.set_connection_timeout(10, 0);
  json body = {{"model", opt.model}, {"prompt", prompt}, {"max_tokens", opt.output_tokens}, {"temperature", 0},
               {"stream", true}, {"ignore_eos", true}, {"stream_options", {{"include_usage", true}}}};
  if (opt.extra.is_object()) body.update(opt.extra);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!opt.api_key.empty()) req.set_header("Authorization", "Bearer " + opt.api_key);
  const auto start = Clock::now();
  std::optional<Clock::time_point> last;
  std::string buffer;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("error") && chunk["error"].is_object()) {
        std::tie(r.error, r.failure_kind) = describe_api_error(chunk["error"]);
        if (r.failure_kind.empty()) r.failure_kind = "stream error";
        continue;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        r.output_tokens = chunk["usage"].value("completion_tokens", 0);
        r.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
        r.cached_tokens = chunk["usage"]["prompt_tokens_details"].value("cached_tokens", 0);
      }
      if (chunk.contains("choices") && !chunk["choices"].empty()) {
        const auto now = Clock::now();
        if (!last)
          r.ttft_s = std::chrono::duration<double>(now - start).count();
        else
          r.itl_s.push_back(std::chrono::duration<double>(now - *last).count());
        last = now;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  if (!client.send(req, res, err)) {
    r.error = "connection failed: " + httplib::to_string(err);
    r.failure_kind = "connection";
    return r;
  }
  if (res.status != 200) {
    const std::string status = "HTTP " + std::to_string(res.status);
    // The receiver above got the body (an error object, not events): it is still whole in `buffer`.
    const std::string& raw = res.body.empty() ? buffer : res.body;
    const json body = json::parse(raw, nullptr, false);
    if (!body.is_discarded() && body.is_object() && body.contains("error") && body["error"].is_object()) {
      const auto [text, kind] = describe_api_error(body["error"]);
      r.error = status + " " + text;
      r.failure_kind = kind.empty() ? status : kind;
    } else {
      r.error = status + ": " + raw.substr(0, 200);
      r.failure_kind = status;
    }
    return r;
  }
  r.latency_s = std::chrono::duration<double>(Clock::now() - start).count();
  r.ok = r.error.empty() && last.has_value();
  if (!r.ok && r.failure_kind.empty()) {
    r.failure_kind = "no tokens";
    if (r.error.empty()) r.error = "the stream ended without a token";
  }
  return r;
}

// "3 failed: kv_cache_capacity 2, HTTP 502 1".
std::string failure_text(const LevelSummary& s) {
  std::string text = std::to_string(s.failed) + " failed:";
  const char* separator = " ";
  for (const auto& [kind, count] : s.failures) {
    text += separator + kind + " " + std::to_string(count);
    separator = ", ";
  }
  return text;
}

void draw_progress(int done, int total, int concurrency, const std::string& label) {
  const int width = 30;
  const int filled = total ? done * width / total : width;
  std::fprintf(stderr, "\r[%s] c=%-3d [%.*s%*s] %d/%d", label.c_str(), concurrency, filled,
               "##############################", width - filled, "", done, total);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

LevelSummary run_level(const BenchOptions& opt, int concurrency, std::mt19937_64& rng,
                       const std::vector<int32_t>& shared_prefix) {
  std::uniform_int_distribution<int32_t> token(opt.vocab_low, opt.vocab_high - 1);
  std::vector<std::vector<int32_t>> prompts(opt.requests);
  for (auto& p : prompts) {
    p = shared_prefix;
    for (int i = 0; i < opt.prompt_tokens; ++i) p.push_back(token(rng));
  }
  std::vector<RequestResult> results(opt.requests);
  std::atomic<int> next{0}, done{0};
  std::mutex progress_mutex;
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w) {
    workers.emplace_back([&] {
      for (int i; (i = next++) < opt.requests;) {
        results[i] = run_one(opt, prompts[i]);
        const int d = ++done;
        if (!opt.no_progress) {
          std::lock_guard lock(progress_mutex);
          draw_progress(d, opt.requests, concurrency, opt.label);
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  LevelSummary s;
  s.concurrency = concurrency;
  s.requests = opt.requests;
  s.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> ttft, itl, latency;
  int64_t out_tokens = 0, prompt_tokens = 0, cached = 0;
  for (const auto& r : results) {
    if (!r.ok) {
      if (++s.failed == 1) std::fprintf(stderr, "request failed: %s\n", r.error.c_str());
      ++s.failures[r.failure_kind];
      continue;
    }
    ttft.push_back(r.ttft_s);
    latency.push_back(r.latency_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    out_tokens += r.output_tokens;
    prompt_tokens += r.prompt_tokens;
    cached += r.cached_tokens;
  }
  s.output_tok_s = out_tokens / s.wall_s;
  s.total_tok_s = (out_tokens + prompt_tokens) / s.wall_s;
  s.req_s = (opt.requests - s.failed) / s.wall_s;
  s.ttft_mean = mean(ttft);
  s.ttft_p50 = percentile(ttft, 0.5);
  s.ttft_p90 = percentile(ttft, 0.9);
  s.ttft_p99 = percentile(ttft, 0.99);
  s.itl_mean = mean(itl);
  s.itl_p50 = percentile(itl, 0.5);
  s.itl_p99 = percentile(itl, 0.99);
  s.latency_mean = mean(latency);
  s.cached_fraction = prompt_tokens ? static_cast<double>(cached) / prompt_tokens : 0;
  return s;
}

const char* kCsvHeader =
    "label,concurrency,requests,failed,prompt_tokens,shared_prefix_tokens,output_tokens,wall_s,output_tok_s,"
    "total_tok_s,req_s,ttft_mean_s,ttft_p50_s,ttft_p90_s,ttft_p99_s,itl_mean_s,itl_p50_s,itl_p99_s,"
    "latency_mean_s,cached_fraction";

void write_plot(const std::string& csv, const std::string& png) {
  // Latency (TTFT and ITL p50, log scale) and throughput against concurrency, one line per label.
  std::string script =
      "set datafile separator ','\n"
      "set terminal pngcairo size 1200,500 noenhanced\n"
      "set output '" + png + "'\n"
      "set multiplot layout 1,2\n"
      "set key top left\nset grid\nset logscale x 2\nset xlabel 'concurrency'\n"
      "labels = system(\"tail -n +2 '" + csv + "' | cut -d, -f1 | awk '!seen[$0]++' | tr '\\n' ' '\")\n"
      "set title 'output throughput'\nset ylabel 'tokens/s'\n"
      "plot for [l in labels] '" + csv + "' using (strcol(1) eq l ? $2 : 1/0):9 with linespoints title l\n"
      "set title 'latency (p50)'\nset ylabel 'seconds'\nset logscale y\n"
      "plot for [l in labels] '" + csv + "' using (strcol(1) eq l ? $2 : 1/0):13 with linespoints title l.' TTFT', "
      "for [l in labels] '" + csv + "' using (strcol(1) eq l ? $2 : 1/0):17 with linespoints dt 2 title l.' ITL'\n"
      "unset multiplot\n";
  FILE* gp = popen("gnuplot 2>&1", "w");
  if (!gp) {
    std::fprintf(stderr, "warning: gnuplot not found; no plot written\n");
    return;
  }
  std::fwrite(script.data(), 1, script.size(), gp);
  if (pclose(gp) != 0) std::fprintf(stderr, "warning: gnuplot failed; see its output above\n");
}

// The first model id the server lists on /v1/models (what `pagoda serve` serves).
std::string served_model_id(const BenchOptions& opt) {
  httplib::Client client(opt.url);
  client.set_connection_timeout(5, 0);
  httplib::Headers headers;
  if (!opt.api_key.empty()) headers.emplace("Authorization", "Bearer " + opt.api_key);
  auto res = client.Get("/v1/models", headers);
  if (!res || res->status != 200) fail("no --model given and GET " + opt.url + "/v1/models failed; pass --model");
  const json list = json::parse(res->body, nullptr, false);
  if (list.is_discarded() || !list.contains("data") || !list["data"].is_array() || list["data"].empty() ||
      !list["data"][0].contains("id") || !list["data"][0]["id"].is_string())
    fail("no --model given and " + opt.url + "/v1/models lists no model id; pass --model");
  return list["data"][0]["id"].get<std::string>();
}

void run_bench(BenchOptions opt) {
  if (opt.requests < 1 || opt.output_tokens < 1 || opt.prompt_tokens < 1) fail("--requests, --prompt-tokens and --output-tokens must be >= 1");
  if (opt.vocab_low < 0 || opt.vocab_high <= opt.vocab_low) fail("--token-range must be LOW,HIGH with 0 <= LOW < HIGH");
  {
    httplib::Client probe(opt.url);
    probe.set_connection_timeout(5, 0);
    auto health = probe.Get("/health");
    if (!health || health->status != 200) fail("no healthy server at " + opt.url);
  }
  if (!opt.extra_body.empty()) {
    opt.extra = json::parse(opt.extra_body, nullptr, false);
    if (opt.extra.is_discarded() || !opt.extra.is_object()) fail("--extra-body must be a JSON object");
  }
  if (opt.model.empty()) {
    opt.model = served_model_id(opt);
    std::fprintf(stderr, "bench: model '%s' (from /v1/models)\n", opt.model.c_str());
  }
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int32_t> token(opt.vocab_low, opt.vocab_high - 1);
  std::vector<int32_t> shared_prefix(opt.shared_prefix_tokens);
  for (auto& t : shared_prefix) t = token(rng);
  if (opt.warmup > 0) {
    // Warm-up: loads pages, and (with a shared prefix) fills the prefix cache as a live server would be.
    std::vector<int32_t> p = shared_prefix;
    for (int i = 0; i < opt.prompt_tokens; ++i) p.push_back(token(rng));
    for (int i = 0; i < opt.warmup; ++i) run_one(opt, p);
  }
  std::vector<LevelSummary> summaries;
  for (int c : opt.concurrency) summaries.push_back(run_level(opt, c, rng, shared_prefix));

  std::printf("%-10s %5s %9s %10s %10s %10s %10s %10s %8s\n", "label", "conc", "req/s", "out tok/s", "TTFT p50",
              "TTFT p90", "ITL p50", "ITL p99", "cached");
  for (const auto& s : summaries)
    std::printf("%-10s %5d %9.2f %10.1f %9.3fs %9.3fs %9.4fs %9.4fs %7.1f%%%s\n", opt.label.c_str(), s.concurrency,
                s.req_s, s.output_tok_s, s.ttft_p50, s.ttft_p90, s.itl_p50, s.itl_p99, 100 * s.cached_fraction,
                s.failed ? (" (" + failure_text(s) + ")").c_str() : "");
  if (!opt.csv.empty()) {
    const bool fresh = !std::filesystem::exists(opt.csv) || std::filesystem::file_size(opt.csv) == 0;
    std::ofstream out(opt.csv, std::ios::app);
    if (!out) fail("cannot write --csv " + opt.csv);
    if (fresh) out << kCsvHeader << "\n";
    for (const auto& s : summaries)
      out << opt.label << ',' << s.concurrency << ',' << s.requests << ',' << s.failed << ',' << opt.prompt_tokens
          << ',' << opt.shared_prefix_tokens << ',' << opt.output_tokens << ',' << s.wall_s << ',' << s.output_tok_s
          << ',' << s.total_tok_s << ',' << s.req_s << ',' << s.ttft_mean << ',' << s.ttft_p50 << ',' << s.ttft_p90
          << ',' << s.ttft_p99 << ',' << s.itl_mean << ',' << s.itl_p50 << ',' << s.itl_p99 << ',' << s.latency_mean
          << ',' << s.cached_fraction << "\n";
    out.close();
    if (!opt.plot.empty()) write_plot(opt.csv, opt.plot);
  }
  for (const auto& s : summaries)
    if (s.failed == s.requests)
      fail("every request failed at concurrency " + std::to_string(s.concurrency) + " (" + failure_text(s) + ")");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* serve = bench->add_subcommand("serve", "Load-test a running OpenAI-compatible server (streamed completions)");
  serve->add_option("--url", opt->url, "Server base URL")->capture_default_str();
  serve->add_option("--model", opt->model, "Model id the server serves (default: the first one on /v1/models)");
  serve->add_option("--api-key", opt->api_key, "Bearer key, if the server wants one");
  serve->add_option("--concurrency", opt->concurrency, "Concurrency levels")->delimiter(',')->capture_default_str();
  serve->add_option("--requests", opt->requests, "Requests per concurrency level")->capture_default_str();
  serve->add_option("--prompt-tokens", opt->prompt_tokens, "Unique prompt tokens per request")->capture_default_str();
  serve->add_option("--shared-prefix-tokens", opt->shared_prefix_tokens, "Tokens of a prefix every request shares")
      ->capture_default_str();
  serve->add_option("--output-tokens", opt->output_tokens, "Tokens generated per request (ignore_eos)")
      ->capture_default_str();
  serve->add_option("--token-low", opt->vocab_low, "Smallest random token id")->capture_default_str();
  serve->add_option("--token-high", opt->vocab_high, "Random token ids are below this")->capture_default_str();
  serve->add_option("--warmup", opt->warmup, "Warm-up requests before measuring")->capture_default_str();
  serve->add_option("--seed", opt->seed, "Seed of the random prompts")->capture_default_str();
  serve->add_option("--label", opt->label, "Name of this run in the CSV and the plot")->capture_default_str();
  serve->add_option("--csv", opt->csv, "Append one row per concurrency level to this CSV");
  serve->add_option("--extra-body", opt->extra_body,
                    "JSON object merged into every request, e.g. '{\"guided_regex\": \"[a-z ]*\"}'");
  serve->add_option("--plot", opt->plot, "PNG of throughput and latency against concurrency (needs --csv)");
  serve->add_flag("--no-progress", opt->no_progress, "No progress bar");
  serve->callback([opt] { run_bench(*opt); });
}

}  // namespace pagoda::cli
