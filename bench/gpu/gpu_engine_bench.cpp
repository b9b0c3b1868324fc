// pagoda_gpu_engine_bench: the end-to-end runs through the real engine
// (scheduler, KV manager with prefix cache, sampling on the GPU through
// ModelRunner::execute_sampled) on the CUDA backend. Workloads, run in the
// order given in one process (one model):
//
//   random         N requests of random prompts (input-len / output-len), all
//                  submitted at t=0; output tok/s, TTFT, ITL; once per --sampling
//                  (top-p: temperature + top_p on the GPU; greedy: argmax on the GPU)
//   latency        one request (latency-input-len in, 128 by default; latency-tokens out):
//                  per-token latency against the floor of reading the weights once
//   shared-prefix  N requests = one shared prefix (prefix-len) + unique tokens
//                  (input-len) + output-len; prefix cache off, then on
//   sampler        the GPU sampler alone on [max-num-seqs, vocab] logits
//   zero-on-free   N random requests, each its own tenant (cache namespace), on
//                  a KV pool cut to --zero-kv-blocks so blocks change tenants
//                  every step: zeroing on free (issue #22) off vs on, best of
//                  --zero-reps each, alternating; "[zero-cost]" line
//   evict          N random requests (input-len / output-len), greedy, with the
//                  full cache and then with token eviction (--kv-compression,
//                  --kv-budget), or the runs of --evict-runs (policy:requests,
//                  "fit": the full sequences the pool holds), optionally all on
//                  one prompt computed once (--evict-shared-prompt): decode-only
//                  tok/s of each and its ratio to the last full-cache run;
//                  "[evict]" lines (issue #21's long-context goal)
//
// Every request has ignore_eos, so it generates exactly output-len tokens on
// random weights. Per run: where the step time goes (engine host work vs the
// runner's forward + sampling, decode-only steps separately).

#include <cstdlib>
#include <deque>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gemm_ceiling.h"
#include "step_profile.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/sampling.h"
#include "pagoda/core/dtype.h"
#include "pagoda/engine/engine.h"
#include "pagoda/runtime/delegating_model_runner.h"
#include "pagoda/runtime/kv_compression.h"
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
  std::string config_path, json_out;
  std::string kv_cache_dtype = "bf16";  // K and V pools: bf16, fp8, int8 or int4
  int block_size = 16;  // KV block (page) size in tokens
  std::string quantization = "none";    // weights: none (bf16) or fp8
  std::vector<std::string> workloads = {"random"}, samplings = {"top-p", "greedy"};
  int num_requests = 1000, input_len = 1000, output_len = 1000, prefix_len = 2000;
  int prefix_requests = 256, prefix_input_len = 100, prefix_output_len = 64, latency_tokens = 256,
      latency_input_len = 128;
  int max_num_seqs = 256, max_tokens_per_step = 8192;
  int zero_kv_blocks = 2048, zero_reps = 3;
  std::string kv_compression = "streaming";  // evict: the policy (the cuda device runs streaming, h2o, snapkv)
  // evict: runs "policy:requests,..." (requests "fit": as many full prompt + output sequences as the pool
  // holds); empty: none and --kv-compression at --num-requests. --evict-shared-prompt: every request sends
  // the same prompt, computed once by an untimed warm-up (prefix cache on), so a run's prefill is short.
  std::string evict_runs;
  bool evict_shared_prompt = false;
  int kv_budget = 2048, kv_sink_tokens = 4, kv_window = 32;
  float temperature = 1.0f, top_p = 0.9f;
  bool host_sampling = false;
  // EngineConfig::overlap_steps, auto like `pagoda serve`; PAGODA_OVERLAP_STEPS=on|off sets the default
  // (A/B calls of one bundle).
  std::string overlap_steps = std::getenv("PAGODA_OVERLAP_STEPS") != nullptr ? std::getenv("PAGODA_OVERLAP_STEPS")
                                                                              : "auto";
  double gpu_memory_utilization = 0.9, max_seconds = 600, prefix_max_seconds = 120;
  // prefill workload: requests of --input-len tokens with one output token each, once per step token budget.
  std::vector<int> prefill_chunks = {2048, 4096, 8192, 16384};
  int prefill_requests = 256;
  bool step_profile = true;  // print the step profile after every engine run
  bench::ModelFlops flops;   // from the config (the step profile's TFLOP/s)
};

