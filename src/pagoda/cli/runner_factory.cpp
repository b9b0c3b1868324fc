#include "pagoda/cli/runner_factory.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu_kv_pool.h"
#include "pagoda/cli/random_cpu_model.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/engine/cpu_model_runner.h"
#include "pagoda/kv/kv_sizing.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/cpu_model.h"
#include "pagoda/model/model_weights.h"

#ifdef PAGODA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#endif

namespace pagoda::cli {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kMaxBlockSize = 256;  // the KV manager's limit
constexpr const char* kDefaultServeCpuKvMemory = "256MiB";
constexpr int32_t kCpuDefaultMaxNumSeqs = 64, kCpuDefaultMaxTokensPerStep = 512;
// vLLM's defaults on a GPU; the CUDA model sizes its scratch and graph buckets from them.
constexpr int32_t kCudaDefaultMaxNumSeqs = 256, kCudaDefaultMaxTokensPerStep = 8192;

bool given(const CLI::Option* option) { return option != nullptr && option->count() > 0; }

StatusOr<DType> parse_kv_dtype(const std::string& flag, const std::string& value, Device device) {
  static constexpr std::array<std::pair<const char*, DType>, 5> kNames = {
      {{"f32", DType::kF32}, {"bf16", DType::kBF16}, {"fp8", DType::kFP8E4M3}, {"int8", DType::kInt8},
       {"int4", DType::kInt4}}};
  if (value == "auto") return device == Device::kCuda ? DType::kBF16 : DType::kF32;
  for (const auto& [name, dtype] : kNames)
    if (value == name) return dtype;
  return invalid_argument_error("{} {}: expected one of auto, f32, bf16, fp8, int8, int4 (auto: f32 on cpu, bf16 "
                                "on cuda)", flag, value.empty() ? "''" : value);
}

// The flags that chose the KV dtypes, for error messages ("--kv-cache-dtype int8").
std::string kv_dtype_flags_text(const ResolvedRunnerFlags& flags) {
  if (flags.key_dtype == flags.value_dtype) return fmt::format("--kv-cache-dtype {}", dtype_name(flags.key_dtype));
  return fmt::format("--kv-cache-dtype-k {} --kv-cache-dtype-v {}", dtype_name(flags.key_dtype),
                     dtype_name(flags.value_dtype));
}

StatusOr<ModelConfig> read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found_error("cannot read config file {}", path);
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument_error("{}: not valid JSON", path);
  return parse_model_config(json, path);
}

StatusOr<ModelConfig> load_config(const ResolvedRunnerFlags& flags) {
  if (flags.load_format == LoadFormat::kAuto) return load_model_config(flags.model_dir);
  return read_config_file(flags.config_path);
}

int64_t blocks_for_tokens(int64_t tokens, int32_t block_size) { return (tokens + block_size - 1) / block_size; }

KvPoolShape pool_shape(const ModelConfig& config, const ResolvedRunnerFlags& flags, int32_t num_blocks) {
  return KvPoolShape{config.num_layers, num_blocks, flags.block_size, config.num_kv_heads, config.head_dim,
                     flags.key_dtype, flags.value_dtype};
}

// A backend error caused by the chosen KV dtypes keeps its code and gains the flags.
Status with_kv_dtype_context(const Status& status, const ResolvedRunnerFlags& flags) {
  return status.with_context(fmt::format("{} on --device {}", kv_dtype_flags_text(flags), device_name(flags.device)));
}

size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{8} << 30;
}

