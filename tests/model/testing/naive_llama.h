#pragma once
// A deliberately plain llama-family forward for tests: dense causal attention
// over the whole token sequence recomputed from scratch, double accumulation,
// no paging, no threads, written from the transformers modeling code and not
// from pagoda's kernels. The paged CpuModel must agree with it.

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/testing/tiny_checkpoint.h"

namespace pagoda::testing {

// Logits [tokens.size()][vocab] for every position of the sequence.
std::vector<std::vector<float>> naive_llama_logits(const nlohmann::json& config, const TensorMap& tensors,
                                                   const std::vector<int32_t>& tokens);

}  // namespace pagoda::testing
