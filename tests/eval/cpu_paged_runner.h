#pragma once
// Tests' way to a PagedRunner on the CPU: a CpuModelRunner over a shared model
// with the KV settings of `options` and a pool for max_sequence_tokens.

#include <memory>

#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/eval/paged_runner.h"

namespace pagoda::eval {

inline StatusOr<std::unique_ptr<PagedRunner>> make_cpu_paged_runner(std::shared_ptr<CpuModel> model,
                                                                    const PagedRunnerOptions& options) {
  if (options.block_size < 1 || options.block_size > 256)
    return invalid_argument_error("block size must be in 1..256, got {}", options.block_size);
  if (options.max_sequence_tokens < 1)
    return invalid_argument_error("max sequence tokens must be positive, got {}", options.max_sequence_tokens);
  const DType key = options.key_dtype.value_or(options.kv_dtype.value_or(DType::kF32));
  const DType value = options.value_dtype.value_or(options.kv_dtype.value_or(DType::kF32));
  PAGODA_ASSIGN_OR_RETURN(auto runner, CpuModelRunner::create(std::move(model), options.num_kv_blocks(),
                                                              options.block_size, key, value));
  return PagedRunner::create(std::move(runner), options);
}

}  // namespace pagoda::eval
