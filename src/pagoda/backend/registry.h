#pragma once
// The backend registry: turns a RunnerSpec into a ModelRunner on the chosen
// device, each backend sizing its own KV pool and writing its own lines of the
// start-up report (cpu_backend.h, cuda_backend.h). The command line only parses
// flags (cli/runner_flags.h); everything device-specific happens here.
//
//   auto setup = backend::create_model_runner(spec, requirements);
//   std::fprintf(stderr, "%s", setup->report.c_str());
//
// Thread safety: call from one thread at start-up.

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"

namespace pagoda::backend {

// Loads (or makes) the model on spec.device and allocates its KV pool.
// kOutOfRange: requirements.sequence_tokens exceeds the context (before any
// load); kFailedPrecondition: the device is not available or not compiled in;
// errors caused by the KV dtypes name the flags that chose them.
[[nodiscard]] StatusOr<RunnerSetup> create_model_runner(const RunnerSpec& spec, const RunnerRequirements& requirements);

}  // namespace pagoda::backend
