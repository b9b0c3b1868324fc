#pragma once
// What a backend is asked to build (RunnerSpec: the model, device and KV
// settings, already checked by the command line), what the command needs beyond
// that (RunnerRequirements), and what comes back (RunnerSetup: the ModelRunner,
// its KV geometry and the start-up report). See backend/registry.h.
//
// Thread safety: plain data.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "pagoda/core/dtype.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::backend {

enum class Device { kCpu, kCuda };
enum class LoadFormat {
  kAuto,    // config.json + safetensors from model_dir
  kRandom,  // config.json only; random weights (bf16 on the GPU, f32 on the CPU)
};
std::string_view device_name(Device device);

// The model/device/KV settings, checked and with the device's defaults filled in.
struct RunnerSpec {
  Device device = Device::kCpu;
  LoadFormat load_format = LoadFormat::kAuto;
  std::string model_dir;    // directory of the checkpoint (tokenizer.json, chat template); empty for a bare config file
  std::string config_path;  // config.json that defines the model
  DType key_dtype = DType::kF32;
  DType value_dtype = DType::kF32;
  int32_t block_size = 16;
  int64_t kv_cache_memory = 0;  // > 0: a pool of this many bytes; 0: see RunnerRequirements / utilization
  int64_t kv_offload_memory = 0;  // > 0: a host tier of this many bytes (pinned on cuda); 0: none
  int32_t kv_cross_layer_share = 1;  // --kv-cross-layer-share K (runtime/cross_layer_share.h); 1: off
  double gpu_memory_utilization = 0.9;
  int32_t max_num_seqs = 64;
  int32_t max_tokens_per_step = 512;
  int32_t max_model_len = 0;
  uint64_t weight_seed = 0;
  // --tensor-parallel-size: ranks the model is sharded over (docs/TENSOR_PARALLEL.md); 1: none.
  int32_t tensor_parallel_size = 1;
  // --tensor-parallel-same-device (hidden, tests only): every cuda rank on GPU 0
  // through the same-device communicator instead of one GPU each over NCCL.
  bool tensor_parallel_same_device = false;
  // --quantization (CPU only): kInt8 or kInt4 weights, block-quantized at load; none: as loaded.
  std::optional<DType> weight_quantization;
};

// What the command needs beyond the spec.
struct RunnerRequirements {
  // generate: the sequence's prompt + output tokens. Without a KV memory size the
  // CPU pool is exactly this big; on either device a smaller pool is an error.
  int64_t min_kv_tokens = 0;
  // > 0 (generate): the longest sequence that will run, so the CUDA model sizes
  // its block tables and scratch for it rather than for the whole context.
  int32_t sequence_tokens = 0;
  // generate: the prompt runs in one forward of this many tokens.
  int32_t prompt_tokens = 0;
  // With no KV memory size given: a pool of exactly min_kv_tokens on every
  // device (eval's runners), instead of the GPU's free memory.
  bool size_pool_to_request = false;
  bool show_progress = true;  // the CUDA weight-upload progress bar on stderr
  // Progress lines while loading (checkpoint files, conversions); null: quiet.
  std::function<void(const std::string&)> progress;
};

struct RunnerSetup {
  std::unique_ptr<runtime::ModelRunner> runner;
  RunnerSpec spec;
  ModelConfig config;          // as run (max_model_len applied)
  int32_t max_model_len = 0;   // longest sequence: the context, or RunnerRequirements::sequence_tokens
  int32_t num_blocks = 0;      // of the runner's KV pool (= runner->kv_geometry().num_blocks)
  int32_t num_host_blocks = 0; // of the runner's host pool (= runner->capabilities().host_kv_blocks)
  int32_t block_size = 0;
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;  // K + V over all layers, scales included
  std::string report;              // the start-up report: a few lines, each ending in '\n'

  int64_t kv_pool_tokens() const { return static_cast<int64_t>(num_blocks) * block_size; }
  // Requests of max_model_len tokens the pool holds at once.
  int64_t max_concurrent_full_requests() const;
};

}  // namespace pagoda::backend
