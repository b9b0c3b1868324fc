// pagoda_multi_turn_bench: the host KV tier on the CPU (issue #18), scaled
// down: a multi-turn chat workload (multi_turn_workload.h) whose working set
// is a few times the device pool, run with a host tier and without one; then
// preemption by swap against recompute under memory pressure. The model is
// the bundled models/pagoda-tiny (real weights) unless --model says otherwise.
//
//   pagoda_multi_turn_bench [--model models/pagoda-tiny] [--kv-cache-dtype f32] [--json out.json]

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "multi_turn_workload.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace {

using namespace pagoda;

[[noreturn]] void die(const Status& s, const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

struct Setup {
  std::unique_ptr<bench::TimelineLog> timelines = std::make_unique<bench::TimelineLog>();
  std::unique_ptr<CpuModelRunner> runner;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<engine::Engine> engine;
};

Setup make(const std::shared_ptr<CpuModel>& model, DType dtype, int32_t block_size, int32_t device_blocks,
           int32_t host_blocks, engine::PreemptionMode mode, int32_t max_running) {
  Setup s;
  auto runner = CpuModelRunner::create(model, device_blocks, block_size, dtype, dtype, host_blocks);
  if (!runner.ok()) die(runner.status(), "runner");
  s.runner = std::move(*runner);
  kv::KvCacheConfig kc;
  kc.num_blocks = device_blocks;
  kc.block_size = block_size;
  kc.num_host_blocks = host_blocks;
  kc.record_events = false;
  s.kv = std::move(kv::KvCacheManager::create(kc)).value();
  engine::EngineConfig ec;
  ec.scheduler.max_running_sequences = max_running;
  ec.scheduler.max_tokens_per_step = 512;
  ec.scheduler.preemption_mode = mode;
  ec.max_queued_requests = 4096;
  ec.timeline_sink = s.timelines->sink();
  auto created = engine::Engine::create(ec, *s.runner, *s.kv);
  if (!created.ok()) die(created.status(), "engine");
  s.engine = std::move(*created);
  s.engine->start();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = std::string(PAGODA_SOURCE_DIR) + "/models/pagoda-tiny", dtype_name_text = "f32", json_out;
  bench::MultiTurnConfig c;
  c.concurrency = 4;  // in flight at the last turn: 4 x 480 tokens, under the device pool (a third of 7,680)
  int32_t block_size = 16, pressure_requests = 32, pressure_input = 128, pressure_output = 96;
  double device_fraction = 1.0 / 3.0;
  CLI::App app{"pagoda_multi_turn_bench: the host KV tier on the CPU, with and without"};
  app.add_option("--model", model_dir);
  app.add_option("--kv-cache-dtype", dtype_name_text, "f32, bf16, fp8, int8, int4");
  app.add_option("--block-size", block_size);
  app.add_option("--conversations", c.conversations);
  app.add_option("--turns", c.turns);
  app.add_option("--user-tokens", c.user_tokens);
  app.add_option("--output-tokens", c.output_tokens);
  app.add_option("--concurrency", c.concurrency);
  app.add_option("--device-fraction", device_fraction, "device pool / working set");
  app.add_option("--pressure-requests", pressure_requests);
  app.add_option("--json", json_out);
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  auto loaded = CpuModel::load(model_dir);
  if (!loaded.ok()) die(loaded.status(), "model");
  std::shared_ptr<CpuModel> model(std::move(*loaded));
  auto dtype = dtype_from_name(dtype_name_text);
  if (!dtype) die(invalid_argument_error("--kv-cache-dtype {}", dtype_name_text), "flags");
  c.vocab_size = model->config().vocab_size;

  const int64_t ws = c.working_set_tokens();
  const int32_t device_blocks = static_cast<int32_t>(ws * device_fraction / block_size) + 1;
  const int32_t host_blocks = static_cast<int32_t>(ws * 1.25 / block_size) + 1;
  std::printf("multi-turn: %d conversations x %d turns x (%d + %d) tokens = working set %lld tokens; device pool %d "
              "blocks (%lld tokens, %.2fx the working set), host tier %d blocks; %s KV, block size %d\n",
              c.conversations, c.turns, c.user_tokens, c.output_tokens, static_cast<long long>(ws), device_blocks,
              static_cast<long long>(device_blocks) * block_size,
              static_cast<double>(device_blocks) * block_size / static_cast<double>(ws), host_blocks,
              dtype_name_text.c_str(), block_size);
  nlohmann::json figures = {{"model", model_dir}, {"kv_cache_dtype", dtype_name_text}, {"block_size", block_size},
                            {"device_blocks", device_blocks}, {"host_blocks", host_blocks}, {"runs", nlohmann::json::array()}};
  {
    Setup none = make(model, *dtype, block_size, device_blocks, 0, engine::PreemptionMode::kRecompute, c.concurrency);
    figures["runs"].push_back(bench::run_multi_turn(*none.engine, c, "multi-turn, device pool only", {}, none.timelines.get()));
  }
  {
    Setup tiered =
        make(model, *dtype, block_size, device_blocks, host_blocks, engine::PreemptionMode::kSwap, c.concurrency);
    figures["runs"].push_back(bench::run_multi_turn(*tiered.engine, c, "multi-turn, device pool + host tier", {}, tiered.timelines.get()));
  }
  {
    const int32_t all = static_cast<int32_t>(ws / block_size) + 2 * c.conversations;
    Setup roomy = make(model, *dtype, block_size, all, 0, engine::PreemptionMode::kRecompute, c.concurrency);
    figures["runs"].push_back(bench::run_multi_turn(*roomy.engine, c, "multi-turn, device pool holds everything", {}, roomy.timelines.get()));
  }
  // Preemption under pressure: the pool holds about a third of what runs at once.
  const int32_t pressure_blocks =
      static_cast<int32_t>(static_cast<int64_t>(pressure_requests) * (pressure_input + pressure_output) / 3 / block_size);
  for (engine::PreemptionMode mode : {engine::PreemptionMode::kRecompute, engine::PreemptionMode::kSwap}) {
    Setup s = make(model, *dtype, block_size, pressure_blocks,
                   mode == engine::PreemptionMode::kSwap ? 4 * pressure_blocks : 0, mode, pressure_requests);
    figures["runs"].push_back(bench::run_pressure(*s.engine, pressure_requests, pressure_input, pressure_output,
                                                  c.vocab_size,
                                                  std::string("pressure, preemption by ") +
                                                      std::string(engine::preemption_mode_name(mode))));
  }
  if (!json_out.empty()) std::ofstream(json_out) << figures.dump(2) << "\n";
  return 0;
}
