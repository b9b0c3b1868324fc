#pragma once
// `--load-format random --device cpu` for DeepSeek V2/V3 configs: the MLA and
// MoE weights of model/deepseek_weights.h made in memory with the recipe of
// model/random_weights.h (matrices uniform with standard deviation 0.02, norms
// 1, e_score_correction_bias 0), f32, reproducible from the seed. For small
// shapes (tests, demos): a DeepSeek-V2-Lite shape needs ~63 GiB as f32.
//
// Thread safety: plain functions; fills on ThreadPool::global().

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"

namespace pagoda {

// Bytes of the random f32 matrices of a DeepSeek config (config.mla and config.moe set).
size_t random_deepseek_weight_bytes(const ModelConfig& config);

// Errors: more than max_bytes of weights (kResourceExhausted, naming the size).
StatusOr<std::unique_ptr<CpuModel>> make_random_deepseek_cpu_model(const ModelConfig& config, uint64_t seed,
                                                                   size_t max_bytes);

}  // namespace pagoda
