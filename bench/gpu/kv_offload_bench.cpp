// pagoda_kv_offload_bench: the host KV tier on the GPU (issue #18).
//
//   transfers   host<->device copy rate per direction (and both at once) at
//               1, 16 and 256 blocks of ~2 MB (Llama-3-8B shape: bf16 blocks of
//               16 tokens, fp8 blocks of 32) and the engine's fp8 blocks of 16,
//               through CudaHostKvPool as the runner uses it, for each copy
//               method (--methods: the copy kernel, the kernel issued layer by
//               layer, a device staging buffer with whole-chunk DMA, staging for
//               one direction and the kernel for the other,
//               cudaMemcpyBatchAsync, one cudaMemcpyAsync per piece), each
//               checked byte for byte first
//   multiturn   the multi-turn chat workload (bench/engine/multi_turn_workload.h)
//               on the Llama-3-8B shape with random weights, whose working set
//               is 3x the device pool: host tier (loads layer by layer, or
//               whole) vs device pool only, and the bound: a device pool that
//               holds the whole working set (device-all); at each of
//               --concurrency's in-flight counts
//   swap        preemption by swap vs recompute under memory pressure
//
// One runner (one model, one device pool, one pinned host pool) serves every
// run; each run sees the first N blocks of each pool (PoolView) and gets a
// fresh KV manager and engine.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include "../engine/multi_turn_workload.h"
#include "pagoda/backend/cuda/cuda_host_kv_pool.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/delegating_model_runner.h"

namespace {

using namespace pagoda;
using runtime::BlockTransfer;
using runtime::TransferDirection;

[[noreturn]] void die(const Status& s, const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

// The runner seen with fewer device blocks and host blocks than it holds (ids
// below those counts are valid in the real pools), timing on the engine
// thread what execute() and transfer_blocks() take (the latter only queues
// the copies; the forward after it waits for them on the GPU).
class PoolView final : public runtime::DelegatingModelRunner {
 public:
  PoolView(runtime::ModelRunner& inner, int32_t device_blocks, int32_t host_blocks)
      : DelegatingModelRunner(inner), shape_(inner.kv_geometry()), host_blocks_(host_blocks) {
    shape_.num_blocks = device_blocks;
  }
  const KvPoolShape& kv_geometry() const override { return shape_; }
  runtime::RunnerCapabilities capabilities() const override {
    runtime::RunnerCapabilities c = DelegatingModelRunner::capabilities();
    c.host_kv_blocks = host_blocks_;
    return c;
  }
  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = inner().execute(batch, rows);
    execute_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  Status transfer_blocks(std::span<const BlockTransfer> transfers) override {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = inner().transfer_blocks(transfers);
    transfer_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++transfer_calls;
    return s;
  }
  double execute_s = 0, transfer_s = 0;
  int64_t transfer_calls = 0;

 private:
  KvPoolShape shape_;
  int32_t host_blocks_;
};

// ---- transfers ----------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median seconds of `reps` runs of `moves` (after 2 warm-ups), timed on the stream.
double time_transfers(cuda::CudaHostKvPool& host, const cuda::CudaKvPool& pool, const std::vector<BlockTransfer>& moves,
                      cudaStream_t stream, int reps, bool layered) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    cudaEventRecord(start, stream);
    Status s = ok_status();
    if (layered) {
      auto went = host.transfer_layered(moves, pool, stream);
      s = went.ok() ? host.wait_all(stream) : went.status();
    } else {
      s = host.transfer(moves, pool, stream);
    }
    if (!s.ok()) die(s, "transfer");
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (r >= 2) times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(times);
}

using Method = cuda::CudaHostKvPool::CopyMethod;
const char* method_name(Method m) {
  switch (m) {
    case Method::kKernel: return "copy kernel";
    case Method::kBatchedMemcpy: return "cudaMemcpyBatchAsync";
    case Method::kMemcpyPerPiece: return "cudaMemcpyAsync per piece";
    case Method::kStaged: return "staging + whole-chunk DMA";
  }
  return "?";
}

// A --methods entry: the method of each direction (out = device->host, in = host->device) and whether the
// copies are issued layer by layer.
struct MethodChoice {
  std::string name;
  Method out, in;
  bool layered = false;
};
MethodChoice method_choice(const std::string& name) {
  if (name == "kernel") return {name, Method::kKernel, Method::kKernel};
  if (name == "layered") return {name, Method::kKernel, Method::kKernel, true};
  if (name == "staged") return {name, Method::kStaged, Method::kStaged};
  if (name == "staged-out") return {name, Method::kStaged, Method::kKernel};
  if (name == "staged-in") return {name, Method::kKernel, Method::kStaged};
  if (name == "batched") return {name, Method::kBatchedMemcpy, Method::kBatchedMemcpy};
  if (name == "per-piece") return {name, Method::kMemcpyPerPiece, Method::kMemcpyPerPiece};
  die(invalid_argument_error("--methods: unknown method '{}'", name), "flags");
}
void apply(cuda::CudaHostKvPool& host, const MethodChoice& m) {
  host.set_copy_method(Method::kKernel);
  host.set_copy_method(TransferDirection::kDeviceToHost, m.out);
  host.set_copy_method(TransferDirection::kHostToDevice, m.in);
}

// Device block `block`, read back piece by piece.
std::vector<uint8_t> read_block(const cuda::CudaKvPool& pool, size_t block_bytes, int32_t block) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  std::vector<uint8_t> bytes(block_bytes);
  pool.append_block_copies(block, reinterpret_cast<std::byte*>(bytes.data()), true, dsts, srcs, sizes);
  for (size_t i = 0; i < dsts.size(); ++i) cudaMemcpy(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToHost);
  return bytes;
}

