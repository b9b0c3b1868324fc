#include "pagoda/backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include <fmt/format.h>

#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/backend/startup_report.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::backend {
namespace {

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

}  // namespace

StatusOr<RunnerSetup> create_cuda_runner(const RunnerSpec& spec, const RunnerRequirements& req,
                                              ModelConfig config) {
  PAGODA_ASSIGN_OR_RETURN(std::string device_text, probe_cuda_device());
  if (spec.tensor_parallel_size != 1) {
    if (auto probe = cuda::CudaKvPool::create(pool_shape(config, spec, 1)); !probe.ok())
      return with_kv_dtype_context(probe.status(), spec);
    return create_cuda_tensor_parallel_runner(spec, req, config, device_text);
  }
  if (auto probe = cuda::CudaKvPool::create(pool_shape(config, spec, 1)); !probe.ok())
    return with_kv_dtype_context(probe.status(), spec);

  cuda::CudaModelOptions options;
  options.max_num_seqs = spec.max_num_seqs;
  // generate runs its whole prompt in one forward: the scratch must hold it.
  options.max_num_tokens = std::max(spec.max_tokens_per_step, req.prompt_tokens);
  options.max_model_len = req.sequence_tokens > 0 ? req.sequence_tokens : config.max_position_embeddings;
  options.block_size = spec.block_size;
  options.show_progress = req.show_progress;
  options.kv_key_dtype = spec.key_dtype;
  options.kv_value_dtype = spec.value_dtype;
  options.kv_cross_layer_share = spec.kv_cross_layer_share;
  if (spec.weight_quantization) {
    if (*spec.weight_quantization != DType::kFP8E4M3)
      return invalid_argument_error("--quantization {}: --device cuda runs fp8 weight quantization only",
                                    dtype_name(*spec.weight_quantization));
    if (config.fp8)
      return invalid_argument_error("--quantization fp8: {} is already quantized ({}); --quantization needs f32, "
                                    "f16 or bf16 weights", spec.config_path, config.fp8->describe());
    if (config.mla)
      return invalid_argument_error("--quantization fp8: {} (MLA/MoE) layers run bf16 on the GPU",
                                    config.architecture_name);
    options.fp8_weights = true;
  }
  std::unique_ptr<cuda::CudaModel> model;
  if (spec.load_format == LoadFormat::kRandom) {
    PAGODA_ASSIGN_OR_RETURN(model, cuda::CudaModel::create_random(config, spec.weight_seed, options));
  } else {
    if (req.progress) req.progress("loading " + spec.model_dir + " to the GPU");
    PAGODA_ASSIGN_OR_RETURN(model, cuda::CudaModel::load(spec.model_dir, options));
  }

  const int32_t fp8_projections = model->fp8_projections();
  const int32_t projections = config.mla ? 0 : 4 * config.num_layers;
  std::string weights_text =
      fmt::format("; weights {} on the GPU", format_bytes(static_cast<double>(model->weight_bytes())));
  if (fp8_projections > 0)
    weights_text += fmt::format(" (fp8 e4m3 GEMMs for {} of {} projections, {} scales{})",
                                fp8_projections, projections, model->fp8_scale_mode_name(),
                                spec.weight_quantization ? ", --quantization fp8: per channel, dynamic per token"
                                                         : ", " + config.fp8->describe());
  else if (config.fp8)
    weights_text += fmt::format(" (bf16, dequantized from the checkpoint's fp8: {}; a scheme the GPU's fp8 GEMMs do "
                                "not run)", config.fp8->describe());
  else
    weights_text += " (bf16)";
  RunnerSetup setup;
  setup.spec = spec;
  setup.config = config;
  setup.block_size = spec.block_size;
  setup.weight_bytes = static_cast<int64_t>(model->weight_bytes());
  setup.kv_bytes_per_token = static_cast<int64_t>(pool_shape(config, spec, 1).bytes_per_token());

  cuda::CudaRunnerOptions runner_options;
  runner_options.gpu_memory_utilization = spec.gpu_memory_utilization;
  runner_options.print_report = false;  // part of our report
  if (spec.kv_cache_memory > 0) {
    const int64_t blocks = spec.kv_cache_memory / (setup.kv_bytes_per_token * spec.block_size);
    if (blocks < 1)
      return invalid_argument_error("--kv-cache-memory {}: holds no KV block of {} tokens ({} per token)",
                                    spec.kv_cache_memory, spec.block_size,
                                    format_bytes(static_cast<double>(setup.kv_bytes_per_token)));
    runner_options.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  } else if (req.size_pool_to_request && req.min_kv_tokens > 0) {
    runner_options.num_blocks = static_cast<int32_t>(blocks_for_tokens(req.min_kv_tokens, spec.block_size));
  }
  PAGODA_ASSIGN_OR_RETURN(runner_options.num_host_blocks, host_tier_blocks(spec, setup.kv_bytes_per_token));
  auto runner = cuda::CudaModelRunner::create(std::move(model), runner_options);
  if (!runner.ok()) {
    if (runner.status().message().find("host KV tier") != std::string::npos)
      return runner.status().with_context(
          fmt::format("--kv-offload-memory {}", format_bytes(static_cast<double>(spec.kv_offload_memory))));
    return runner.status().with_context(fmt::format("allocating the KV pool ({}, --gpu-memory-utilization {})",
                                                    kv_dtype_flags_text(spec), spec.gpu_memory_utilization));
  }
  setup.num_blocks = (*runner)->num_blocks();
  setup.num_host_blocks = runner_options.num_host_blocks;
  setup.max_model_len = (*runner)->max_context_length();
  if (setup.kv_pool_tokens() < req.min_kv_tokens)
    return resource_exhausted_error("the KV pool holds {} tokens, this run needs {} (raise --gpu-memory-utilization "
                                    "or --kv-cache-memory)", setup.kv_pool_tokens(), req.min_kv_tokens);
  const std::string pool_report = (*runner)->kv_pool_report();
  setup.runner = std::move(*runner);

  std::vector<std::string> lines;
  lines.push_back("device: cuda (" + device_text + ")");
  lines.push_back(model_summary(config, spec) + weights_text);
  add_kv_report(setup, lines);
  lines.insert(lines.end() - 1, pool_report);
  lines.insert(lines.end() - 1, kv_tiers_line(setup, /*pinned=*/true));
  for (const std::string& l : lines) setup.report += l + "\n";
  return setup;
}

}  // namespace pagoda::backend
