#pragma once
// The model, device and KV cache flags that `pagoda generate`, `serve` and
// `eval` share, and their checking into a backend::RunnerSpec. Flags only: the
// backends load models, size pools and write reports (backend/registry.h).
//
//   RunnerFlags flags;
//   add_runner_flags(*cmd, flags, RunnerCommand::kServe);   // registers --device, --kv-cache-dtype, ...
//   ... in the command's callback:
//   auto spec = resolve_runner_flags(flags, RunnerCommand::kServe);
//   auto setup = backend::create_model_runner(*spec, {});
//   auto kv = kv::KvCacheManager::create(kv_cache_config(*setup, prefix_cache));
//
// Every flag is checked (resolve_runner_flags) before anything is loaded; an
// error names the flag and the bad value, e.g. "--kv-cache-dtype int3: expected
// one of auto, f32, bf16, fp8, int8, int4".
//
// Thread safety: plain functions; call from one thread at start-up.

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"
#include "pagoda/engine/overlap_steps.h"
#include "pagoda/engine/scheduler.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::cli {

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
  std::string kv_offload_memory = "0";  // bytes of the host tier ("64GiB"); "0": none
  std::string preemption_mode;          // swap or recompute; empty: swap with a host tier
  double gpu_memory_utilization = 0.9;
  int32_t max_num_seqs = 0;         // not given (and 0): the device's default
  int32_t max_tokens_per_step = 0;  // not given (and 0): the device's default
  int32_t prefill_join_limit = 0;   // serve: SchedulerConfig::prefill_join_limit (0: none)
  int32_t max_prompt_rows_per_step = 0;  // serve: SchedulerConfig::max_prompt_rows_per_step (0: the device's)
  std::string overlap_steps = "auto";  // EngineConfig::overlap_steps: auto, on, off
  int32_t max_model_len = 0;        // 0: config.json's max_position_embeddings
  uint64_t weight_seed = 0;         // --load-format random
  std::string quantization;         // --quantization: empty/none, int8, int4 or fp8 (CPU only)
  int32_t tensor_parallel_size = 1; // --tensor-parallel-size
  bool tensor_parallel_same_device = false;  // --tensor-parallel-same-device (hidden; tests)
  int32_t kv_cross_layer_share = 1; // --kv-cross-layer-share K (runtime/cross_layer_share.h)

  // Set by add_runner_flags: tells a flag given on the command line from its default.
  const CLI::Option* gpu_memory_utilization_option = nullptr;
  const CLI::Option* kv_cache_memory_option = nullptr;
  const CLI::Option* max_num_seqs_option = nullptr;
  const CLI::Option* max_tokens_per_step_option = nullptr;
  const CLI::Option* max_prompt_rows_per_step_option = nullptr;
};

enum class RunnerCommand { kGenerate, kServe };

// Registers the shared flags (with --help texts) on `cmd`; `flags` must outlive it.
// generate gets no --max-num-seqs / --max-tokens-per-step (one sequence).
void add_runner_flags(CLI::App& cmd, RunnerFlags& flags, RunnerCommand command);

// The flags, checked and with the device's defaults filled in.
StatusOr<backend::RunnerSpec> resolve_runner_flags(const RunnerFlags& flags, RunnerCommand command);

// --quantization TEXT on `device`: none (or empty) -> nullopt; int8 / int4 on
// the CPU -> kInt8 / kInt4; anything else, or int8/int4 on cuda, an error naming the flag.
StatusOr<std::optional<DType>> parse_weight_quantization(const std::string& text, backend::Device device);

// Registers --tensor-parallel-size on cmd (generate, serve, eval).
void add_tensor_parallel_flag(CLI::App& cmd, int32_t& value);
// --tensor-parallel-size N: kInvalidArgument naming the flag when N < 1.
Status check_tensor_parallel_size(int32_t value);

// Registers --quantization on cmd (generate, serve, eval).
void add_quantization_flag(CLI::App& cmd, std::string& value);

// --kv-cross-layer-share (generate, serve, eval), into `value`.
void add_cross_layer_share_flag(CLI::App& cmd, int32_t& value);

// --kv-offload-memory and --preemption-mode alone, for a command with flags of
// its own (eval); add_runner_flags registers them too.
void add_host_tier_flags(CLI::App& cmd, std::string& kv_offload_memory, std::string& preemption_mode);
// --kv-offload-memory's bytes (empty or "0": no tier); errors name the flag.
StatusOr<int64_t> parse_kv_offload_memory(const std::string& value);
// --preemption-mode given whether there is a host tier (see resolve_preemption_mode).
StatusOr<engine::PreemptionMode> parse_preemption_mode(const std::string& mode, bool host_tier);

// --preemption-mode, checked against the host tier the spec asks for:
// default swap with a host tier (--kv-offload-memory), recompute without;
// swap without a host tier is an error naming both flags.
StatusOr<engine::PreemptionMode> resolve_preemption_mode(const RunnerFlags& flags, const backend::RunnerSpec& spec);

// The KV manager and scheduler settings that match a runner (its host tier included).
kv::KvCacheConfig kv_cache_config(const backend::RunnerSetup& setup, bool enable_prefix_cache);
// --overlap-steps as the engine's setting.
engine::OverlapSteps overlap_steps(const RunnerFlags& flags);
// --max-prompt-rows-per-step, or the default when not given: 512 where the runner scores rows where the
// logits are (RunnerCapabilities::scores_on_device: a row costs its lm_head row and a 168-byte score,
// docs/BENCHMARKS.md "Scoring prompts"), else 128 (each row's logits go to the engine).
int32_t max_prompt_rows_per_step(const RunnerFlags& flags, bool scores_on_device);
engine::SchedulerConfig scheduler_config(const backend::RunnerSetup& setup,
                                         engine::PreemptionMode preemption = engine::PreemptionMode::kRecompute);

}  // namespace pagoda::cli