// Random device blocks 0..15 out to the host and back into 100..115: byte for byte?
bool round_trip_exact(cuda::CudaHostKvPool& host, const cuda::CudaKvPool& pool, cudaStream_t stream, bool layered) {
  // Random bytes over the whole pool, 8 at a time (xorshift: a GB in well under a second).
  std::vector<uint64_t> noise((pool.total_bytes() + 7) / 8);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& w : noise) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w = x;
  }
  cudaMemcpy(pool.layer(0).key, noise.data(), pool.total_bytes(), cudaMemcpyHostToDevice);
  std::vector<BlockTransfer> out, in;
  for (int32_t i = 0; i < 16; ++i) {
    out.push_back({TransferDirection::kDeviceToHost, i, 200 + i});
    in.push_back({TransferDirection::kHostToDevice, 100 + i, 200 + i});
  }
  if (layered) {
    if (!host.transfer_layered(out, pool, stream).ok() || !host.transfer_layered(in, pool, stream).ok() ||
        !host.wait_all(stream).ok())
      return false;
  } else if (!host.transfer(out, pool, stream).ok() || !host.transfer(in, pool, stream).ok()) {
    return false;
  }
  cudaStreamSynchronize(stream);
  for (int32_t i = 0; i < 16; ++i)
    if (read_block(pool, host.block_bytes(), i) != read_block(pool, host.block_bytes(), 100 + i)) return false;
  return cudaGetLastError() == cudaSuccess;
}

