#include "pagoda/cli/runner_flags.h"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::cli {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kMaxBlockSize = 256;  // the KV manager's limit
constexpr const char* kDefaultServeCpuKvMemory = "256MiB";
constexpr int32_t kCpuDefaultMaxNumSeqs = 64, kCpuDefaultMaxTokensPerStep = 512;
// vLLM's defaults on a GPU; the CUDA model sizes its scratch and graph buckets from them.
constexpr int32_t kCudaDefaultMaxNumSeqs = 256, kCudaDefaultMaxTokensPerStep = 8192;
constexpr int32_t kHostScoringMaxPromptRowsPerStep = 128, kDeviceScoringMaxPromptRowsPerStep = 512;

bool given(const CLI::Option* option) { return option != nullptr && option->count() > 0; }

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

StatusOr<DType> parse_kv_dtype(const std::string& flag, const std::string& value, backend::Device device) {
  static constexpr std::array<std::pair<const char*, DType>, 6> kNames = {
      {{"f32", DType::kF32}, {"bf16", DType::kBF16}, {"f16", DType::kF16}, {"fp8", DType::kFP8E4M3},
       {"int8", DType::kInt8}, {"int4", DType::kInt4}}};
  if (value == "auto") return device == backend::Device::kCuda ? DType::kBF16 : DType::kF32;
  for (const auto& [name, dtype] : kNames) {
    if (value != name) continue;
    if (dtype == DType::kF16 && device == backend::Device::kCuda)
      return invalid_argument_error("{} f16: the cuda KV cache holds bf16, fp8, int8 or int4 (f16 is a cpu KV "
                                    "dtype); use bf16", flag);
    return dtype;
  }
  return invalid_argument_error("{} {}: expected one of auto, f32, bf16, f16, fp8, int8, int4 (auto: f32 on cpu, "
                                "bf16 on cuda; f16 on cpu only)", flag, value.empty() ? "''" : value);
}

}  // namespace

StatusOr<std::optional<DType>> parse_weight_quantization(const std::string& text, backend::Device device) {
  if (text.empty() || text == "none") return std::optional<DType>();
  if (text != "int8" && text != "int4" && text != "fp8")
    return invalid_argument_error("--quantization {}: expected none, int8, int4 or fp8", text);
  if (text == "fp8") return std::optional<DType>(DType::kFP8E4M3);
  if (device != backend::Device::kCpu)
    return invalid_argument_error("--quantization {}: int8/int4 weights run on the CPU backend only; with "
                                  "--device cuda use fp8 or leave it out", text);
  return std::optional<DType>(text == "int8" ? DType::kInt8 : DType::kInt4);
}

void add_tensor_parallel_flag(CLI::App& cmd, int32_t& value) {
  cmd.add_option("--tensor-parallel-size,--tp", value,
                 "Ranks the model is sharded over (Megatron-style: attention heads, MLP and vocabulary split, one "
                 "all-reduce after attention and after the MLP); on cpu the ranks are threads of this process, on "
                 "cuda one GPU each (docs/TENSOR_PARALLEL.md)")
      ->capture_default_str();
}

Status check_tensor_parallel_size(int32_t value) {
  if (value < 1) return invalid_argument_error("--tensor-parallel-size {}: must be at least 1", value);
  return ok_status();
}

void add_quantization_flag(CLI::App& cmd, std::string& value) {
  cmd.add_option("--quantization", value,
                 "Weights: none (as loaded), int8 (blocks of 32, f16 scale, like Q8_0; CPU), int4 (groups of 32, "
                 "f16 scale, like Q4_0; CPU) or fp8 (e4m3, one scale per output channel, activations quantized to "
                 "fp8 per token; CPU reference and GPU fp8 GEMMs), quantized at load from f32/f16/bf16");
}

