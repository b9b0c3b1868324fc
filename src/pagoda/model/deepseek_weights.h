#pragma once
// The weights of a DeepSeek V2/V3 layer beyond the llama family's
// (model/deepseek_config.h says what they compute), bound from the tensor
// names transformers 5.x writes and the Hub's checkpoints use:
//   self_attn.q_proj | q_a_proj (+bias) + q_a_layernorm + q_b_proj,
//   self_attn.kv_a_proj_with_mqa (+bias), kv_a_layernorm, kv_b_proj, o_proj (+bias);
//   MoE layers: mlp.gate.weight, mlp.gate.e_score_correction_bias (V3, any float
//   dtype), mlp.experts.E.{gate,up,down}_proj.weight for every expert E (or the
//   fused mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I] that
//   transformers holds in memory), mlp.shared_experts.{gate,up,down}_proj.weight.
// A missing tensor is named in the error (e.g. the one expert's up_proj).
//
// Thread safety: immutable after binding.

#include <cstdint>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/model/weight_matrix.h"

namespace pagoda {

struct ModelConfig;
struct LayerWeights;
class WeightBinder;

struct MlaLayerWeights {
  WeightMatrix q_proj;          // [heads * qk_head_dim, hidden]; empty with q LoRA
  WeightMatrix q_a_proj;        // [q_lora_rank, hidden]
  WeightMatrix q_b_proj;        // [heads * qk_head_dim, q_lora_rank]
  std::vector<float> q_a_bias;  // [q_lora_rank] with attention_bias
  std::vector<float> q_a_norm;  // [q_lora_rank]
  WeightMatrix kv_a_proj;       // [kv_lora_rank + qk_rope_head_dim, hidden] (kv_a_proj_with_mqa)
  std::vector<float> kv_a_bias; // with attention_bias
  std::vector<float> kv_a_norm; // [kv_lora_rank]
  WeightMatrix kv_b_proj;       // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
};

struct ExpertWeights {
  WeightMatrix gate_proj;  // [intermediate, hidden]
  WeightMatrix up_proj;    // [intermediate, hidden]
  WeightMatrix down_proj;  // [hidden, intermediate]
};

struct MoeLayerWeights {
  WeightMatrix router;                      // [num_experts, hidden] (mlp.gate.weight)
  std::vector<float> score_correction_bias; // [num_experts], V3 only
  std::vector<ExpertWeights> experts;       // routed experts; empty for a dense layer
  ExpertWeights shared;                     // empty matrices without shared experts
};

// Binds layer `index` of a DeepSeek config (config.mla and config.moe set):
// the attention into w.mla and w.o_proj / w.o_bias, the MLP into w.moe (MoE
// layers) or w.gate_proj / w.up_proj / w.down_proj (dense first layers).
Status bind_deepseek_layer(WeightBinder& binder, const ModelConfig& config, int32_t index, LayerWeights& w);

}  // namespace pagoda
