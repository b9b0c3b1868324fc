#pragma once
// One place that turns the model, device and KV cache flags of `pagoda generate`
// and `pagoda serve` into a ModelRunner plus the geometry the engine's KV
// manager and scheduler must be built with, on the CPU reference backend or
// (when compiled in) the CUDA backend.
//
//   RunnerFlags flags;
//   add_runner_flags(*cmd, flags, RunnerCommand::kServe);     // registers --device, --kv-cache-dtype, ...
//   ... in the command's callback:
//   auto setup = create_model_runner(flags, RunnerRequirements{});
//   std::fprintf(stderr, "%s", setup->report.c_str());          // the start-up report
//   kv::KvCacheManager::create(setup->kv_cache_config(prefix_cache));
//
// Every flag is checked (resolve_runner_flags) before anything is loaded; an
// error names the flag and the bad value, e.g. "--kv-cache-dtype int3: expected
// one of auto, f32, bf16, fp8, int8, int4". Errors from the backends (no GPU, a
// KV dtype a pool cannot store yet) come back with the flag that asked for them.
//
// Thread safety: plain functions; call from one thread at start-up.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/engine/model_runner.h"
#include "pagoda/engine/scheduler.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/model/model_config.h"

namespace pagoda::cli {

enum class Device { kCpu, kCuda };
enum class LoadFormat {
  kAuto,    // config.json + safetensors from --model
  kRandom,  // config.json only; random weights (bf16 on the GPU, f32 on the CPU)
};
std::string_view device_name(Device device);

// The raw flag values, as CLI11 fills them. Strings are checked by resolve_runner_flags.
struct RunnerFlags {
  std::string model;        // --model: checkpoint directory; with random weights also a config.json file
  std::string config_file;  // --config: config.json for --load-format random (instead of --model)
  std::string device = "cpu";
  std::string load_format = "auto";
  std::string kv_cache_dtype = "auto";
  std::string kv_cache_dtype_k;  // empty: --kv-cache-dtype
  std::string kv_cache_dtype_v;
  int32_t block_size = 16;
  std::string kv_cache_memory;  // bytes ("256MiB"); empty: the command's default
  double gpu_memory_utilization = 0.9;
  int32_t max_num_seqs = 0;         // not given (and 0): the device's default
  int32_t max_tokens_per_step = 0;  // not given (and 0): the device's default
  int32_t max_model_len = 0;        // 0: config.json's max_position_embeddings
  uint64_t weight_seed = 0;         // --load-format random

  // Set by add_runner_flags: tells a flag given on the command line from its default.
  const CLI::Option* gpu_memory_utilization_option = nullptr;
  const CLI::Option* kv_cache_memory_option = nullptr;
  const CLI::Option* max_num_seqs_option = nullptr;
  const CLI::Option* max_tokens_per_step_option = nullptr;
};

enum class RunnerCommand { kGenerate, kServe };

// Registers the shared flags (with --help texts) on `cmd`; `flags` must outlive it.
// generate gets no --max-num-seqs / --max-tokens-per-step (one sequence).
void add_runner_flags(CLI::App& cmd, RunnerFlags& flags, RunnerCommand command);

// The flags, checked and with the device's defaults filled in.
struct ResolvedRunnerFlags {
  Device device = Device::kCpu;
  LoadFormat load_format = LoadFormat::kAuto;
  std::string model_dir;    // directory of the checkpoint (tokenizer.json, chat template); empty for a bare config file
  std::string config_path;  // config.json that defines the model
  DType key_dtype = DType::kF32;
  DType value_dtype = DType::kF32;
  int32_t block_size = 16;
  int64_t kv_cache_memory = 0;  // > 0: a pool of this many bytes; 0: see RunnerRequirements / utilization
  double gpu_memory_utilization = 0.9;
  int32_t max_num_seqs = 64;
  int32_t max_tokens_per_step = 512;
  int32_t max_model_len = 0;
  uint64_t weight_seed = 0;
};

StatusOr<ResolvedRunnerFlags> resolve_runner_flags(const RunnerFlags& flags, RunnerCommand command);

// What the command needs beyond the flags.
struct RunnerRequirements {
  // generate: the sequence's prompt + output tokens. Without --kv-cache-memory the
  // CPU pool is exactly this big; on either device a smaller pool is an error.
  int64_t min_kv_tokens = 0;
  // > 0 (generate): the longest sequence that will run, so the CUDA model sizes
  // its block tables and scratch for it rather than for the whole context.
  int32_t sequence_tokens = 0;
  // generate: the prompt runs in one forward of this many tokens.
  int32_t prompt_tokens = 0;
  bool show_progress = true;  // the CUDA weight-upload progress bar on stderr
  // Progress lines while loading (checkpoint files, conversions); null: quiet.
  std::function<void(const std::string&)> progress;
};

struct ModelRunnerSetup {
  std::unique_ptr<engine::ModelRunner> runner;
  ResolvedRunnerFlags flags;
  ModelConfig config;        // as run (--max-model-len applied)
  int32_t max_model_len = 0;  // longest sequence: the context, or RunnerRequirements::sequence_tokens
  int32_t num_blocks = 0;    // of the runner's KV pool; the KV manager must use these
  int32_t block_size = 0;
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;  // K + V over all layers, scales included
  std::string report;        // the start-up report: a few lines, each ending in '\n'

  int64_t kv_pool_tokens() const { return static_cast<int64_t>(num_blocks) * block_size; }
  // Requests of max_model_len tokens the pool holds at once.
  int64_t max_concurrent_full_requests() const;
  kv::KvCacheConfig kv_cache_config(bool enable_prefix_cache) const;
  engine::SchedulerConfig scheduler_config() const;
};

// Loads (or makes) the model on the chosen device and allocates its KV pool.
// kOutOfRange: requirements.sequence_tokens exceeds the context (before any load).
StatusOr<ModelRunnerSetup> create_model_runner(const ResolvedRunnerFlags& flags,
                                               const RunnerRequirements& requirements);

}  // namespace pagoda::cli