void add_runner_flags(CLI::App& cmd, RunnerFlags& flags, RunnerCommand command) {
  cmd.add_option("--model", flags.model,
                 "Required: a Hugging Face model directory (config.json + safetensors [+ tokenizer.json]); with "
                 "--load-format random also a bare config.json file (or use --config)");
  cmd.add_option("--config", flags.config_file,
                 "config.json for --load-format random (the model's shape; no weights needed)");
  cmd.add_option("--device", flags.device,
                 "Where the model runs: cpu (the reference backend) or cuda (NVIDIA Hopper GPU, when compiled in: "
                 "see `pagoda --version`)")
      ->capture_default_str();
  cmd.add_option("--load-format", flags.load_format,
                 "auto: weights from the checkpoint in --model; random: random weights for the config.json's shape "
                 "(bf16 made on the GPU with --device cuda, f32 on the CPU), to benchmark real shapes without a "
                 "download")
      ->capture_default_str();
  cmd.add_option("--weight-seed", flags.weight_seed, "Seed of the --load-format random weights")->capture_default_str();
  add_quantization_flag(cmd, flags.quantization);
  add_tensor_parallel_flag(cmd, flags.tensor_parallel_size);
  // Hidden (no help group): tests run the cuda ranks on one GPU; not a serving mode.
  cmd.add_flag("--tensor-parallel-same-device", flags.tensor_parallel_same_device,
               "Tests only: every --device cuda rank on GPU 0 (same-device communicator)")
      ->group("");
  cmd.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "KV cache element type: auto (f32 on cpu, bf16 on cuda), f32, bf16, f16 (cpu), fp8 (e4m3, per-token-head "
                 "scale), int8 (per-token-head scale + zero), int4 (groups of 32); smaller types fit more tokens")
      ->capture_default_str();
  cmd.add_option("--kv-cache-dtype-k", flags.kv_cache_dtype_k, "Element type of the keys only (overrides --kv-cache-dtype)");
  cmd.add_option("--kv-cache-dtype-v", flags.kv_cache_dtype_v,
                 "Element type of the values only (overrides --kv-cache-dtype)");
  cmd.add_option("--block-size", flags.block_size, "Tokens per KV cache block")->capture_default_str();
  flags.kv_cache_memory_option = cmd.add_option(
      "--kv-cache-memory", flags.kv_cache_memory,
      command == RunnerCommand::kServe
          ? "Bytes of KV cache, e.g. 256MiB, 4GiB or 1e9 (cpu default 256MiB; on cuda it replaces "
            "--gpu-memory-utilization)"
          : "Bytes of KV cache, e.g. 256MiB (cpu default: what the prompt + --max-tokens need; on cuda it replaces "
            "--gpu-memory-utilization)");
  flags.gpu_memory_utilization_option =
      cmd.add_option("--gpu-memory-utilization", flags.gpu_memory_utilization,
                     "--device cuda: fraction of the GPU's memory pagoda may hold (weights, scratch and the KV pool, "
                     "which takes the rest), in (0, 1], like vLLM")
          ->capture_default_str();
  cmd.add_option("--max-model-len", flags.max_model_len,
                 "Longest sequence (prompt + output) in tokens; default: config.json's max_position_embeddings. "
                 "Larger values run past the trained context (benchmarks)");
  add_host_tier_flags(cmd, flags.kv_offload_memory, flags.preemption_mode);
  add_cross_layer_share_flag(cmd, flags.kv_cross_layer_share);
  cmd.add_option("--overlap-steps", flags.overlap_steps,
                 "Plan and launch the next engine step while the device runs this one, so scheduling and "
                 "streaming hide behind the GPU (docs/CUDA_BACKEND.md, overlapped steps): auto (the default: on with "
                 "--device cuda, off on the CPU), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  if (command == RunnerCommand::kServe) {
    flags.max_num_seqs_option = cmd.add_option("--max-num-seqs,--max-running", flags.max_num_seqs,
                                               "Most sequences in one batch (default: 64 on cpu, 256 on cuda)");
    flags.max_tokens_per_step_option =
        cmd.add_option("--max-tokens-per-step,--max-num-batched-tokens", flags.max_tokens_per_step,
                       "Token budget of one engine step, prefill chunks + decodes (default: 512 on cpu, 8192 on cuda)");
    cmd.add_option("--prefill-join-limit", flags.prefill_join_limit,
                   "N > 0: a new request does not join a step whose prefill chunks already hold N tokens; it "
                   "starts in a later step, so requests arriving together get their first tokens one after "
                   "another instead of all after one long step (e.g. 512 on cuda: docs/KV_CACHE.md); 0: off")
        ->capture_default_str();
    flags.max_prompt_rows_per_step_option = cmd.add_option(
        "--max-prompt-rows-per-step", flags.max_prompt_rows_per_step,
        "Most prompt positions of one sequence that a step computes when the request scores its prompt "
        "(prompt_logprobs, echo with logprobs): each is a logits row reduced to its score, so this bounds a "
        "step's lm_head rows and how long others' decodes wait behind a long scored prompt (default: 512 where "
        "the rows are scored on the GPU, i.e. --device cuda without tensor parallelism; else 128)");
  }
}

