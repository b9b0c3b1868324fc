// pagoda_gpu_engine_bench: the end-to-end runs through the real engine
// (scheduler, KV manager with prefix cache, host sampler) on the CUDA backend.
//
//   --workload random        N requests of random prompts (input-len / output-len),
//                            all submitted at t=0; output tok/s, TTFT, ITL
//   --workload shared-prefix N requests = one shared prefix (prefix-len) + unique
//                            tokens (input-len) + output-len; run twice, prefix
//                            cache on and off; TTFT and total tok/s of each
//
// Greedy sampling (temperature 0) with ignore_eos, so every request generates
// exactly output-len tokens on random weights.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace pagoda;

[[noreturn]] void die(const Status& s, const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

struct Args {
  std::string config_path, workload = "random", json_out;
  int num_requests = 1000, input_len = 1000, output_len = 1000, prefix_len = 2000;
  int max_num_seqs = 256, max_tokens_per_step = 8192;
  double gpu_memory_utilization = 0.9, max_seconds = 600;
};

// Submits every prompt at once, drains the streams from one client thread per
// request batch, and reports client-side TTFT / ITL and throughput.
nlohmann::json run_engine(cuda::CudaModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                          const Args& args, bool prefix_cache, const char* label) {
  kv::KvCacheConfig kv_config;
  kv_config.num_blocks = runner.num_blocks();
  kv_config.block_size = runner.block_size();
  kv_config.enable_prefix_cache = prefix_cache;
  kv_config.record_events = false;
  auto kv = kv::KvCacheManager::create(kv_config);
  if (!kv.ok()) die(kv.status(), "KV manager");
  engine::EngineConfig config;
  config.scheduler.max_running_sequences = args.max_num_seqs;
  config.scheduler.max_tokens_per_step = args.max_tokens_per_step;
  config.max_queued_requests = static_cast<int32_t>(prompts.size()) + 1;
  engine::Engine eng(config, runner, **kv);
  eng.start();

  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& prompt : prompts) {
    engine::GenerationRequest request;
    request.prompt_tokens = prompt;
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = args.output_len;
    request.sampling.ignore_eos = true;
    auto stream = eng.submit(std::move(request));
    if (!stream.ok()) die(stream.status(), "submit");
    streams.push_back(*stream);
  }
  // Round-robin over the streams; each delta is timed when read (client view).
  std::vector<double> ttft_s(streams.size(), -1), last_s(streams.size(), 0), itl_ms;
  std::vector<bool> done(streams.size(), false);
  size_t finished = 0;
  int64_t tokens = 0, cached = 0;
  bool timed_out = false;
  while (finished < streams.size()) {
    const double now_total = std::chrono::duration<double>(Clock::now() - t0).count();
    if (now_total > args.max_seconds) {
      timed_out = true;
      break;
    }
    bool any = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (done[i]) continue;
      while (auto out = streams[i]->next(std::chrono::milliseconds(0))) {
        any = true;
        const double now = std::chrono::duration<double>(Clock::now() - t0).count();
        int32_t n = 0;
        for (const auto& c : out->choices) n += static_cast<int32_t>(c.tokens.size());
        if (n > 0) {
          if (ttft_s[i] < 0) {
            ttft_s[i] = now;
          } else {
            itl_ms.push_back((now - last_s[i]) * 1e3 / n);
          }
          last_s[i] = now;
          tokens += n;
        }
        if (out->finished) {
          done[i] = true;
          ++finished;
          cached += out->usage.cached_tokens;
          if (!out->error.empty()) std::fprintf(stderr, "request %zu failed: %s\n", i, out->error.c_str());
          break;
        }
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  eng.shutdown(std::chrono::milliseconds(0));
  std::vector<double> ttft_ms;
  for (double t : ttft_s)
    if (t >= 0) ttft_ms.push_back(t * 1e3);
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  const engine::EngineStats stats = eng.stats();
  nlohmann::json r = {
      {"label", label}, {"prefix_cache", prefix_cache}, {"requests", prompts.size()}, {"finished", finished},
      {"timed_out", timed_out}, {"wall_s", wall}, {"output_tokens", tokens}, {"output_tok_per_s", tokens / wall},
      {"total_tok_per_s", (tokens + prompt_tokens) / wall}, {"cached_prompt_tokens", cached},
      {"ttft_ms_mean", mean(ttft_ms)}, {"ttft_ms_p50", percentile(ttft_ms, 50)},
      {"ttft_ms_p99", percentile(ttft_ms, 99)}, {"itl_ms_mean", mean(itl_ms)}, {"itl_ms_p50", percentile(itl_ms, 50)},
      {"itl_ms_p99", percentile(itl_ms, 99)}, {"engine_steps", stats.steps}, {"preemptions", stats.preemptions}};
  std::printf("%s: %zu/%zu requests in %.1f s%s: %.0f output tok/s, %.0f total tok/s; TTFT mean %.0f ms p50 %.0f "
              "p99 %.0f; ITL mean %.1f ms p50 %.1f p99 %.1f; %lld cached prompt tokens; %lld steps, %lld "
              "preemptions\n", label, finished, prompts.size(), wall, timed_out ? " (TIME LIMIT)" : "",
              tokens / wall, (tokens + prompt_tokens) / wall, mean(ttft_ms), percentile(ttft_ms, 50),
              percentile(ttft_ms, 99), mean(itl_ms), percentile(itl_ms, 50), percentile(itl_ms, 99),
              static_cast<long long>(cached), static_cast<long long>(stats.steps),
              static_cast<long long>(stats.preemptions));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"pagoda_gpu_engine_bench: end-to-end runs through the engine on the CUDA backend"};
  app.add_option("--config", args.config_path, "config.json; weights are random bf16 made on the GPU")->required();
  app.add_option("--workload", args.workload)->check(CLI::IsMember({"random", "shared-prefix"}));
  app.add_option("--num-requests", args.num_requests)->check(CLI::PositiveNumber);
  app.add_option("--input-len", args.input_len, "random prompt length (shared-prefix: unique tokens)")
      ->check(CLI::PositiveNumber);
  app.add_option("--output-len", args.output_len)->check(CLI::PositiveNumber);
  app.add_option("--prefix-len", args.prefix_len, "shared-prefix: tokens of the shared prefix")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-num-seqs", args.max_num_seqs)->check(CLI::PositiveNumber);
  app.add_option("--max-tokens-per-step", args.max_tokens_per_step)->check(CLI::PositiveNumber);
  app.add_option("--gpu-memory-utilization", args.gpu_memory_utilization)->check(CLI::Range(0.01, 1.0));
  app.add_option("--max-seconds", args.max_seconds);
  app.add_option("--json", args.json_out);
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  std::ifstream in(args.config_path);
  auto config = parse_model_config(nlohmann::json::parse(in, nullptr, false), args.config_path);
  if (!config.ok()) die(config.status(), "config");
  cuda::CudaModelOptions options;
  options.max_num_seqs = args.max_num_seqs;
  options.max_num_tokens = args.max_tokens_per_step;
  const int32_t longest = (args.workload == "shared-prefix" ? args.prefix_len : 0) + args.input_len + args.output_len;
  options.max_model_len = std::min(longest + 16, config->max_position_embeddings);
  auto model = cuda::CudaModel::create_random(*config, 1, options);
  if (!model.ok()) die(model.status(), "model");
  cuda::CudaRunnerOptions runner_options;
  runner_options.gpu_memory_utilization = args.gpu_memory_utilization;
  auto runner = cuda::CudaModelRunner::create(std::move(model).value(), runner_options);
  if (!runner.ok()) die(runner.status(), "runner");

  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, config->vocab_size - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = token(rng);
    return t;
  };
  nlohmann::json figures = {{"kv_pool", (*runner)->kv_pool_report()}, {"workload", args.workload}};
  std::vector<std::vector<int32_t>> prompts;
  if (args.workload == "random") {
    for (int i = 0; i < args.num_requests; ++i) prompts.push_back(random_tokens(args.input_len));
    figures["runs"] = {run_engine(**runner, prompts, args, true, "engine, random prompts")};
  } else {
    const std::vector<int32_t> prefix = random_tokens(args.prefix_len);
    for (int i = 0; i < args.num_requests; ++i) {
      std::vector<int32_t> p = prefix;
      const std::vector<int32_t> unique = random_tokens(args.input_len);
      p.insert(p.end(), unique.begin(), unique.end());
      prompts.push_back(std::move(p));
    }
    figures["runs"] = {run_engine(**runner, prompts, args, false, "shared prefix, prefix cache off"),
                       run_engine(**runner, prompts, args, true, "shared prefix, prefix cache on")};
  }
  if (!args.json_out.empty()) std::ofstream(args.json_out) << figures.dump(2) << "\n";
  return 0;
}
