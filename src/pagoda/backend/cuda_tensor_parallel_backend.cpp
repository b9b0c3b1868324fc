// --tensor-parallel-size N on --device cuda (docs/TENSOR_PARALLEL.md): the
// checkpoint's weights bound once (mmapped), sharded per rank and uploaded to
// rank r's GPU, one CudaTensorParallelRunner over NCCL (or, behind the hidden
// --tensor-parallel-same-device, every rank on GPU 0 through the same-device
// communicator, for tests).
#include <cuda_runtime_api.h>

#include <algorithm>

#include <fmt/format.h>

#include "pagoda/backend/cuda/cuda_tensor_parallel_runner.h"
#include "pagoda/backend/cuda_backend.h"
#include "pagoda/backend/startup_report.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::backend {

StatusOr<RunnerSetup> create_cuda_tensor_parallel_runner(const RunnerSpec& spec, const RunnerRequirements& req,
                                                         const ModelConfig& config, const std::string& device_text) {
  const int32_t tp = spec.tensor_parallel_size;
  PAGODA_RETURN_IF_ERROR(check_tensor_parallel(config, tp));
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (!spec.tensor_parallel_same_device && tp > gpus)
    return invalid_argument_error("--tensor-parallel-size {}: more ranks than the {} visible GPU(s) (one rank per "
                                  "GPU)", tp, gpus);
  if (spec.weight_quantization && *spec.weight_quantization != DType::kFP8E4M3)
    return invalid_argument_error("--quantization {}: --device cuda runs fp8 weight quantization only",
                                  dtype_name(*spec.weight_quantization));
  if (spec.weight_quantization && config.fp8)
    return invalid_argument_error("--quantization fp8: {} is already quantized ({}); --quantization needs f32, f16 or "
                                  "bf16 weights", spec.config_path, config.fp8->describe());
  if (spec.kv_cross_layer_share != 1)
    return unimplemented_error("--kv-cross-layer-share {} cannot be combined with --tensor-parallel-size {} yet",
                               spec.kv_cross_layer_share, tp);

  cuda::CudaTensorParallelOptions options;
  options.model.max_num_seqs = spec.max_num_seqs;
  options.model.max_num_tokens = std::max(spec.max_tokens_per_step, req.prompt_tokens);
  options.model.max_model_len = req.sequence_tokens > 0 ? req.sequence_tokens : config.max_position_embeddings;
  options.model.block_size = spec.block_size;
  options.model.show_progress = req.show_progress;
  options.model.kv_key_dtype = spec.key_dtype;
  options.model.kv_value_dtype = spec.value_dtype;
  options.same_device = spec.tensor_parallel_same_device;
  // --quantization fp8: each rank quantizes its own slices on upload (per output channel), so the
  // column-parallel projections get TP=1's scales and the row-parallel ones a scale per row over the rank's columns.
  options.model.fp8_weights = spec.weight_quantization.has_value();

  RunnerSetup setup;
  setup.spec = spec;
  setup.config = config;
  setup.block_size = spec.block_size;
  // Every rank's pool together (each rank holds its KV heads of every block); rank 0 holds as many as any rank.
  const ModelConfig rank0 = shard_config(config, tensor_shard(config, 0, tp));
  const int64_t rank_bytes_per_token = static_cast<int64_t>(pool_shape(rank0, spec, 1).bytes_per_token());
  setup.kv_bytes_per_token = static_cast<int64_t>(tp) * rank_bytes_per_token;

  options.runner.gpu_memory_utilization = spec.gpu_memory_utilization;
  options.runner.print_report = false;
  if (spec.kv_cache_memory > 0) {
    // The whole group's bytes, as on the CPU.
    const int64_t blocks = spec.kv_cache_memory / (setup.kv_bytes_per_token * spec.block_size);
    if (blocks < 1)
      return invalid_argument_error("--kv-cache-memory {}: holds no KV block of {} tokens ({} per token over {} ranks)",
                                    spec.kv_cache_memory, spec.block_size,
                                    format_bytes(static_cast<double>(setup.kv_bytes_per_token)), tp);
    options.runner.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  } else if ((req.size_pool_to_request || spec.tensor_parallel_same_device) && req.min_kv_tokens > 0) {
    options.runner.num_blocks = static_cast<int32_t>(blocks_for_tokens(req.min_kv_tokens, spec.block_size));
  } else if (spec.tensor_parallel_same_device) {
    return invalid_argument_error("--tensor-parallel-same-device: give --kv-cache-memory (the ranks share one GPU)");
  }
  // Each rank's host tier holds its own heads of every host block.
  PAGODA_ASSIGN_OR_RETURN(options.runner.num_host_blocks, host_tier_blocks(spec, setup.kv_bytes_per_token));

  StatusOr<std::unique_ptr<cuda::CudaTensorParallelRunner>> group = internal_error("no runner");
  if (spec.load_format == LoadFormat::kRandom) {
    // Each rank's own random shard: for benchmarks of real shapes, not TP=1's model.
    group = cuda::CudaTensorParallelRunner::create_random(config, spec.weight_seed, tp, options);
  } else {
    if (req.progress)
      req.progress("loading " + spec.model_dir + " to the GPUs, sharded over " + std::to_string(tp) + " ranks");
    PAGODA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(spec.model_dir));
    WeightLoadOptions bind_options;
    bind_options.f32_cache_bytes = 0;  // mmapped views; each rank converts its slices on upload
    PAGODA_ASSIGN_OR_RETURN(
        ModelWeights weights,
        bind_model_weights(config, std::make_shared<const Checkpoint>(std::move(checkpoint)), bind_options));
    group = cuda::CudaTensorParallelRunner::create(config, std::make_shared<const ModelWeights>(std::move(weights)),
                                                   tp, options);
  }
  if (!group.ok())
    return group.status().with_context(fmt::format("--tensor-parallel-size {} ({}, --gpu-memory-utilization {})", tp,
                                                   kv_dtype_flags_text(spec), spec.gpu_memory_utilization));
  cuda::CudaTensorParallelRunner& runner = **group;
  setup.weight_bytes = 0;
  for (int32_t r = 0; r < tp; ++r) setup.weight_bytes += static_cast<int64_t>(runner.rank(r).model().weight_bytes());
  setup.num_blocks = runner.kv_geometry().num_blocks;
  setup.num_host_blocks = options.runner.num_host_blocks;
  setup.max_model_len = runner.max_context_length();
  if (setup.kv_pool_tokens() < req.min_kv_tokens)
    return resource_exhausted_error("the KV pool holds {} tokens, this run needs {} (raise --gpu-memory-utilization "
                                    "or --kv-cache-memory)", setup.kv_pool_tokens(), req.min_kv_tokens);
  const std::string pool_report = runner.rank(0).kv_pool_report();
  setup.runner = std::move(*group);

  const TensorShard s = tensor_shard(config, 0, tp);
  std::vector<std::string> lines;
  lines.push_back("device: cuda (" + device_text + ")");
  lines.push_back(fmt::format("tensor parallel: {} ranks, {}; per rank {} of {} attention heads, {} of {} KV heads{}, "
                              "{} of {} MLP features, {} vocabulary rows; {}",
                              tp, spec.tensor_parallel_same_device
                                      ? "all on GPU 0 (--tensor-parallel-same-device: a test mode, not faster)"
                                      : "one GPU and host thread each over NCCL",
                              s.num_q_heads, config.num_q_heads, s.num_kv_heads, config.num_kv_heads,
                              config.num_kv_heads < tp ? " (replicated)" : "", s.intermediate_size,
                              config.intermediate_size, s.vocab_chunk,
                              cuda::tensor_parallel_cuda_graphs_requested()
                                  ? "decode steps in CUDA graphs, one per rank (PAGODA_TP_CUDA_GRAPHS=1: experimental)"
                                  : "steps run eagerly (CUDA graphs across ranks: PAGODA_TP_CUDA_GRAPHS=1, "
                                    "experimental)"));
  lines.push_back(model_summary(config, spec) +
                  fmt::format("; weights {} over the ranks ({}{})", format_bytes(static_cast<double>(setup.weight_bytes)),
                              spec.weight_quantization
                                  ? "fp8 e4m3, --quantization fp8: each rank's slices per channel, dynamic per token"
                                  : config.fp8 ? "the checkpoint's fp8 (" + config.fp8->describe() +
                                                     ") sliced with its scales, or bf16 where the GPU does not run it"
                                               : std::string("bf16"),
                              spec.load_format == LoadFormat::kRandom
                                  ? ", random: each rank its own shard from seed + rank, every rank the whole "
                                    "vocabulary's embedding and lm_head rows"
                                  : ""));
  add_kv_report(setup, lines);
  lines.insert(lines.end() - 1, "rank 0 " + pool_report + " (every rank the same blocks)");
  lines.insert(lines.end() - 1, kv_tiers_line(setup, /*pinned=*/true));
  for (const std::string& l : lines) setup.report += l + "\n";
  return setup;
}

}  // namespace pagoda::backend