nlohmann::json bench_transfers(const ModelConfig& config, const std::vector<std::string>& methods,
                               bool* kernel_exact) {
  nlohmann::json out = nlohmann::json::array();
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  *kernel_exact = true;
  for (const auto& [dtype, block_size] :
       {std::pair{DType::kBF16, 16}, std::pair{DType::kFP8E4M3, 32}, std::pair{DType::kFP8E4M3, 16}}) {
    const int32_t blocks = 520;
    const KvPoolShape shape{config.num_layers, blocks, block_size, config.num_kv_heads, config.head_dim, dtype, dtype};
    auto pool = cuda::CudaKvPool::create(shape);
    if (!pool.ok()) die(pool.status(), "device pool");
    auto host = cuda::CudaHostKvPool::create(shape, blocks);
    if (!host.ok()) die(host.status(), "host pool");
    const double mb = (*host)->block_bytes() / 1e6;
    for (const std::string& method_text : methods) {
      const MethodChoice method = method_choice(method_text);
      apply(**host, method);
      const bool exact = round_trip_exact(**host, **pool, stream, method.layered);
      if (method.out == Method::kKernel || method.in == Method::kKernel) *kernel_exact &= exact;
      std::printf("transfers %s, blocks of %d tokens, %s: round trip %s\n", dtype_name(dtype).data(), block_size,
                  method.name.c_str(), exact ? "byte-exact" : "WRONG BYTES");
      const bool batched = method.out == Method::kBatchedMemcpy;
      for (int32_t n : {1, 16, 256}) {
        std::vector<BlockTransfer> d2h, h2d, both;
        for (int32_t i = 0; i < n; ++i) {
          d2h.push_back({TransferDirection::kDeviceToHost, i, i});
          h2d.push_back({TransferDirection::kHostToDevice, 260 + i, 260 + i});
        }
        both = d2h;
        both.insert(both.end(), h2d.begin(), h2d.end());
        const int reps = n >= 256 ? 5 : 20;
        const double bytes = static_cast<double>(n) * static_cast<double>((*host)->block_bytes());
        const double t_d2h = time_transfers(**host, **pool, d2h, stream, reps, method.layered);
        const double t_h2d = time_transfers(**host, **pool, h2d, stream, reps, method.layered);
        const double t_both = time_transfers(**host, **pool, both, stream, reps, method.layered);
        const bool batch_api = (*host)->batch_api_in_use();
        nlohmann::json r = {{"kv_dtype", dtype_name(dtype)},
                            {"round_trip_exact", exact},
                            {"batch_api_in_use", batched && batch_api},
                            {"block_size", block_size},
                            {"block_mb", mb},
                            {"pieces_per_block", (dtype == DType::kBF16 ? 2 : 4) * config.num_layers},
                            {"copies", method.name},
                            {"device_to_host_method", method_name(method.out)},
                            {"host_to_device_method", method_name(method.in)},
                            {"layer_by_layer", method.layered},
                            {"blocks", n},
                            {"device_to_host_gbps", bytes / t_d2h / 1e9},
                            {"host_to_device_gbps", bytes / t_h2d / 1e9},
                            {"both_ways_gbps", 2 * bytes / t_both / 1e9},
                            {"device_to_host_ms", t_d2h * 1e3},
                            {"host_to_device_ms", t_h2d * 1e3},
                            {"both_ways_ms", t_both * 1e3}};
        std::printf("transfers %s, %d blocks of %.2f MB (%s%s): device->host %.1f GB/s (%.3f ms), host->device "
                    "%.1f GB/s (%.3f ms), both ways %.1f GB/s (%.3f ms)\n",
                    dtype_name(dtype).data(), n, mb, method.name.c_str(),
                    batched && !batch_api ? ", REFUSED: per piece" : "",
                    bytes / t_d2h / 1e9, t_d2h * 1e3, bytes / t_h2d / 1e9, t_h2d * 1e3, 2 * bytes / t_both / 1e9,
                    t_both * 1e3);
        out.push_back(r);
      }
    }
  }
  cudaStreamDestroy(stream);
  return out;
}

// ---- engine runs ----------------------------------------------------------------

struct EngineRun {
  std::unique_ptr<bench::TimelineLog> timelines = std::make_unique<bench::TimelineLog>();
  std::unique_ptr<PoolView> view;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<engine::Engine> engine;
};

