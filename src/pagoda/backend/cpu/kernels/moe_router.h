#pragma once
// The DeepSeek MoE router: from each token's router logits to its experts and
// their weights, as model/deepseek_config.h states (V2 softmax, greedy or
// group-limited by the group's best score; V3 sigmoid plus
// e_score_correction_bias for the choice, groups ranked by their two best
// choices, weights renormalized when norm_topk_prob; both scaled by
// routed_scaling_factor). Experts outside the chosen groups are never picked.
// Ties go to the lower expert (or group) index. This is the CPU reference of a
// fused GPU router.
//
// Thread safety: pure function.

#include <cstddef>
#include <cstdint>

#include "pagoda/model/deepseek_config.h"

namespace pagoda::kernels {

// logits: [num_tokens, config.num_experts] f32. correction_bias: [num_experts]
// (used when config.score_correction_bias; may be null otherwise).
// Writes indices and weights: [num_tokens, config.experts_per_token], experts in
// descending order of their choice score.
void moe_route(const float* logits, size_t num_tokens, const MoeConfig& config, const float* correction_bias,
               int32_t* indices, float* weights);

}  // namespace pagoda::kernels