void add_cross_layer_share_flag(CLI::App& cmd, int32_t& value) {
  cmd.add_option("--kv-cross-layer-share", value,
                 "K > 1: the upper half of the layers is cut into groups of K that store one merged K/V (the mean "
                 "of their directions, each layer's norms kept, MiniCache-style): fewer KV bytes per token, at a "
                 "quality cost (docs/KV_CACHE.md); at most layers / 2; cpu only; 1: off")
      ->capture_default_str();
}

void add_host_tier_flags(CLI::App& cmd, std::string& kv_offload_memory, std::string& preemption_mode) {
  cmd.add_option("--kv-offload-memory", kv_offload_memory,
                 "Bytes of host memory for a second KV tier, e.g. 64GiB (pinned on cuda; 0: none). Blocks the "
                 "device evicts from the prefix cache are written back there and copied back on a hit, and "
                 "preempted sequences are swapped there")
      ->capture_default_str();
  cmd.add_option("--preemption-mode", preemption_mode,
                 "How a sequence is preempted when the KV pool is full: swap (its K/V goes to the host tier and "
                 "comes back; needs --kv-offload-memory) or recompute (its K/V is computed again). Default: swap "
                 "with a host tier, recompute without");
}

StatusOr<int64_t> parse_kv_offload_memory(const std::string& value) {
  const std::string& text = value.empty() ? std::string("0") : value;
  auto bytes = parse_byte_size(text);
  if (!bytes.ok() || *bytes < 0)
    return invalid_argument_error("--kv-offload-memory {}: expected a size such as 64GiB, 512MiB or 1e9 (0: no "
                                  "host tier)", text);
  const int64_t physical = physical_memory_bytes();
  if (physical > 0 && *bytes > physical)
    return invalid_argument_error("--kv-offload-memory {}: more than this machine's {} of memory", text,
                                  format_bytes(static_cast<double>(physical)));
  return *bytes;
}

StatusOr<engine::PreemptionMode> parse_preemption_mode(const std::string& mode, bool host_tier) {
  if (mode.empty()) return host_tier ? engine::PreemptionMode::kSwap : engine::PreemptionMode::kRecompute;
  if (mode == "recompute") return engine::PreemptionMode::kRecompute;
  if (mode == "swap") {
    if (!host_tier)
      return invalid_argument_error("--preemption-mode swap needs a host tier to swap to: give --kv-offload-memory "
                                    "(e.g. 16GiB) or use --preemption-mode recompute");
    return engine::PreemptionMode::kSwap;
  }
  return invalid_argument_error("--preemption-mode {}: expected swap or recompute", mode);
}

