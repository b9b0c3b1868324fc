#include "pagoda/backend/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/backend/cpu/cpu_tensor_parallel_runner.h"
#include "pagoda/backend/cpu/kernels/quant_dot.h"
#include "pagoda/backend/cpu/random_cpu_model.h"
#include "pagoda/backend/startup_report.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model_weights.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::backend {
namespace {

size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{8} << 30;
}

int64_t cpu_weight_bytes(const ModelWeights& w) {
  auto bytes = [](const WeightMatrix& m) {
    if (kernels::is_quantized_weight(m.dtype))
      return static_cast<int64_t>(m.rows * kernels::quantized_row_bytes(m.dtype, m.cols));
    return static_cast<int64_t>(m.rows * m.cols) * dtype_bits(m.dtype) / 8;
  };
  int64_t total = bytes(w.embed_tokens) + (w.lm_head.data == w.embed_tokens.data ? 0 : bytes(w.lm_head));
  for (const LayerWeights& l : w.layers)
    for (const WeightMatrix* m : l.matrices()) total += bytes(*m);
  return total;
}

// --quantization on a checkpoint whose config.json declares its own quantization.
Status check_not_prequantized(const RunnerSpec& spec) {
  std::ifstream in(spec.config_path);
  if (!in) return ok_status();  // load_model_config reports an unreadable config
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("quantization_config"))
    return invalid_argument_error("--quantization {}: {} has a quantization_config: the checkpoint is already "
                                  "quantized; --quantization needs f32, f16 or bf16 weights",
                                  dtype_name(*spec.weight_quantization), spec.config_path);
  return ok_status();
}

}  // namespace