int64_t cpu_weight_bytes(const ModelWeights& w) {
  auto bytes = [](const kernels::WeightMatrix& m) {
    return static_cast<int64_t>(m.rows * m.cols) * dtype_bits(m.dtype) / 8;
  };
  int64_t total = bytes(w.embed_tokens) + (w.lm_head.data == w.embed_tokens.data ? 0 : bytes(w.lm_head));
  for (const LayerWeights& l : w.layers)
    for (const auto* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      total += bytes(*m);
  return total;
}

std::string model_summary(const ModelConfig& c, const ResolvedRunnerFlags& flags) {
  const std::string source = flags.load_format == LoadFormat::kRandom
                                 ? fmt::format("random weights for {} (seed {})", flags.config_path, flags.weight_seed)
                                 : flags.model_dir;
  return fmt::format("model: {} from {}: {} layers, hidden {}, heads {}/{} (head_dim {}), vocab {}",
                     c.architecture_name, source, c.num_layers, c.hidden_size, c.num_q_heads, c.num_kv_heads,
                     c.head_dim, c.vocab_size);
}

// The lines every device shares: KV dtypes and bytes per token (kv_sizing's start-up line, as kvcalc
// prints it) and how many requests of max_model_len the pool holds.
void add_kv_report(ModelRunnerSetup& setup, std::vector<std::string>& lines) {
  const ResolvedRunnerFlags& f = setup.flags;
  const KvShape shape{setup.config.num_layers, setup.config.num_q_heads, setup.config.num_kv_heads,
                      setup.config.head_dim};
  lines.push_back(format_kv_cache_line(shape, f.key_dtype, f.value_dtype,
                                       setup.kv_pool_tokens() * setup.kv_bytes_per_token, setup.block_size) +
                  " (scales included)");
  lines.push_back(fmt::format(
      "capacity: {} tokens in the KV pool = {} requests of {} tokens (max_model_len) at once; max-num-seqs {}, "
      "max-tokens-per-step {}", setup.kv_pool_tokens(), setup.max_concurrent_full_requests(), setup.max_model_len,
      f.max_num_seqs, f.max_tokens_per_step));
}

StatusOr<ModelRunnerSetup> create_cpu_runner(const ResolvedRunnerFlags& flags, const RunnerRequirements& req,
                                             ModelConfig config) {
  // A one-block pool first: a KV dtype the CPU pool cannot store fails before the weights load.
  if (auto probe = CpuKvPool::create(pool_shape(config, flags, 1)); !probe.ok())
    return with_kv_dtype_context(probe.status(), flags);

  auto progress = [&req](const std::string& line) {
    if (req.progress) req.progress(line);
  };
  std::unique_ptr<CpuModel> model;
  std::string weights_text;
  if (flags.load_format == LoadFormat::kRandom) {
    // Half the machine's memory, at most 16 GiB: small shapes for tests and demos, not 8B-class models.
    const size_t max_bytes = std::min(physical_memory_bytes() / 2, size_t{16} << 30);
    PAGODA_ASSIGN_OR_RETURN(model, make_random_cpu_model(config, flags.weight_seed, max_bytes));
    weights_text = "f32 (random)";
  } else {
    progress("loading " + flags.model_dir);
    PAGODA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(flags.model_dir, progress));
    WeightLoadOptions options;
    options.progress = progress;
    PAGODA_ASSIGN_OR_RETURN(
        ModelWeights weights,
        bind_model_weights(config, std::make_shared<const Checkpoint>(std::move(checkpoint)), options));
    model = std::make_unique<CpuModel>(config, std::move(weights));
    weights_text = fmt::format("{}{}", dtype_name(model->weights().file_dtype),
                               model->weights().upcast_to_f32 ? " (upcast to f32)" : " (mmapped)");
  }

  ModelRunnerSetup setup;
  setup.flags = flags;
  setup.config = config;
  setup.max_model_len = req.sequence_tokens > 0 ? req.sequence_tokens : config.max_position_embeddings;
  setup.block_size = flags.block_size;
  setup.weight_bytes = cpu_weight_bytes(model->weights());
  setup.kv_bytes_per_token = static_cast<int64_t>(pool_shape(config, flags, 1).bytes_per_token());

  std::string sizing;
  int64_t num_blocks = 0;
  if (flags.kv_cache_memory > 0) {
    num_blocks = engine::CpuModelRunner::blocks_for_memory(*model, flags.kv_cache_memory, flags.block_size,
                                                           flags.key_dtype, flags.value_dtype);
    sizing = fmt::format("--kv-cache-memory {}", format_bytes(static_cast<double>(flags.kv_cache_memory)));
    if (num_blocks < 1)
      return invalid_argument_error("--kv-cache-memory {}: holds no KV block of {} tokens ({} per token)",
                                    flags.kv_cache_memory, flags.block_size,
                                    format_bytes(static_cast<double>(setup.kv_bytes_per_token)));
  } else {
    num_blocks = blocks_for_tokens(std::max<int64_t>(req.min_kv_tokens, 1), flags.block_size);
    sizing = "sized to the request";
  }
  if (num_blocks > INT32_MAX)
    return invalid_argument_error("--kv-cache-memory {}: {} blocks is more than a pool can index",
                                  flags.kv_cache_memory, num_blocks);
  if (num_blocks * flags.block_size < req.min_kv_tokens)
    return invalid_argument_error("--kv-cache-memory {}: holds {} tokens, this run needs {}", flags.kv_cache_memory,
                                  num_blocks * flags.block_size, req.min_kv_tokens);

  auto runner = engine::CpuModelRunner::create(std::move(model), static_cast<int32_t>(num_blocks), flags.block_size,
                                               flags.key_dtype, flags.value_dtype);
  if (!runner.ok()) return with_kv_dtype_context(runner.status(), flags);
  setup.num_blocks = static_cast<int32_t>(num_blocks);
  setup.runner = std::move(*runner);

  std::vector<std::string> lines;
  lines.push_back(fmt::format("device: cpu ({} threads)", ThreadPool::global().size()));
  lines.push_back(model_summary(config, flags) +
                  fmt::format("; weights {} {}", format_bytes(static_cast<double>(setup.weight_bytes)), weights_text));
  add_kv_report(setup, lines);
  lines.insert(lines.end() - 1,
               fmt::format("KV pool: {} blocks x {} tokens = {} tokens, {} ({})", setup.num_blocks, setup.block_size,
                           setup.kv_pool_tokens(),
                           format_bytes(static_cast<double>(setup.kv_pool_tokens() * setup.kv_bytes_per_token)),
                           sizing));
  for (const std::string& l : lines) setup.report += l + "\n";
  return setup;
}

