#pragma once
// The CUDA backend's part of the registry: checks for a Hopper GPU, loads (or
// makes on the GPU) the model, sizes the KV pool from free memory
// (--gpu-memory-utilization) or --kv-cache-memory, and writes its start-up
// report lines. Compiled only with the CUDA backend.
//
// Thread safety: call from one thread at start-up.

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"

namespace pagoda::backend {

[[nodiscard]] StatusOr<RunnerSetup> create_cuda_runner(const RunnerSpec& spec, const RunnerRequirements& requirements,
                                                       ModelConfig config);

}  // namespace pagoda::backend