StatusOr<RunnerSetup> create_cpu_runner(const RunnerSpec& spec, const RunnerRequirements& req,
                                             ModelConfig config) {
  // A one-block pool first: a KV dtype the CPU pool cannot store fails before the weights load.
  if (auto probe = CpuKvPool::create(pool_shape(config, spec, 1)); !probe.ok())
    return with_kv_dtype_context(probe.status(), spec);

  auto progress = [&req](const std::string& line) {
    if (req.progress) req.progress(line);
  };
  if (spec.weight_quantization) PAGODA_RETURN_IF_ERROR(check_not_prequantized(spec));
  // Tensor parallelism is checked against the config before any weight loads.
  const int32_t tp = spec.tensor_parallel_size;
  PAGODA_RETURN_IF_ERROR(check_tensor_parallel(config, tp));
  std::unique_ptr<CpuModel> model;
  std::string weights_text;
  if (spec.load_format == LoadFormat::kRandom) {
    // Half the machine's memory, at most 16 GiB: small shapes for tests and demos, not 8B-class models.
    const size_t max_bytes = std::min(physical_memory_bytes() / 2, size_t{16} << 30);
    PAGODA_ASSIGN_OR_RETURN(model, make_random_cpu_model(config, spec.weight_seed, max_bytes));
    weights_text = "f32 (random)";
  } else {
    progress("loading " + spec.model_dir);
    PAGODA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(spec.model_dir, progress));
    WeightLoadOptions options;
    options.progress = progress;
    PAGODA_ASSIGN_OR_RETURN(
        ModelWeights weights,
        bind_model_weights(config, std::make_shared<const Checkpoint>(std::move(checkpoint)), options));
    model = std::make_unique<CpuModel>(config, std::move(weights));
    weights_text = fmt::format("{}{}", dtype_name(model->weights().file_dtype),
                               model->weights().upcast_to_f32 ? " (upcast to f32)" : " (mmapped)");
    if (model->weights().fp8)
      weights_text += fmt::format(" with fp8 Linear weights ({}; the CPU dequantizes them to f32)",
                                  model->weights().fp8->describe());
  }

  if (spec.weight_quantization) {
    progress(fmt::format("quantizing weights to {}{}", dtype_name(*spec.weight_quantization),
                         tp > 1 ? " (each rank its shard)" : ""));
    // With tensor parallelism each rank quantizes its own shard (CpuTensorParallelRunner).
    if (tp == 1) PAGODA_RETURN_IF_ERROR(model->quantize_weights(*spec.weight_quantization));
    if (*spec.weight_quantization == DType::kFP8E4M3)
      weights_text = fmt::format("{} -> fp8 e4m3 (--quantization; per-channel scales, dynamic per-token "
                                 "activations; lm_head as loaded)", weights_text);
    else
      weights_text = fmt::format("{} -> {} blocks of {} (--quantization; lm_head int8)", weights_text,
                                 dtype_name(*spec.weight_quantization), kernels::kQuantBlock);
  }

  RunnerSetup setup;
  setup.spec = spec;
  setup.config = config;
  setup.max_model_len = req.sequence_tokens > 0 ? req.sequence_tokens : config.max_position_embeddings;
  setup.block_size = spec.block_size;
  setup.weight_bytes = cpu_weight_bytes(model->weights());
  // With tensor parallelism: every rank's pool together (each rank holds its KV heads of every block).
  setup.kv_bytes_per_token =
      tp > 1 ? static_cast<int64_t>(tp) * static_cast<int64_t>(
                                              pool_shape(shard_config(config, tensor_shard(config, 0, tp)), spec, 1)
                                                  .bytes_per_token())
             : static_cast<int64_t>(pool_shape(config, spec, 1).bytes_per_token());

  std::string sizing;
  int64_t num_blocks = 0;
  if (spec.kv_cache_memory > 0) {
    const int64_t block_bytes = setup.kv_bytes_per_token * spec.block_size;
    num_blocks = block_bytes > 0 ? spec.kv_cache_memory / block_bytes : 0;
    sizing = fmt::format("--kv-cache-memory {}", format_bytes(static_cast<double>(spec.kv_cache_memory)));
    if (num_blocks < 1)
      return invalid_argument_error("--kv-cache-memory {}: holds no KV block of {} tokens ({} per token)",
                                    spec.kv_cache_memory, spec.block_size,
                                    format_bytes(static_cast<double>(setup.kv_bytes_per_token)));
  } else {
    num_blocks = blocks_for_tokens(std::max<int64_t>(req.min_kv_tokens, 1), spec.block_size);
    sizing = "sized to the request";
  }
  if (num_blocks > INT32_MAX)
    return invalid_argument_error("--kv-cache-memory {}: {} blocks is more than a pool can index",
                                  spec.kv_cache_memory, num_blocks);
  if (num_blocks * spec.block_size < req.min_kv_tokens)
    return invalid_argument_error("--kv-cache-memory {}: holds {} tokens, this run needs {}", spec.kv_cache_memory,
                                  num_blocks * spec.block_size, req.min_kv_tokens);

  PAGODA_ASSIGN_OR_RETURN(const int32_t host_blocks, host_tier_blocks(spec, setup.kv_bytes_per_token));
  StatusOr<std::unique_ptr<runtime::ModelRunner>> runner = internal_error("no runner");
  std::string tp_line;
  if (tp > 1) {
    // The ranks' views point into the whole model's weights, which the runner keeps alive through them.
    std::shared_ptr<const CpuModel> whole(std::move(model));
    CpuTensorParallelRunner::Options options{.num_blocks = static_cast<int32_t>(num_blocks),
                                             .block_size = spec.block_size,
                                             .key_dtype = spec.key_dtype,
                                             .value_dtype = spec.value_dtype,
                                             .num_host_blocks = host_blocks,
                                             .quantization = spec.weight_quantization};
    auto group = CpuTensorParallelRunner::create(config, std::shared_ptr<const ModelWeights>(whole, &whole->weights()),
                                                 tp, options);
    if (group.ok()) {
      const TensorShard s = tensor_shard(config, 0, tp);
      tp_line = fmt::format("tensor parallel: {} ranks as threads of this process, {} threads each; per rank {} of {} "
                            "attention heads, {} of {} KV heads{}, {} of {} MLP features, {} vocabulary rows",
                            tp, (*group)->threads_per_rank(), s.num_q_heads, config.num_q_heads, s.num_kv_heads,
                            config.num_kv_heads, config.num_kv_heads < tp ? " (replicated)" : "",
                            s.intermediate_size, config.intermediate_size, s.vocab_chunk);
      // The ranks' weights together: quantized or not, each matrix counted once (slices partition it).
      setup.weight_bytes = 0;
      for (int32_t r = 0; r < tp; ++r) setup.weight_bytes += cpu_weight_bytes((*group)->rank(r).model().weights());
      runner = std::unique_ptr<runtime::ModelRunner>(std::move(*group));
    } else {
      runner = group.status();
    }
  } else {
    auto single = CpuModelRunner::create(std::move(model), static_cast<int32_t>(num_blocks), spec.block_size,
                                         spec.key_dtype, spec.value_dtype, host_blocks, spec.kv_cross_layer_share);
    if (single.ok()) runner = std::unique_ptr<runtime::ModelRunner>(std::move(*single));
    else runner = single.status();
  }
  if (!runner.ok()) {
    if (runner.status().message().find("--kv-cross-layer-share") != std::string::npos) return runner.status();
    if (runner.status().message().find("host KV pool") != std::string::npos)
      return runner.status().with_context(
          fmt::format("--kv-offload-memory {}", format_bytes(static_cast<double>(spec.kv_offload_memory))));
    return with_kv_dtype_context(runner.status(), spec);
  }
  setup.num_blocks = static_cast<int32_t>(num_blocks);
  setup.num_host_blocks = host_blocks;
  setup.runner = std::move(*runner);

  std::vector<std::string> lines;
  lines.push_back(fmt::format("device: cpu ({} threads)", ThreadPool::global().size()));
  if (!tp_line.empty()) lines.push_back(tp_line);
  lines.push_back(model_summary(config, spec) +
                  fmt::format("; weights {} {}", format_bytes(static_cast<double>(setup.weight_bytes)), weights_text));
  add_kv_report(setup, lines);
  lines.insert(lines.end() - 1,
               fmt::format("KV pool: {} blocks x {} tokens = {} tokens, {} ({})", setup.num_blocks, setup.block_size,
                           setup.kv_pool_tokens(),
                           format_bytes(static_cast<double>(setup.kv_pool_tokens() * setup.kv_bytes_per_token)),
                           sizing));
  lines.insert(lines.end() - 1, kv_tiers_line(setup, /*pinned=*/false));
  for (const std::string& l : lines) setup.report += l + "\n";
  return setup;
}

}  // namespace pagoda::backend