#ifdef PAGODA_HAVE_CUDA
// "NVIDIA H200, 139.8 GiB, sm_90" of device 0, or why no device can be used.
StatusOr<std::string> probe_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return failed_precondition_error(
        "--device cuda: no usable CUDA device on this machine ({}); run with --device cpu",
        err != cudaSuccess ? fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err))
                           : std::string("no devices"));
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess)
    return failed_precondition_error("--device cuda: cannot query device 0 ({})", cudaGetErrorString(e));
  if (prop.major < 9) {
    return failed_precondition_error("--device cuda: device 0 ({}) is sm_{}{}; pagoda's CUDA kernels are built for "
                                     "Hopper (sm_90a)", prop.name, prop.major, prop.minor);
  }
  return fmt::format("{}, {:.1f} GiB, sm_{}{}", prop.name, prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                     prop.major, prop.minor);
}

StatusOr<ModelRunnerSetup> create_cuda_runner(const ResolvedRunnerFlags& flags, const RunnerRequirements& req,
                                              ModelConfig config) {
  PAGODA_ASSIGN_OR_RETURN(std::string device_text, probe_cuda_device());
  if (auto probe = cuda::CudaKvPool::create(pool_shape(config, flags, 1)); !probe.ok())
    return with_kv_dtype_context(probe.status(), flags);

  cuda::CudaModelOptions options;
  options.max_num_seqs = flags.max_num_seqs;
  // generate runs its whole prompt in one forward: the scratch must hold it.
  options.max_num_tokens = std::max(flags.max_tokens_per_step, req.prompt_tokens);
  options.max_model_len = req.sequence_tokens > 0 ? req.sequence_tokens : config.max_position_embeddings;
  options.block_size = flags.block_size;
  options.show_progress = req.show_progress;
  options.kv_key_dtype = flags.key_dtype;
  options.kv_value_dtype = flags.value_dtype;
  std::unique_ptr<cuda::CudaModel> model;
  if (flags.load_format == LoadFormat::kRandom) {
    PAGODA_ASSIGN_OR_RETURN(model, cuda::CudaModel::create_random(config, flags.weight_seed, options));
  } else {
    if (req.progress) req.progress("loading " + flags.model_dir + " to the GPU");
    PAGODA_ASSIGN_OR_RETURN(model, cuda::CudaModel::load(flags.model_dir, options));
  }

  ModelRunnerSetup setup;
  setup.flags = flags;
  setup.config = config;
  setup.block_size = flags.block_size;
  setup.weight_bytes = static_cast<int64_t>(model->weight_bytes());
  setup.kv_bytes_per_token = static_cast<int64_t>(pool_shape(config, flags, 1).bytes_per_token());

  cuda::CudaRunnerOptions runner_options;
  runner_options.gpu_memory_utilization = flags.gpu_memory_utilization;
  runner_options.print_report = false;  // part of our report
  if (flags.kv_cache_memory > 0) {
    const int64_t blocks = flags.kv_cache_memory / (setup.kv_bytes_per_token * flags.block_size);
    if (blocks < 1)
      return invalid_argument_error("--kv-cache-memory {}: holds no KV block of {} tokens ({} per token)",
                                    flags.kv_cache_memory, flags.block_size,
                                    format_bytes(static_cast<double>(setup.kv_bytes_per_token)));
    runner_options.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  }
  auto runner = cuda::CudaModelRunner::create(std::move(model), runner_options);
  if (!runner.ok()) {
    return runner.status().with_context(fmt::format("allocating the KV pool ({}, --gpu-memory-utilization {})",
                                                    kv_dtype_flags_text(flags), flags.gpu_memory_utilization));
  }
  setup.num_blocks = (*runner)->num_blocks();
  setup.max_model_len = (*runner)->max_context_length();
  if (setup.kv_pool_tokens() < req.min_kv_tokens)
    return resource_exhausted_error("the KV pool holds {} tokens, this run needs {} (raise --gpu-memory-utilization "
                                    "or --kv-cache-memory)", setup.kv_pool_tokens(), req.min_kv_tokens);
  const std::string pool_report = (*runner)->kv_pool_report();
  setup.runner = std::move(*runner);

  std::vector<std::string> lines;
  lines.push_back("device: cuda (" + device_text + ")");
  lines.push_back(model_summary(config, flags) +
                  fmt::format("; weights {} bf16 on the GPU", format_bytes(static_cast<double>(setup.weight_bytes))));
  add_kv_report(setup, lines);
  lines.insert(lines.end() - 1, pool_report);
  for (const std::string& l : lines) setup.report += l + "\n";
  return setup;
}
#endif  // PAGODA_HAVE_CUDA

}  // namespace