// The CUDA runner with a stopwatch: wall time inside the runner (forward +
// sampling + copies; it synchronizes) per step, decode-only steps apart.
// Overlapped steps (launch / collect) count from their launch, or from the
// previous collect if later, to their collect: the device's share of the
// step period that the host saw.
// host_sampling hides the device sampler (the engine then samples every row
// from logits on the host, as before).
class TimedRunner final : public runtime::DelegatingModelRunner {
 public:
  TimedRunner(cuda::CudaModelRunner& inner, bool host_sampling)
      : DelegatingModelRunner(inner), host_sampling_(host_sampling) {}
  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) override {
    const int32_t free_blocks = kv != nullptr ? kv->num_available_blocks() : -1;  // engine thread: the KV
                                                                                    // manager is between steps
    const auto t0 = Clock::now();
    auto out = inner().execute(batch, rows);
    int64_t host_rows = rows.empty() ? batch.num_logit_rows() : 0;
    for (const auto& r : rows) host_rows += r.on_device ? 0 : 1;
    record(batch, t0, host_rows, free_blocks);
    return out;
  }
  Status launch(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) override {
    const int32_t free_blocks = kv != nullptr ? kv->num_available_blocks() : -1;
    const auto t0 = Clock::now();
    PAGODA_RETURN_IF_ERROR(inner().launch(batch, rows));
    launched_.push_back(Pending{batch, t0, free_blocks});
    return ok_status();
  }
  StatusOr<runtime::StepResult> collect() override {
    auto out = inner().collect();
    Pending p = std::move(launched_.front());
    launched_.pop_front();
    record(p.batch, std::max(p.t0, last_collect_), 0, p.free_blocks);
    last_collect_ = Clock::now();
    return out;
  }
  runtime::RunnerCapabilities capabilities() const override {
    return host_sampling_ ? runtime::RunnerCapabilities{} : DelegatingModelRunner::capabilities();
  }

  struct Totals {
    int64_t steps = 0, decode_steps = 0, decode_rows = 0, host_rows = 0, tokens = 0;
    double seconds = 0, decode_seconds = 0;
  };
  Totals totals;
  std::vector<bench::StepRecord> steps;  // every step since run_t0
  Clock::time_point run_t0 = Clock::now();
  const kv::KvCacheManager* kv = nullptr;  // read on the engine thread only, before each step

 private:
  void record(const ForwardBatch& batch, Clock::time_point t0, int64_t host_rows, int32_t free_blocks) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    bool decode = true;
    bench::StepRecord rec;
    rec.start_s = std::chrono::duration<double>(t0 - run_t0).count();
    rec.seconds = s;
    rec.free_blocks = free_blocks;
    for (const auto& seq : batch.sequences) {
      decode &= seq.num_new_tokens == 1;
      if (seq.num_new_tokens == 1)
        ++rec.decode_rows;
      else
        rec.prefill_tokens += seq.num_new_tokens;
    }
    steps.push_back(rec);
    ++totals.steps;
    totals.seconds += s;
    totals.tokens += batch.num_tokens();
    totals.host_rows += host_rows;
    if (decode) {
      ++totals.decode_steps;
      totals.decode_seconds += s;
      totals.decode_rows += static_cast<int64_t>(batch.sequences.size());
    }
  }
  bool host_sampling_;
  struct Pending {
    ForwardBatch batch;
    Clock::time_point t0;
    int32_t free_blocks;
  };
  std::deque<Pending> launched_;
  Clock::time_point last_collect_{};
};

struct SamplingChoice {
  std::string name;
  float temperature = 0.0f, top_p = 1.0f;
};

// What the zero-on-free workload changes in a run.
struct TenancyChoice {
  int kv_blocks = 0;        // blocks the KV manager uses (0: the runner's whole pool)
  bool distinct_tenants = false;  // every request its own cache namespace
  bool zero_on_free = false;      // KvCacheConfig::zero_blocks_between_namespaces
};

