#pragma once
// The CUDA backend's part of the registry: checks for a Hopper GPU, loads (or
// makes on the GPU) the model, sizes the KV pool from free memory
// (--gpu-memory-utilization) or --kv-cache-memory, and writes its start-up
// report lines. Compiled only with the CUDA backend.
//
// Thread safety: call from one thread at start-up.

#include <string>

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"

namespace pagoda::backend {

[[nodiscard]] StatusOr<RunnerSetup> create_cuda_runner(const RunnerSpec& spec, const RunnerRequirements& requirements,
                                                       ModelConfig config);
// --tensor-parallel-size above 1 (cuda_tensor_parallel_backend.cpp): errors
// name the flag and the numbers (sizes that do not divide the heads, more
// ranks than GPUs), --quantization is not sharded on the GPU yet
// (kUnimplemented); random weights are each rank's own (not TP=1's model).
[[nodiscard]] StatusOr<RunnerSetup> create_cuda_tensor_parallel_runner(const RunnerSpec& spec,
                                                                       const RunnerRequirements& requirements,
                                                                       const ModelConfig& config,
                                                                       const std::string& device_text);

}  // namespace pagoda::backend