EngineRun make_engine(cuda::CudaModelRunner& runner, int32_t device_blocks, int32_t host_blocks,
                      engine::PreemptionMode mode, int32_t max_running, int32_t max_tokens_per_step,
                      int32_t prefill_join_limit = 0) {
  EngineRun e;
  e.view = std::make_unique<PoolView>(runner, device_blocks, host_blocks);
  kv::KvCacheConfig kc;
  kc.num_blocks = device_blocks;
  kc.block_size = runner.block_size();
  kc.num_host_blocks = host_blocks;
  kc.record_events = false;
  e.kv = std::move(kv::KvCacheManager::create(kc)).value();
  engine::EngineConfig ec;
  ec.scheduler.max_running_sequences = max_running;
  ec.scheduler.max_tokens_per_step = max_tokens_per_step;
  ec.scheduler.preemption_mode = mode;
  ec.scheduler.prefill_join_limit = prefill_join_limit;
  ec.max_queued_requests = 100000;
  ec.timeline_sink = e.timelines->sink();
  auto created = engine::Engine::create(ec, *e.view, *e.kv);
  if (!created.ok()) die(created.status(), "engine");
  e.engine = std::move(*created);
  e.engine->start();
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, json_out, kv_dtype_text = "fp8";
  std::vector<std::string> parts = {"transfers", "multiturn", "swap"};
  bench::MultiTurnConfig c;
  // In flight at the last turn: concurrency x turns x (user + output) tokens, kept well under the
  // device pool (a third of the working set) so the pool is the cache under test, not swap space.
  c.conversations = 32;
  c.turns = 6;
  c.user_tokens = 1024;
  c.output_tokens = 32;
  c.concurrency = 4;
  // Short prompts, long replies: admission lets in more than the pool can grow, so decoding preempts.
  int32_t pressure_requests = 64, pressure_input = 1024, pressure_output = 512, max_tokens_per_step = 8192;
  double max_seconds = 45, device_fraction = 1.0 / 3.0;
  std::vector<std::string> multiturn_runs = {"host-kernel", "device"};
  std::vector<std::string> methods = {"kernel", "layered", "staged", "staged-out", "staged-in"};
  double host_fraction = 1.25;
  CLI::App app{"pagoda_kv_offload_bench: the host KV tier on the GPU"};
  app.add_option("--config", config_path, "config.json (random bf16 weights made on the GPU)")->required();
  app.add_option("--only", parts, "transfers, multiturn, swap (comma-separated)")->delimiter(',');
  app.add_option("--kv-cache-dtype", kv_dtype_text, "KV dtype of the engine runs");
  app.add_option("--conversations", c.conversations);
  app.add_option("--turns", c.turns);
  app.add_option("--user-tokens", c.user_tokens);
  app.add_option("--output-tokens", c.output_tokens);
  std::vector<int32_t> concurrencies;
  app.add_option("--concurrency", concurrencies, "requests in flight; a list runs every run at each")->delimiter(',');
  app.add_option("--device-fraction", device_fraction, "device pool / multi-turn working set");
  app.add_option("--pressure-requests", pressure_requests);
  app.add_option("--pressure-input", pressure_input);
  app.add_option("--pressure-output", pressure_output);
  app.add_option("--max-seconds", max_seconds, "cap per engine run");
  app.add_option("--multiturn-runs", multiturn_runs,
                 "host-kernel (loads layer by layer, the copy kernel's grid uncapped), host-capped (the same, "
                 "its grid capped at --copy-ctas: the runner's default), host-whole (whole loads), host-staged (staging + DMA both ways), "
                 "host-staged-out, host-batched, device, device-all (a device pool holding the whole working "
                 "set: the bound) (in order)")->delimiter(',');
  app.add_option("--methods", methods, "transfer methods: kernel, layered, staged, staged-out, staged-in, batched, "
                 "per-piece")->delimiter(',');
  app.add_option("--host-fraction", host_fraction, "host tier / multi-turn working set");
  int32_t prefill_join_limit = 0;
  app.add_option("--prefill-join-limit", prefill_join_limit,
                 "multi-turn runs: SchedulerConfig::prefill_join_limit (0: none; e.g. 512: requests arriving "
                 "together start one step after another)");
  int32_t copy_ctas = 32;
  app.add_option("--copy-ctas", copy_ctas, "the host-capped run's copy-kernel grid cap (CTAs per launch)");
  app.add_option("--json", json_out);
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (concurrencies.empty()) concurrencies.push_back(c.concurrency);
  for (int32_t n : concurrencies)
    if (n <= 0) die(invalid_argument_error("--concurrency {}: must be positive", n), "flags");
  c.concurrency = *std::max_element(concurrencies.begin(), concurrencies.end());
  const bool want_device_all =
      std::find(multiturn_runs.begin(), multiturn_runs.end(), "device-all") != multiturn_runs.end();
  auto has = [&](const char* p) { return std::find(parts.begin(), parts.end(), p) != parts.end(); };

  std::ifstream in(config_path);
  auto config = parse_model_config(nlohmann::json::parse(in, nullptr, false), config_path);
  if (!config.ok()) die(config.status(), "config");
  nlohmann::json figures = {{"config", config_path}, {"runs", nlohmann::json::array()}};
  auto save = [&] {
    if (!json_out.empty()) std::ofstream(json_out) << figures.dump(2) << "\n";
  };
  bool kernel_exact = true;
  if (has("transfers")) {
    figures["transfers"] = bench_transfers(*config, methods, &kernel_exact);
    save();
  }
  if (!has("multiturn") && !has("swap")) return 0;

  // One runner: device pool for the larger of the two workloads, host pool likewise.
  const auto kv_dtype = dtype_from_name(kv_dtype_text);
  if (!kv_dtype) die(invalid_argument_error("--kv-cache-dtype {}", kv_dtype_text), "flags");
  const int32_t block_size = 16;
  const int64_t ws = c.working_set_tokens();
  const int32_t mt_device = static_cast<int32_t>(ws * device_fraction / block_size);
  // The bound's pool: every conversation's history plus the last turn's prompts and replies in flight.
  const int32_t mt_all = static_cast<int32_t>(ws / block_size) + c.concurrency * (c.turns + 2);
  const int32_t mt_host = static_cast<int32_t>(ws * host_fraction / block_size);
  const int32_t pr_device =
      static_cast<int32_t>(static_cast<int64_t>(pressure_requests) * (pressure_input + pressure_output) / 3 / block_size);
  const int32_t pr_host = 3 * pr_device;
  cuda::CudaModelOptions options;
  options.max_num_seqs = std::max(c.concurrency, pressure_requests);
  options.max_num_tokens = max_tokens_per_step;
  options.kv_key_dtype = options.kv_value_dtype = *kv_dtype;
  // Random weights: the context may run past the config's trained length (8 turns of 1,032 tokens do).
  options.max_model_len = std::max(c.turns * (c.user_tokens + c.output_tokens), pressure_input + pressure_output) + 64;
  options.show_progress = false;
  auto model = cuda::CudaModel::create_random(*config, 1, options);
  if (!model.ok()) die(model.status(), "model");
  cuda::CudaRunnerOptions runner_options;
  runner_options.num_blocks = std::max({mt_device, pr_device, want_device_all ? mt_all : 0});
  runner_options.num_host_blocks = std::max(mt_host, pr_host);
  const auto pin_start = std::chrono::steady_clock::now();
  auto runner = cuda::CudaModelRunner::create(std::move(model).value(), runner_options);
  if (!runner.ok()) die(runner.status(), "runner");
  const double pin_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - pin_start).count();
  const double per_token = static_cast<double>((*runner)->kv_geometry().bytes_per_token());
  std::printf("runner: %s KV, %.0f B/token; device pool %d blocks (%.2f GB), pinned host pool %d blocks (%.2f GB, "
              "made in %.1f s)\n", kv_dtype_text.c_str(), per_token, runner_options.num_blocks,
              runner_options.num_blocks * block_size * per_token / 1e9, runner_options.num_host_blocks,
              runner_options.num_host_blocks * block_size * per_token / 1e9, pin_s);
  figures["kv_cache_dtype"] = kv_dtype_text;
  figures["bytes_per_token"] = per_token;
  c.vocab_size = config->vocab_size;
  c.max_seconds = max_seconds;

  if (has("multiturn")) {
    std::printf("multi-turn: working set %lld tokens (%.2f GB); device pool %d blocks = %.2fx of it; host tier %d "
                "blocks\n", static_cast<long long>(ws), ws * per_token / 1e9, mt_device,
                static_cast<double>(mt_device) * block_size / static_cast<double>(ws), mt_host);
    for (const int32_t concurrency : concurrencies)
    for (const std::string& run : multiturn_runs) {
      c.concurrency = concurrency;
      const bool tier = run != "device" && run != "device-all";
      const int32_t device_blocks = run == "device-all" ? mt_all : mt_device;
      const Method method = run == "host-batched" ? Method::kBatchedMemcpy : Method::kKernel;
      if (tier && method == Method::kKernel && !kernel_exact) {
        std::printf("multi-turn, %s: skipped, the copy kernel's round trip was not exact\n", run.c_str());
        continue;
      }
      (*runner)->host_pool()->set_copy_method(method);
      if (run == "host-staged-out")
        (*runner)->host_pool()->set_copy_method(TransferDirection::kDeviceToHost, Method::kStaged);
      if (run == "host-staged") (*runner)->host_pool()->set_copy_method(Method::kStaged);
      (*runner)->set_layer_by_layer(run != "host-whole");
      (*runner)->host_pool()->set_copy_kernel_ctas(run == "host-capped" ? copy_ctas : 0);
      const int64_t layered_before = (*runner)->host_pool()->layered_calls();
      EngineRun e = make_engine(**runner, device_blocks, tier ? mt_host : 0,
                                tier ? engine::PreemptionMode::kSwap : engine::PreemptionMode::kRecompute,
                                c.concurrency, max_tokens_per_step, prefill_join_limit);
      const runtime::TransferStats base = (*runner)->transfer_stats();
      const std::string label = fmt::format("multi-turn, {} in flight, {}", concurrency,
                                            tier                ? "host tier (" + run + ")"
                                            : run == "device"   ? std::string("device pool only")
                                                                : std::string("device pool holding everything"));
      nlohmann::json r = bench::run_multi_turn(*e.engine, c, label, base, e.timelines.get());
      e.engine->shutdown(std::chrono::milliseconds(0));
      r["device_blocks"] = device_blocks;
      r["host_blocks"] = tier ? mt_host : 0;
      r["engine_thread_execute_s"] = e.view->execute_s;
      r["engine_thread_transfer_s"] = e.view->transfer_s;
      r["transfer_calls"] = e.view->transfer_calls;
      r["layered_transfer_calls"] = (*runner)->host_pool()->layered_calls() - layered_before;
      r["run"] = run;
      r["prefill_join_limit"] = prefill_join_limit;
      r["copy_kernel_ctas"] = (*runner)->host_pool()->copy_kernel_ctas();
      std::printf("  engine thread: %.2f s in execute, %.3f s queueing %lld transfer calls (%lld layer by layer)\n",
                  e.view->execute_s, e.view->transfer_s, static_cast<long long>(e.view->transfer_calls),
                  static_cast<long long>((*runner)->host_pool()->layered_calls() - layered_before));
      figures["runs"].push_back(r);
      save();
    }
    (*runner)->host_pool()->set_copy_method(kernel_exact ? Method::kKernel : Method::kBatchedMemcpy);
    (*runner)->set_layer_by_layer(true);
    (*runner)->host_pool()->set_copy_kernel_ctas(runner_options.copy_kernel_ctas);
  }
  if (has("swap")) {
    std::printf("pressure: %d requests x (%d + %d) tokens at once into %d device blocks (a third)\n", pressure_requests,
                pressure_input, pressure_output, pr_device);
    for (engine::PreemptionMode mode : {engine::PreemptionMode::kSwap, engine::PreemptionMode::kRecompute}) {
      const bool swap = mode == engine::PreemptionMode::kSwap;
      EngineRun e = make_engine(**runner, pr_device, swap ? pr_host : 0, mode, pressure_requests, max_tokens_per_step);
      const runtime::TransferStats base = (*runner)->transfer_stats();
      nlohmann::json r = bench::run_pressure(*e.engine, pressure_requests, pressure_input, pressure_output,
                                             config->vocab_size,
                                             std::string("pressure, preemption by ") +
                                                 std::string(engine::preemption_mode_name(mode)),
                                             max_seconds, base);
      e.engine->shutdown(std::chrono::milliseconds(0));
      figures["runs"].push_back(r);
      save();
    }
  }
  save();
  return 0;
}