StatusOr<backend::RunnerSpec> resolve_runner_flags(const RunnerFlags& flags, RunnerCommand command) {
  backend::RunnerSpec r;
  if (flags.device == "cpu") {
    r.device = backend::Device::kCpu;
  } else if (flags.device == "cuda") {
    r.device = backend::Device::kCuda;  // compiled in or not: checked last, after the values
  } else {
    return invalid_argument_error("--device {}: expected cpu or cuda", flags.device);
  }

  if (flags.load_format == "auto") {
    r.load_format = backend::LoadFormat::kAuto;
  } else if (flags.load_format == "random") {
    r.load_format = backend::LoadFormat::kRandom;
  } else {
    return invalid_argument_error("--load-format {}: expected auto (weights from --model) or random", flags.load_format);
  }

  // Where the model comes from.
  std::error_code ec;
  if (r.load_format == backend::LoadFormat::kAuto) {
    if (!flags.config_file.empty())
      return invalid_argument_error("--config {} needs --load-format random (with auto the checkpoint in --model "
                                    "brings its own config.json)", flags.config_file);
    if (flags.model.empty()) return invalid_argument_error("--model is required: a Hugging Face model directory");
    if (!fs::is_directory(flags.model, ec))
      return invalid_argument_error("--model {}: not a directory (a checkpoint: config.json + safetensors)",
                                    flags.model);
    r.model_dir = flags.model;
    r.config_path = (fs::path(flags.model) / "config.json").string();
  } else {
    if (flags.model.empty() && flags.config_file.empty())
      return invalid_argument_error("--load-format random needs a config.json: --model DIR|FILE or --config FILE");
    if (!flags.model.empty()) {
      if (fs::is_directory(flags.model, ec)) {
        r.model_dir = flags.model;
        r.config_path = (fs::path(flags.model) / "config.json").string();
      } else if (fs::is_regular_file(flags.model, ec)) {
        if (!flags.config_file.empty())
          return invalid_argument_error("--model {} is a file and --config {} another: give one config.json",
                                        flags.model, flags.config_file);
        r.config_path = flags.model;
      } else {
        return invalid_argument_error("--model {}: no such directory or file", flags.model);
      }
    }
    if (!flags.config_file.empty()) r.config_path = flags.config_file;
    if (!fs::is_regular_file(r.config_path, ec))
      return invalid_argument_error("{} {}: no such file", flags.config_file.empty() ? "--model" : "--config",
                                    r.config_path);
  }

  // KV cache element types.
  PAGODA_ASSIGN_OR_RETURN(const DType both, parse_kv_dtype("--kv-cache-dtype", flags.kv_cache_dtype, r.device));
  r.key_dtype = both;
  r.value_dtype = both;
  if (!flags.kv_cache_dtype_k.empty()) {
    PAGODA_ASSIGN_OR_RETURN(r.key_dtype, parse_kv_dtype("--kv-cache-dtype-k", flags.kv_cache_dtype_k, r.device));
  }
  if (!flags.kv_cache_dtype_v.empty()) {
    PAGODA_ASSIGN_OR_RETURN(r.value_dtype, parse_kv_dtype("--kv-cache-dtype-v", flags.kv_cache_dtype_v, r.device));
  }

  if (flags.block_size < 1 || flags.block_size > kMaxBlockSize)
    return invalid_argument_error("--block-size {}: must be in [1, {}]", flags.block_size, kMaxBlockSize);
  r.block_size = flags.block_size;

  // KV memory: bytes on cpu; a fraction of the GPU (or bytes) on cuda.
  if (!(flags.gpu_memory_utilization > 0.0 && flags.gpu_memory_utilization <= 1.0))
    return invalid_argument_error("--gpu-memory-utilization {}: must be in (0, 1] (a fraction of the GPU's memory, "
                                  "e.g. 0.9)", flags.gpu_memory_utilization);
  r.gpu_memory_utilization = flags.gpu_memory_utilization;
  const bool memory_given = given(flags.kv_cache_memory_option) || !flags.kv_cache_memory.empty();
  if (r.device == backend::Device::kCpu && given(flags.gpu_memory_utilization_option))
    return invalid_argument_error("--gpu-memory-utilization applies to --device cuda; on cpu the KV pool is sized "
                                  "by --kv-cache-memory");
  if (r.device == backend::Device::kCuda && memory_given && given(flags.gpu_memory_utilization_option))
    return invalid_argument_error("--kv-cache-memory and --gpu-memory-utilization both size the GPU's KV pool: "
                                  "give one");
  std::string memory_text = flags.kv_cache_memory;
  if (!memory_given && r.device == backend::Device::kCpu && command == RunnerCommand::kServe)
    memory_text = kDefaultServeCpuKvMemory;
  if (!memory_text.empty()) {
    auto bytes = parse_byte_size(memory_text);
    if (!bytes.ok() || *bytes <= 0)
      return invalid_argument_error("--kv-cache-memory {}: expected a positive size such as 256MiB, 4GiB or 1e9",
                                    memory_text);
    r.kv_cache_memory = *bytes;
  }

  // The host tier: bytes of host memory, at most what the machine has.
  PAGODA_ASSIGN_OR_RETURN(r.kv_offload_memory, parse_kv_offload_memory(flags.kv_offload_memory));
  // Against the model's layers when it is loaded (backend::check_cross_layer_share).
  if (flags.kv_cross_layer_share < 1)
    return invalid_argument_error("--kv-cross-layer-share {}: must be >= 1 (1: no sharing)", flags.kv_cross_layer_share);
  r.kv_cross_layer_share = flags.kv_cross_layer_share;

  // Scheduler limits (serve); generate runs one sequence.
  const bool cuda = r.device == backend::Device::kCuda;
  r.max_num_seqs = given(flags.max_num_seqs_option) || flags.max_num_seqs != 0 ? flags.max_num_seqs
                   : command != RunnerCommand::kServe                          ? 1
                   : cuda                                                       ? kCudaDefaultMaxNumSeqs
                                                                                : kCpuDefaultMaxNumSeqs;
  r.max_tokens_per_step = given(flags.max_tokens_per_step_option) || flags.max_tokens_per_step != 0
                              ? flags.max_tokens_per_step
                          : cuda ? kCudaDefaultMaxTokensPerStep
                                 : kCpuDefaultMaxTokensPerStep;
  if (r.max_num_seqs < 1) return invalid_argument_error("--max-num-seqs {}: must be >= 1", flags.max_num_seqs);
  if (r.max_tokens_per_step < 1)
    return invalid_argument_error("--max-tokens-per-step {}: must be >= 1", flags.max_tokens_per_step);
  if (flags.max_prompt_rows_per_step < 0 ||
      (flags.max_prompt_rows_per_step == 0 && given(flags.max_prompt_rows_per_step_option)))
    return invalid_argument_error("--max-prompt-rows-per-step {}: must be >= 1", flags.max_prompt_rows_per_step);
  if (flags.prefill_join_limit < 0)
    return invalid_argument_error("--prefill-join-limit {}: must be >= 0 (0: off)", flags.prefill_join_limit);
  if (flags.max_model_len < 0) return invalid_argument_error("--max-model-len {}: must be >= 1", flags.max_model_len);
  r.max_model_len = flags.max_model_len;
  r.weight_seed = flags.weight_seed;
  PAGODA_ASSIGN_OR_RETURN(r.weight_quantization, parse_weight_quantization(flags.quantization, r.device));
  PAGODA_RETURN_IF_ERROR(check_tensor_parallel_size(flags.tensor_parallel_size));
  r.tensor_parallel_size = flags.tensor_parallel_size;
  r.tensor_parallel_same_device = flags.tensor_parallel_same_device;
  if (r.tensor_parallel_same_device && r.device != backend::Device::kCuda)
    return invalid_argument_error("--tensor-parallel-same-device: only with --device cuda");
  // The same-device ranks' CUDA graphs (experimental, PAGODA_TP_CUDA_GRAPHS=1) meet through spinning kernels on
  // one GPU (same_device_communicator.h), so every rank's stream wants a hardware queue of its own, and no kernel
  // may be loaded lazily while another rank spins (loading waits for the device to go idle): ask for the most
  // queues and eager module loading before CUDA starts (an explicit setting wins; no effect once CUDA has started).
  if (const char* graphs = std::getenv("PAGODA_TP_CUDA_GRAPHS");
      r.tensor_parallel_same_device && graphs != nullptr && std::string_view(graphs) == "1") {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  }
#ifndef PAGODA_HAVE_CUDA
  if (r.device == backend::Device::kCuda)
    return failed_precondition_error("--device cuda: this pagoda was built without the CUDA backend (backends: cpu); "
                                     "rebuild where nvcc is found (cmake -DPAGODA_CUDA=ON) or use --device cpu");
#endif
  return r;
}

