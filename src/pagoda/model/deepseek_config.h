#pragma once
// The DeepSeek V2 / V3 parts of a ModelConfig: multi-head latent attention
// (MLA) and the mixture of experts (MoE), read from config.json exactly as
// transformers 5.x reads DeepseekV2Config / DeepseekV3Config (absent fields take
// transformers' defaults).
//
// MLA, per layer and token x (hidden):
//   q      = q_proj(x), or q_b_proj(rmsnorm(q_a_proj(x)))          [heads, nope + rope]
//   c, kr  = split(kv_a_proj_with_mqa(x), [kv_lora_rank, rope])
//   c      = rmsnorm(c) (kv_a_layernorm); kr = rope(kr)            cached: [c, kr] per token
//   k_h    = [W_UK_h c, kr], v_h = W_UV_h c  (kv_b_proj rows of head h: nope rows W_UK, then v rows W_UV)
//   out    = o_proj(concat_h softmax(q_h . k_h * softmax_scale) v_h)
// The rope part rotates pairs (2i, 2i+1) when rope_interleave (DeepSeek-V2
// always, V3 by config), else halves (i, i + rope/2).
//
// MoE (layers >= first_k_dense_replace; the others have a dense MLP of
// intermediate_size): router logits = gate(x) in f32;
//   V2: scores = softmax(logits); "greedy" top-k, or "group_limited_greedy":
//       the topk_group groups with the highest max score, then top-k inside them;
//       weight = score * routed_scaling_factor (norm_topk_prob is not applied by
//       transformers, so a V2 config that sets it is refused).
//   V3: scores = sigmoid(logits); choice = scores + e_score_correction_bias;
//       groups ranked by the sum of their two best choices, top-k of the choices
//       inside the topk_group best groups; weight = score (without the bias),
//       divided by the sum of the k weights (+1e-20) when norm_topk_prob, then
//       times routed_scaling_factor.
//   out = sum_k weight_k * expert_k(x) + shared_experts(x), each expert a SwiGLU
//   MLP of moe_intermediate_size (the shared one moe_intermediate_size x
//   n_shared_experts).
//
// Thread safety: plain data and functions.

#include <cstdint>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"

namespace pagoda {

struct ModelConfig;

struct MlaConfig {
  int32_t q_lora_rank = 0;  // 0: plain q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
  int32_t kv_lora_rank = 0;
  int32_t qk_nope_head_dim = 0;
  int32_t qk_rope_head_dim = 0;
  int32_t v_head_dim = 0;
  bool rope_interleave = true;
  bool attention_bias = false;  // q_a_proj, kv_a_proj_with_mqa and o_proj biases
  // qk_head_dim^-0.5, times DeepSeek's yarn mscale^2 (yarn_rope.h) for a yarn rope.
  float softmax_scale = 0.0f;
  // Multiplies the rope's cos and sin (yarn's attention factor; 1 otherwise).
  float rope_attention_factor = 1.0f;

  int32_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // One cached vector per token and layer: the latent, then the rope key.
  int32_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

enum class MoeScoring { kSoftmax, kSigmoid };
enum class MoeGroupScore {
  kNone,       // no group limit (V2 greedy)
  kMax,        // V2 group_limited_greedy: a group's best score
  kTopTwoSum,  // V3: the sum of a group's two best choice scores
};

struct MoeConfig {
  int32_t num_experts = 0;        // n_routed_experts
  int32_t experts_per_token = 0;  // num_experts_per_tok
  int32_t moe_intermediate_size = 0;
  int32_t num_shared_experts = 0;  // n_shared_experts; 0: none
  int32_t first_k_dense_replace = 0;
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeGroupScore group_score = MoeGroupScore::kNone;
  int32_t num_groups = 1;  // n_group
  int32_t topk_groups = 1; // topk_group
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  bool score_correction_bias = false;  // V3: mlp.gate.e_score_correction_bias

  bool is_moe_layer(int32_t layer) const { return layer >= first_k_dense_replace; }
  int32_t shared_intermediate_size() const { return moe_intermediate_size * num_shared_experts; }
};

// Fills cfg.mla, cfg.moe, the rope (default or yarn), attention biases and the
// cache geometry (num_kv_heads 1, head_dim = latent_dim) of a DeepSeek V2/V3
// config whose architecture is already set. Errors name the file and field:
// unsupported variants (another rope type, topk_method or scoring_func,
// moe_layer_freq != 1, V2 norm_topk_prob, mlp_bias, quantization_config) are
// kUnimplemented, inconsistent values kInvalidArgument.
Status parse_deepseek_config(const nlohmann::json& j, std::string_view source, ModelConfig& cfg);

}  // namespace pagoda
