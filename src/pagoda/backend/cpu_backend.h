#pragma once
// The CPU backend's part of the registry: loads (or makes) the CPU reference
// model, sizes its KV pool (--kv-cache-memory, or exactly what the request
// needs) and writes its start-up report lines.
//
// Thread safety: call from one thread at start-up.

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"

namespace pagoda::backend {

[[nodiscard]] StatusOr<RunnerSetup> create_cpu_runner(const RunnerSpec& spec, const RunnerRequirements& requirements,
                                                      ModelConfig config);

}  // namespace pagoda::backend