std::string_view device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

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
  cmd.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "KV cache element type: auto (f32 on cpu, bf16 on cuda), f32, bf16, fp8 (e4m3, per-token-head "
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
  if (command == RunnerCommand::kServe) {
    flags.max_num_seqs_option = cmd.add_option("--max-num-seqs,--max-running", flags.max_num_seqs,
                                               "Most sequences in one batch (default: 64 on cpu, 256 on cuda)");
    flags.max_tokens_per_step_option =
        cmd.add_option("--max-tokens-per-step,--max-num-batched-tokens", flags.max_tokens_per_step,
                       "Token budget of one engine step, prefill chunks + decodes (default: 512 on cpu, 8192 on cuda)");
  }
}

StatusOr<ResolvedRunnerFlags> resolve_runner_flags(const RunnerFlags& flags, RunnerCommand command) {
  ResolvedRunnerFlags r;
  if (flags.device == "cpu") {
    r.device = Device::kCpu;
  } else if (flags.device == "cuda") {
    r.device = Device::kCuda;  // compiled in or not: checked last, after the values
  } else {
    return invalid_argument_error("--device {}: expected cpu or cuda", flags.device);
  }

  if (flags.load_format == "auto") {
    r.load_format = LoadFormat::kAuto;
  } else if (flags.load_format == "random") {
    r.load_format = LoadFormat::kRandom;
  } else {
    return invalid_argument_error("--load-format {}: expected auto (weights from --model) or random", flags.load_format);
  }

  // Where the model comes from.
  std::error_code ec;
  if (r.load_format == LoadFormat::kAuto) {
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
  if (r.device == Device::kCpu && given(flags.gpu_memory_utilization_option))
    return invalid_argument_error("--gpu-memory-utilization applies to --device cuda; on cpu the KV pool is sized "
                                  "by --kv-cache-memory");
  if (r.device == Device::kCuda && memory_given && given(flags.gpu_memory_utilization_option))
    return invalid_argument_error("--kv-cache-memory and --gpu-memory-utilization both size the GPU's KV pool: "
                                  "give one");
  std::string memory_text = flags.kv_cache_memory;
  if (!memory_given && r.device == Device::kCpu && command == RunnerCommand::kServe)
    memory_text = kDefaultServeCpuKvMemory;
  if (!memory_text.empty()) {
    auto bytes = parse_byte_size(memory_text);
    if (!bytes.ok() || *bytes <= 0)
      return invalid_argument_error("--kv-cache-memory {}: expected a positive size such as 256MiB, 4GiB or 1e9",
                                    memory_text);
    r.kv_cache_memory = *bytes;
  }

  // Scheduler limits (serve); generate runs one sequence.
  const bool cuda = r.device == Device::kCuda;
  r.max_num_seqs = given(flags.max_num_seqs_option) || flags.max_num_seqs != 0 ? flags.max_num_seqs
                   : command == RunnerCommand::kGenerate                        ? 1
                   : cuda                                                       ? kCudaDefaultMaxNumSeqs
                                                                                : kCpuDefaultMaxNumSeqs;
  r.max_tokens_per_step = given(flags.max_tokens_per_step_option) || flags.max_tokens_per_step != 0
                              ? flags.max_tokens_per_step
                          : cuda ? kCudaDefaultMaxTokensPerStep
                                 : kCpuDefaultMaxTokensPerStep;
  if (r.max_num_seqs < 1) return invalid_argument_error("--max-num-seqs {}: must be >= 1", flags.max_num_seqs);
  if (r.max_tokens_per_step < 1)
    return invalid_argument_error("--max-tokens-per-step {}: must be >= 1", flags.max_tokens_per_step);
  if (flags.max_model_len < 0) return invalid_argument_error("--max-model-len {}: must be >= 1", flags.max_model_len);
  r.max_model_len = flags.max_model_len;
  r.weight_seed = flags.weight_seed;
#ifndef PAGODA_HAVE_CUDA
  if (r.device == Device::kCuda)
    return failed_precondition_error("--device cuda: this pagoda was built without the CUDA backend (backends: cpu); "
                                     "rebuild where nvcc is found (cmake -DPAGODA_CUDA=ON) or use --device cpu");
#endif
  return r;
}

int64_t ModelRunnerSetup::max_concurrent_full_requests() const {
  if (max_model_len <= 0 || block_size <= 0) return 0;
  return num_blocks / blocks_for_tokens(max_model_len, block_size);
}

kv::KvCacheConfig ModelRunnerSetup::kv_cache_config(bool enable_prefix_cache) const {
  kv::KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.enable_prefix_cache = enable_prefix_cache;
  config.record_events = false;
  return config;
}

engine::SchedulerConfig ModelRunnerSetup::scheduler_config() const {
  engine::SchedulerConfig config;
  config.max_running_sequences = flags.max_num_seqs;
  config.max_tokens_per_step = flags.max_tokens_per_step;
  return config;
}

StatusOr<ModelRunnerSetup> create_model_runner(const ResolvedRunnerFlags& flags,
                                               const RunnerRequirements& requirements) {
  PAGODA_ASSIGN_OR_RETURN(ModelConfig config, load_config(flags));
  if (flags.max_model_len > 0) {
    // Lets a benchmark run past the trained context (quality is then not the point).
    config.max_position_embeddings = flags.max_model_len;
  }
  if (requirements.sequence_tokens > config.max_position_embeddings)
    return out_of_range_error("this run needs {} tokens of context, more than {} (config.json's "
                                  "max_position_embeddings, or --max-model-len)", requirements.sequence_tokens,
                                  config.max_position_embeddings);
  if (flags.device == Device::kCuda) {
#ifdef PAGODA_HAVE_CUDA
    return create_cuda_runner(flags, requirements, std::move(config));
#else
    return failed_precondition_error("--device cuda: this pagoda was built without the CUDA backend");
#endif
  }
  return create_cpu_runner(flags, requirements, std::move(config));
}

}  // namespace pagoda::cli