// Submits every prompt at once, drains the streams from one client thread per
// request batch, and reports client-side TTFT / ITL and throughput.
nlohmann::json run_engine(cuda::CudaModelRunner& cuda_runner, const std::vector<std::vector<int32_t>>& prompts,
                          const Args& args, bool prefix_cache, const std::string& label_text,
                          const SamplingChoice& sampling, int output_len, double max_seconds,
                          const TenancyChoice& tenancy = {},
                          const runtime::KvCompressionConfig& compression = {},
                          const std::vector<int32_t>& warm_up = {}) {
  const char* label = label_text.c_str();
  TimedRunner runner(cuda_runner, args.host_sampling);
  kv::KvCacheConfig kv_config;
  kv_config.num_blocks = tenancy.kv_blocks > 0 ? std::min(tenancy.kv_blocks, cuda_runner.num_blocks())
                                              : cuda_runner.num_blocks();
  kv_config.block_size = cuda_runner.block_size();
  kv_config.enable_prefix_cache = prefix_cache;
  kv_config.zero_blocks_between_namespaces = tenancy.zero_on_free;
  kv_config.record_events = false;
  auto kv = kv::KvCacheManager::create(kv_config);
  if (!kv.ok()) die(kv.status(), "KV manager");
  runner.kv = kv->get();
  engine::EngineConfig config;
  config.scheduler.max_running_sequences = args.max_num_seqs;
  config.scheduler.max_tokens_per_step = args.max_tokens_per_step;
  config.max_queued_requests = static_cast<int32_t>(prompts.size()) + 1;
  config.kv_compression = compression;
  config.overlap_steps = args.overlap_steps == "on"    ? engine::OverlapSteps::kOn
                         : args.overlap_steps == "off" ? engine::OverlapSteps::kOff
                                                       : engine::OverlapSteps::kAuto;
  engine::Engine eng(config, runner, **kv);
  eng.start();
  if (!warm_up.empty()) {
    // One request computes the shared prompt first (untimed), so that the timed ones find it cached.
    engine::GenerationRequest request;
    request.prompt_tokens = warm_up;
    request.sampling.max_tokens = 1;
    request.sampling.ignore_eos = true;
    auto stream = eng.submit(std::move(request));
    if (!stream.ok()) die(stream.status(), "submit (warm-up)");
    for (bool finished = false; !finished;)
      while (auto out = (*stream)->next(std::chrono::milliseconds(100))) {
        if (!out->error.empty()) std::fprintf(stderr, "warm-up failed: %s\n", out->error.c_str());
        if (out->finished) finished = true;
      }
    runner.totals = {};
  }

  const auto t0 = Clock::now();
  runner.steps.clear();
  runner.run_t0 = t0;
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& prompt : prompts) {
    engine::GenerationRequest request;
    request.prompt_tokens = prompt;
    if (tenancy.distinct_tenants) request.tenant_namespace = fmt::format("tenant{}", streams.size());
    request.sampling.temperature = sampling.temperature;
    request.sampling.top_p = sampling.top_p;
    request.sampling.max_tokens = output_len;
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
    if (now_total > max_seconds) {
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
  const TimedRunner::Totals& t = runner.totals;
  const double runner_ms = t.steps ? t.seconds * 1e3 / t.steps : 0, period_ms = t.steps ? wall * 1e3 / t.steps : 0;
  const double decode_ms = t.decode_steps ? t.decode_seconds * 1e3 / t.decode_steps : 0;
  const double decode_batch = t.decode_steps ? double(t.decode_rows) / t.decode_steps : 0;
  nlohmann::json r = {
      {"sampling", sampling.name}, {"temperature", sampling.temperature}, {"top_p", sampling.top_p},
      {"device_sampling", !args.host_sampling}, {"step_period_ms", period_ms}, {"runner_ms_per_step", runner_ms},
      {"host_ms_per_step", period_ms - runner_ms}, {"decode_steps", t.decode_steps},
      {"decode_step_ms", decode_ms}, {"decode_batch_mean", decode_batch}, {"host_sampled_rows", t.host_rows},
      {"label", label}, {"prefix_cache", prefix_cache}, {"requests", prompts.size()}, {"finished", finished},
      {"timed_out", timed_out}, {"wall_s", wall}, {"output_tokens", tokens}, {"output_tok_per_s", tokens / wall},
      {"total_tok_per_s", (tokens + prompt_tokens) / wall}, {"cached_prompt_tokens", cached},
      {"ttft_ms_mean", mean(ttft_ms)}, {"ttft_ms_p50", percentile(ttft_ms, 50)},
      {"ttft_ms_p99", percentile(ttft_ms, 99)}, {"itl_ms_mean", mean(itl_ms)}, {"itl_ms_p50", percentile(itl_ms, 50)},
      {"itl_ms_p99", percentile(itl_ms, 99)}, {"engine_steps", stats.steps}, {"overlapped_steps", stats.overlapped_steps}, {"preemptions", stats.preemptions}, {"kv_compactions", stats.kv_compactions},
      {"kv_blocks", kv_config.num_blocks}, {"zero_on_free", tenancy.zero_on_free},
      {"distinct_tenants", tenancy.distinct_tenants}, {"kv_blocks_zeroed", stats.kv_blocks_zeroed}};
  std::printf("%s: %zu/%zu requests in %.1f s%s: %.0f output tok/s, %.0f total tok/s; TTFT mean %.0f ms p50 %.0f "
              "p99 %.0f; ITL mean %.1f ms p50 %.1f p99 %.1f; %lld cached prompt tokens; %lld steps, %lld "
              "preemptions\n", label, finished, prompts.size(), wall, timed_out ? " (TIME LIMIT)" : "",
              tokens / wall, (tokens + prompt_tokens) / wall, mean(ttft_ms), percentile(ttft_ms, 50),
              percentile(ttft_ms, 99), mean(itl_ms), percentile(itl_ms, 50), percentile(itl_ms, 99),
              static_cast<long long>(cached), static_cast<long long>(stats.steps),
              static_cast<long long>(stats.preemptions));
  std::printf("  step time: %.2f ms per step (%lld steps) = runner %.2f ms (forward + sampling + copies) + engine "
              "host %.2f ms; decode-only steps: %lld, %.2f ms each at mean batch %.1f; %lld rows sampled on the host\n",
              period_ms, static_cast<long long>(t.steps), runner_ms, period_ms - runner_ms,
              static_cast<long long>(t.decode_steps), decode_ms, decode_batch, static_cast<long long>(t.host_rows));
  if (args.step_profile)
    bench::print_step_profile(label, runner.steps, wall, args.flops, kv_config.num_blocks, stats.preemptions);
  return r;
}

// The GPU sampler alone on [rows, vocab] Llama-like logits: ms per call
// (median of 7 timings of 10 calls), on f32 logits and again rounded to bf16
// (what the model's head produces: many ties at the thresholds).
nlohmann::json bench_sampler(int rows, int vocab, float temperature, float top_p) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> host(static_cast<size_t>(rows) * vocab);
  for (float& v : host) v = normal(rng);
  auto logits = cuda::DeviceBuffer::allocate(host.size() * 4);
  auto params = cuda::DeviceBuffer::allocate(rows * sizeof(cuda::GpuSamplingParams));
  auto out = cuda::DeviceBuffer::allocate(rows * 8);
  if (!logits.ok() || !params.ok() || !out.ok()) die(logits.status(), "sampler buffers");
  nlohmann::json r = {{"rows", rows}, {"vocab", vocab}};
  const std::pair<const char*, cuda::GpuSamplingParams> cases[] = {
      {"greedy", {0.0f, 0, 1.0f, 0.0f, 1, 0}},
      {"top_p", {temperature, 0, top_p, 0.0f, 1, 0}},
      {"top_k50_top_p", {temperature, 50, top_p, 0.0f, 1, 0}},
      {"temperature_only", {temperature, 0, 1.0f, 0.0f, 1, 0}},
      {"top_k50", {temperature, 50, 1.0f, 0.0f, 1, 0}},
      {"min_p0.05_top_p", {temperature, 0, top_p, 0.05f, 1, 0}}};
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (const char* logits_kind : {"f32", "bf16"}) {
    if (std::string(logits_kind) == "bf16")
      for (float& v : host) v = round_to_bf16(v);
    cudaMemcpy(logits->data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice);
    for (const auto& [name, p] : cases) {
      std::vector<cuda::GpuSamplingParams> all(rows, p);
      cudaMemcpy(params->data(), all.data(), rows * sizeof(p), cudaMemcpyHostToDevice);
      auto launch = [&] {
        return cuda::sample_rows(logits->as<float>(), rows, vocab, params->as<cuda::GpuSamplingParams>(),
                                 out->as<int32_t>(), out->as<float>() + rows, nullptr);
      };
      if (launch() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("GPU sampler, %s: launch failed: %s\n", name, cudaGetErrorString(cudaGetLastError()));
        continue;
      }
      std::vector<float> times;
      for (int rep = 0; rep < 7; ++rep) {
        cudaEventRecord(start);
        for (int i = 0; i < 10; ++i) launch();
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        times.push_back(ms / 10);
      }
      std::sort(times.begin(), times.end());
      const std::string key = std::string(logits_kind) == "f32" ? std::string(name) : std::string("bf16_") + name;
      r[key] = times[times.size() / 2];
      std::printf("GPU sampler, %d rows x %d vocab, %s logits, %s: %.3f ms per call (median of 7; min %.3f, max %.3f)\n",
                  rows, vocab, logits_kind, name, times[times.size() / 2], times.front(), times.back());
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"pagoda_gpu_engine_bench: end-to-end runs through the engine on the CUDA backend"};
  app.add_option("--config", args.config_path, "config.json; weights are random bf16 made on the GPU")->required();
  app.add_option("--workload", args.workloads, "random, prefill, gemm, latency, shared-prefix, sampler, zero-on-free, evict (comma-separated, in order)")
      ->delimiter(',')
      ->check(CLI::IsMember({"random", "prefill", "gemm", "shared-prefix", "latency", "sampler", "zero-on-free", "evict"}));
  app.add_option("--sampling", args.samplings, "random workload: top-p (temperature + top_p on the GPU), greedy")
      ->delimiter(',')
      ->check(CLI::IsMember({"top-p", "greedy"}));
  app.add_option("--temperature", args.temperature);
  app.add_option("--top-p", args.top_p);
  app.add_flag("--host-sampling", args.host_sampling, "sample on the host from logits (the old path)");
  app.add_option("--overlap-steps", args.overlap_steps,
                 "plan and launch the next engine step while the GPU runs this one (auto, on, off; default auto, "
                 "as pagoda serve)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--num-requests", args.num_requests)->check(CLI::PositiveNumber);
  app.add_option("--input-len", args.input_len, "random prompt length")->check(CLI::PositiveNumber);
  app.add_option("--output-len", args.output_len)->check(CLI::PositiveNumber);
  app.add_option("--prefix-len", args.prefix_len, "shared-prefix: tokens of the shared prefix")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefix-requests", args.prefix_requests)->check(CLI::PositiveNumber);
  app.add_option("--prefix-input-len", args.prefix_input_len, "shared-prefix: unique tokens")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefix-output-len", args.prefix_output_len)->check(CLI::PositiveNumber);
  app.add_option("--prefix-max-seconds", args.prefix_max_seconds);
  app.add_option("--latency-tokens", args.latency_tokens)->check(CLI::PositiveNumber);
  app.add_option("--latency-input-len", args.latency_input_len,
                 "latency: prompt tokens of the one request (default 128; the context its decode steps attend over)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-num-seqs", args.max_num_seqs)->check(CLI::PositiveNumber);
  app.add_option("--max-tokens-per-step", args.max_tokens_per_step)->check(CLI::PositiveNumber);
  app.add_option("--gpu-memory-utilization", args.gpu_memory_utilization)->check(CLI::Range(0.01, 1.0));
  app.add_option("--max-seconds", args.max_seconds);
  app.add_option("--quantization", args.quantization, "weights: none (bf16) or fp8 (e4m3 per channel, fp8 GEMMs)")
      ->check(CLI::IsMember({"none", "fp8"}));
  app.add_option("--kv-cache-dtype", args.kv_cache_dtype, "KV cache element type (K and V): bf16, fp8, int8, int4")
      ->check(CLI::IsMember({"bf16", "fp8", "int8", "int4"}));
  app.add_option("--block-size", args.block_size, "KV block (page) size in tokens (default 16)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--zero-kv-blocks", args.zero_kv_blocks, "zero-on-free: KV blocks the manager may use")
      ->check(CLI::PositiveNumber);
  app.add_option("--zero-reps", args.zero_reps, "zero-on-free: runs per setting (the best counts)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-compression", args.kv_compression, "evict: the token eviction policy");
  app.add_option("--evict-runs", args.evict_runs,
                 "evict: policy:requests,... (requests may be 'fit'; policy none-detached: none without the score hook; "
                 "<policy>-pass: the scoring pass instead of the decode kernel's mass)");
  app.add_flag("--evict-shared-prompt", args.evict_shared_prompt, "evict: one prompt for every request, computed once");
  app.add_option("--kv-budget", args.kv_budget, "evict: KV tokens kept per sequence, layer and KV head");
  app.add_option("--kv-sink-tokens", args.kv_sink_tokens);
  app.add_option("--kv-window", args.kv_window);
  app.add_option("--json", args.json_out);
  app.add_option("--prefill-chunks", args.prefill_chunks,
                 "prefill workload: step token budgets to run (each a run of --prefill-requests prompts of "
                 "--input-len tokens, 1 output token); gemm workload: the token counts m")
      ->delimiter(',');
  app.add_option("--prefill-requests", args.prefill_requests)->check(CLI::PositiveNumber);
  app.add_flag("!--no-step-profile", args.step_profile, "skip the step profile after each engine run");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  std::ifstream in(args.config_path);
  auto config = parse_model_config(nlohmann::json::parse(in, nullptr, false), args.config_path);
  if (!config.ok()) die(config.status(), "config");
  cuda::CudaModelOptions options;
  options.max_num_seqs = args.max_num_seqs;
  options.max_num_tokens = args.max_tokens_per_step;
  if (std::find(args.workloads.begin(), args.workloads.end(), "prefill") != args.workloads.end())
    for (int chunk : args.prefill_chunks) options.max_num_tokens = std::max(options.max_num_tokens, chunk);
  options.kv_key_dtype = options.kv_value_dtype = *dtype_from_name(args.kv_cache_dtype);
  options.block_size = args.block_size;
  options.fp8_weights = args.quantization == "fp8";
  const int32_t longest = std::max({args.input_len + args.output_len,
                                     args.prefix_len + args.prefix_input_len + args.prefix_output_len,
                                     args.latency_input_len + args.latency_tokens});
  options.max_model_len = std::min(longest + 16, config->max_position_embeddings);
  args.flops = bench::llama_linear_flops(config->hidden_size, config->intermediate_size, config->num_q_heads,
                                         config->num_kv_heads, config->head_dim, config->num_layers,
                                         config->vocab_size);
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
  nlohmann::json figures = {{"kv_pool", (*runner)->kv_pool_report()},
                            {"kv_cache_dtype", args.kv_cache_dtype},
                            {"runs", nlohmann::json::array()}};
  auto save = [&] {
    if (!args.json_out.empty()) std::ofstream(args.json_out) << figures.dump(2) << "\n";
  };
  const SamplingChoice greedy{"greedy", 0.0f, 1.0f};
  for (const std::string& workload : args.workloads) {
    if (workload == "random") {
      std::vector<std::vector<int32_t>> prompts;
      for (int i = 0; i < args.num_requests; ++i) prompts.push_back(random_tokens(args.input_len));
      for (const std::string& name : args.samplings) {
        const SamplingChoice choice =
            name == "greedy" ? greedy : SamplingChoice{name, args.temperature, args.top_p};
        figures["runs"].push_back(run_engine(**runner, prompts, args, true,
                                             fmt::format("engine, random prompts, {}", name), choice,
                                             args.output_len, args.max_seconds));
        save();
      }
    } else if (workload == "prefill") {
      // Prefill alone: every prompt once, one output token, at each step token budget.
      std::vector<std::vector<int32_t>> prompts;
      for (int i = 0; i < args.prefill_requests; ++i) prompts.push_back(random_tokens(args.input_len));
      for (int chunk : args.prefill_chunks) {
        if (chunk < 1) die(invalid_argument_error("--prefill-chunks: {} is not a positive token count", chunk), "prefill");
        Args chunk_args = args;
        chunk_args.max_tokens_per_step = chunk;
        nlohmann::json r = run_engine(**runner, prompts, chunk_args, true,
                                      fmt::format("engine, prefill only, {} tokens per step", chunk), greedy, 1,
                                      args.max_seconds);
        const double prompt_tokens = double(args.prefill_requests) * args.input_len;
        std::printf("prefill, %d tokens per step: %.0f prompt tok/s over the wall (%.0f TFLOP/s of linear layers)\n",
                    chunk, prompt_tokens / r["wall_s"].get<double>(),
                    prompt_tokens * args.flops.per_token / r["wall_s"].get<double>() / 1e12);
        r["workload"] = "prefill";
        r["tokens_per_step"] = chunk;
        figures["runs"].push_back(r);
        save();
      }
    } else if (workload == "gemm") {
      if (!bench::gemm_ceiling(args.prefill_chunks, config->hidden_size, config->intermediate_size,
                               config->num_q_heads * config->head_dim, config->num_kv_heads * config->head_dim,
                               config->num_layers))
        die(internal_error("gemm ceiling failed"), "gemm");
    } else if (workload == "latency") {
      // Batch 1: per-token latency against reading every weight once per token.
      const std::vector<std::vector<int32_t>> one = {random_tokens(args.latency_input_len)};
      nlohmann::json r = run_engine(**runner, one, args, false, "batch-1 decode latency", greedy,
                                    args.latency_tokens, args.max_seconds);
      const double floor_ms = double((*runner)->model().weight_bytes()) / 4.3e12 * 1e3;
      r["weight_read_floor_ms"] = floor_ms;
      std::printf("  batch-1: %.2f ms per token (ITL p50), weight-read floor %.2f ms (%.1f GB at 4.3 TB/s): %.0f%% "
                  "of the floor's speed\n", r["itl_ms_p50"].get<double>(), floor_ms,
                  double((*runner)->model().weight_bytes()) / 1e9, 100.0 * floor_ms / r["itl_ms_p50"].get<double>());
      figures["runs"].push_back(r);
      save();
    } else if (workload == "shared-prefix") {
      const std::vector<int32_t> prefix = random_tokens(args.prefix_len);
      std::vector<std::vector<int32_t>> prompts;
      for (int i = 0; i < args.prefix_requests; ++i) {
        std::vector<int32_t> p = prefix;
        const std::vector<int32_t> unique = random_tokens(args.prefix_input_len);
        p.insert(p.end(), unique.begin(), unique.end());
        prompts.push_back(std::move(p));
      }
      for (bool cache : {false, true}) {
        figures["runs"].push_back(run_engine(**runner, prompts, args, cache,
                                             cache ? "shared prefix, prefix cache on" : "shared prefix, prefix cache off",
                                             greedy, args.prefix_output_len, args.prefix_max_seconds));
        save();
      }
    } else if (workload == "zero-on-free") {
      std::vector<std::vector<int32_t>> prompts;
      for (int i = 0; i < args.num_requests; ++i) prompts.push_back(random_tokens(args.input_len));
      double best[2] = {0, 0};
      int64_t zeroed[2] = {0, 0};
      for (int rep = 0; rep < args.zero_reps; ++rep)
        for (int zero = 0; zero < 2; ++zero) {
          const TenancyChoice tenancy{args.zero_kv_blocks, true, zero == 1};
          nlohmann::json r = run_engine(**runner, prompts, args, true,
                                        fmt::format("zero-on-free {}, rep {}", zero ? "on" : "off", rep + 1), greedy,
                                        args.output_len, args.max_seconds, tenancy);
          best[zero] = std::max(best[zero], r["output_tok_per_s"].get<double>());
          zeroed[zero] = r["kv_blocks_zeroed"].get<int64_t>();
          figures["runs"].push_back(r);
          save();
        }
      const double cost = 100.0 * (best[0] - best[1]) / best[0];
      figures["zero_on_free"] = {{"best_off_tok_s", best[0]}, {"best_on_tok_s", best[1]}, {"cost_percent", cost},
                                 {"blocks_zeroed_per_run", zeroed[1]}, {"reps", args.zero_reps}};
      std::printf("[zero-cost] engine, %d requests of %d tenants (%d prompt + %d output tokens), %d KV blocks, "
                  "best of %d: zeroing off %.0f tok/s, on %.0f tok/s: cost %.2f%%, %lld blocks zeroed per run\n",
                  args.num_requests, args.num_requests, args.input_len, args.output_len, args.zero_kv_blocks,
                  args.zero_reps, best[0], best[1], cost, static_cast<long long>(zeroed[1]));
      save();
    } else if (workload == "evict") {
      struct EvictRun {
        std::string policy;
        int requests;
      };
      const int per_sequence_blocks = ((args.input_len + args.output_len) + (*runner)->block_size() - 1) /
                                      (*runner)->block_size();
      const int fit = (*runner)->num_blocks() / per_sequence_blocks;
      std::vector<EvictRun> plan;
      if (args.evict_runs.empty()) {
        plan = {{"none", args.num_requests}, {args.kv_compression, args.num_requests}};
      } else {
        std::stringstream list(args.evict_runs);
        for (std::string item; std::getline(list, item, ',');) {
          const size_t colon = item.find(':');
          if (colon == std::string::npos) die(invalid_argument_error("--evict-runs: '{}' is not policy:requests", item), "evict");
          const std::string count = item.substr(colon + 1);
          plan.push_back({item.substr(0, colon), count == "fit" ? fit : std::max(1, std::atoi(count.c_str()))});
        }
      }
      const std::vector<int32_t> shared = random_tokens(args.input_len);
      double full_tok_s = 0;
      int full_requests = 0;
      for (const EvictRun& run : plan) {
        runtime::KvCompressionConfig compression;
        // "none-detached": the full cache with the runner's score state detached from the model, as
        // before token eviction had scores on this device (eviction off must cost nothing).
        const bool detached = run.policy == "none-detached";
        (*runner)->model().set_kv_scores(detached ? nullptr : &(*runner)->kv_scores());
        // "<policy>-pass": the scored policy with the decode kernel's mass off (CudaModel::set_kernel_mass),
        // so every scoring step runs the separate scoring pass: the A/B of docs/KV_CACHE.md "Mass from the
        // decode kernel".
        const std::string pass_suffix = "-pass";
        const bool pass_only = run.policy.size() > pass_suffix.size() &&
                               run.policy.compare(run.policy.size() - pass_suffix.size(), pass_suffix.size(),
                                                  pass_suffix) == 0;
        const std::string policy_name =
            pass_only ? run.policy.substr(0, run.policy.size() - pass_suffix.size()) : run.policy;
        (*runner)->model().set_kernel_mass(!pass_only);
        const int64_t kernel_mass_before = (*runner)->model().kernel_mass_steps();
        const int64_t pass_before = (*runner)->model().scoring_pass_steps();
        auto policy = runtime::parse_kv_compression_policy(detached ? "none" : policy_name, "--evict-runs");
        if (!policy.ok()) die(policy.status(), "--evict-runs");
        compression.policy = *policy;
        if (compression.enabled()) {
          compression.budget = args.kv_budget;
          compression.sink_tokens = args.kv_sink_tokens;
          compression.window = args.kv_window;
        }
        if (Status valid = runtime::validate_kv_compression(compression, "--kv-"); !valid.ok()) die(valid, "evict");
        std::vector<std::vector<int32_t>> prompts;
        for (int i = 0; i < run.requests; ++i) prompts.push_back(args.evict_shared_prompt ? shared : random_tokens(args.input_len));
        const std::string label = compression.enabled()
                                      ? fmt::format("evict: {} budget {}, {} requests", run.policy, args.kv_budget, run.requests)
                                      : fmt::format("evict: full cache{}, {} requests", detached ? " (scores detached)" : "",
                                                    run.requests);
        nlohmann::json r = run_engine(**runner, prompts, args, args.evict_shared_prompt, label, greedy, args.output_len,
                                      args.max_seconds, {}, compression,
                                      args.evict_shared_prompt ? shared : std::vector<int32_t>{});
        const double step_ms = r["decode_step_ms"].get<double>();
        const double tok_s = step_ms > 0 ? r["decode_batch_mean"].get<double>() * 1e3 / step_ms : 0;
        r["decode_tok_per_s"] = tok_s;
        r["policy"] = run.policy;
        r["budget"] = compression.enabled() ? args.kv_budget : 0;
        r["fit_full_requests"] = fit;
        const int64_t kernel_mass_steps = (*runner)->model().kernel_mass_steps() - kernel_mass_before;
        const int64_t pass_steps = (*runner)->model().scoring_pass_steps() - pass_before;
        r["kernel_mass_steps"] = kernel_mass_steps;
        r["scoring_pass_steps"] = pass_steps;
        if (!compression.enabled() && !detached) {
          full_tok_s = tok_s;
          full_requests = run.requests;
        }
        const double ratio = full_tok_s > 0 ? tok_s / full_tok_s : 0;
        r["ratio_to_last_full"] = compression.enabled() ? ratio : 1.0;
        figures["runs"].push_back(r);
        std::printf("[evict] %s at %d requests of %d prompt + %d output tokens: decode-only %.0f tok/s (%.2f ms steps at "
                    "mean batch %.1f), %.0f output tok/s whole run, %lld compactions, scoring steps: %lld kernel mass, "
                    "%lld pass%s\n",
                    run.policy.c_str(), run.requests, args.input_len, args.output_len, tok_s, step_ms,
                    r["decode_batch_mean"].get<double>(), r["output_tok_per_s"].get<double>(),
                    static_cast<long long>(r["kv_compactions"].get<int64_t>()), static_cast<long long>(kernel_mass_steps),
                    static_cast<long long>(pass_steps),
                    compression.enabled() ? fmt::format(": {:.2f}x the full cache at {} requests", ratio, full_requests).c_str()
                                          : "");
        save();
      }
      (*runner)->model().set_kv_scores(&(*runner)->kv_scores());
      (*runner)->model().set_kernel_mass(true);
      figures["evict"] = {{"fit_full_requests", fit}, {"budget", args.kv_budget}, {"input_len", args.input_len},
                          {"shared_prompt", args.evict_shared_prompt}};
      save();
    } else if (workload == "sampler") {
      figures["sampler"] = bench_sampler(args.max_num_seqs, config->vocab_size, args.temperature, args.top_p);
      save();
    }
  }
  if (!args.json_out.empty()) std::ofstream(args.json_out) << figures.dump(2) << "\n";
  return 0;
}