StatusOr<engine::PreemptionMode> resolve_preemption_mode(const RunnerFlags& flags, const backend::RunnerSpec& spec) {
  return parse_preemption_mode(flags.preemption_mode, spec.kv_offload_memory > 0);
}

kv::KvCacheConfig kv_cache_config(const backend::RunnerSetup& setup, bool enable_prefix_cache) {
  kv::KvCacheConfig config;
  config.num_blocks = setup.num_blocks;
  config.num_host_blocks = setup.num_host_blocks;
  config.block_size = setup.block_size;
  config.enable_prefix_cache = enable_prefix_cache;
  config.record_events = false;
  return config;
}

int32_t max_prompt_rows_per_step(const RunnerFlags& flags, bool scores_on_device) {
  if (flags.max_prompt_rows_per_step > 0) return flags.max_prompt_rows_per_step;
  return scores_on_device ? kDeviceScoringMaxPromptRowsPerStep : kHostScoringMaxPromptRowsPerStep;
}

engine::SchedulerConfig scheduler_config(const backend::RunnerSetup& setup, engine::PreemptionMode preemption) {
  engine::SchedulerConfig config;
  config.preemption_mode = preemption;
  config.max_running_sequences = setup.spec.max_num_seqs;
  config.max_tokens_per_step = setup.spec.max_tokens_per_step;
  return config;
}

engine::OverlapSteps overlap_steps(const RunnerFlags& flags) {
  if (flags.overlap_steps == "on") return engine::OverlapSteps::kOn;
  if (flags.overlap_steps == "off") return engine::OverlapSteps::kOff;
  return engine::OverlapSteps::kAuto;
}

}  // namespace pagoda::cli
