#include "pagoda/model/deepseek_weights.h"

#include <string>

#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"
#include "pagoda/model/weight_binder.h"

namespace pagoda {

namespace {

Status bind_attention(WeightBinder& b, const ModelConfig& c, const std::string& p, LayerWeights& w) {
  const MlaConfig& m = *c.mla;
  MlaLayerWeights& a = w.mla;
  const int64_t hidden = c.hidden_size;
  const int64_t heads = c.num_q_heads;
  const int64_t q_out = heads * m.qk_head_dim();
  if (m.q_lora_rank == 0) {
    PAGODA_ASSIGN_OR_RETURN(a.q_proj, b.matrix(p + "self_attn.q_proj.weight", q_out, hidden));
  } else {
    PAGODA_ASSIGN_OR_RETURN(a.q_a_proj, b.matrix(p + "self_attn.q_a_proj.weight", m.q_lora_rank, hidden));
    if (m.attention_bias) {
      PAGODA_ASSIGN_OR_RETURN(a.q_a_bias, b.vector(p + "self_attn.q_a_proj.bias", m.q_lora_rank));
    }
    PAGODA_ASSIGN_OR_RETURN(a.q_a_norm, b.vector(p + "self_attn.q_a_layernorm.weight", m.q_lora_rank));
    PAGODA_ASSIGN_OR_RETURN(a.q_b_proj, b.matrix(p + "self_attn.q_b_proj.weight", q_out, m.q_lora_rank));
  }
  PAGODA_ASSIGN_OR_RETURN(a.kv_a_proj, b.matrix(p + "self_attn.kv_a_proj_with_mqa.weight", m.latent_dim(), hidden));
  if (m.attention_bias) {
    PAGODA_ASSIGN_OR_RETURN(a.kv_a_bias, b.vector(p + "self_attn.kv_a_proj_with_mqa.bias", m.latent_dim()));
  }
  PAGODA_ASSIGN_OR_RETURN(a.kv_a_norm, b.vector(p + "self_attn.kv_a_layernorm.weight", m.kv_lora_rank));
  PAGODA_ASSIGN_OR_RETURN(a.kv_b_proj, b.matrix(p + "self_attn.kv_b_proj.weight",
                                                heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank));
  PAGODA_ASSIGN_OR_RETURN(w.o_proj, b.matrix(p + "self_attn.o_proj.weight", hidden, heads * m.v_head_dim));
  if (m.attention_bias) {
    PAGODA_ASSIGN_OR_RETURN(w.o_bias, b.vector(p + "self_attn.o_proj.bias", hidden));
  }
  return ok_status();
}

StatusOr<ExpertWeights> bind_mlp(WeightBinder& b, const std::string& p, int64_t hidden, int64_t inter) {
  ExpertWeights e;
  PAGODA_ASSIGN_OR_RETURN(e.gate_proj, b.matrix(p + "gate_proj.weight", inter, hidden));
  PAGODA_ASSIGN_OR_RETURN(e.up_proj, b.matrix(p + "up_proj.weight", inter, hidden));
  PAGODA_ASSIGN_OR_RETURN(e.down_proj, b.matrix(p + "down_proj.weight", hidden, inter));
  return e;
}

// Rows [first, first + rows) of a matrix stored row-major in the file: a view.
WeightMatrix row_block(const TensorInfo& t, size_t first, size_t rows, size_t cols) {
  const size_t element_bytes = static_cast<size_t>(dtype_bits(t.dtype) / 8);
  return WeightMatrix{t.dtype, static_cast<const char*>(t.data) + first * cols * element_bytes, rows, cols};
}

Status bind_experts(WeightBinder& b, const ModelConfig& c, const std::string& p, MoeLayerWeights& moe) {
  const MoeConfig& e = *c.moe;
  const int64_t hidden = c.hidden_size, inter = e.moe_intermediate_size;
  moe.experts.resize(static_cast<size_t>(e.num_experts));
  if (b.has(p + "mlp.experts.gate_up_proj")) {
    // The fused layout transformers keeps in memory: gate rows, then up rows, per expert.
    PAGODA_ASSIGN_OR_RETURN(const TensorInfo* gate_up,
                            b.tensor(p + "mlp.experts.gate_up_proj", {e.num_experts, 2 * inter, hidden}));
    PAGODA_ASSIGN_OR_RETURN(const TensorInfo* down, b.tensor(p + "mlp.experts.down_proj", {e.num_experts, hidden, inter}));
    for (int64_t x = 0; x < e.num_experts; ++x) {
      ExpertWeights& ew = moe.experts[static_cast<size_t>(x)];
      ew.gate_proj = row_block(*gate_up, static_cast<size_t>(x * 2 * inter), inter, hidden);
      ew.up_proj = row_block(*gate_up, static_cast<size_t>(x * 2 * inter + inter), inter, hidden);
      ew.down_proj = row_block(*down, static_cast<size_t>(x * hidden), hidden, inter);
    }
    return ok_status();
  }
  for (int64_t x = 0; x < e.num_experts; ++x) {
    PAGODA_ASSIGN_OR_RETURN(moe.experts[static_cast<size_t>(x)],
                            bind_mlp(b, p + "mlp.experts." + std::to_string(x) + ".", hidden, inter));
  }
  return ok_status();
}

}  // namespace

Status bind_deepseek_layer(WeightBinder& b, const ModelConfig& c, int32_t index, LayerWeights& w) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size;
  PAGODA_ASSIGN_OR_RETURN(w.input_norm, b.vector(p + "input_layernorm.weight", hidden));
  PAGODA_ASSIGN_OR_RETURN(w.post_attention_norm, b.vector(p + "post_attention_layernorm.weight", hidden));
  PAGODA_RETURN_IF_ERROR(bind_attention(b, c, p, w));

  if (!c.moe->is_moe_layer(index)) {
    PAGODA_ASSIGN_OR_RETURN(ExpertWeights dense, bind_mlp(b, p + "mlp.", hidden, c.intermediate_size));
    w.gate_proj = dense.gate_proj;
    w.up_proj = dense.up_proj;
    w.down_proj = dense.down_proj;
    return ok_status();
  }
  const MoeConfig& e = *c.moe;
  PAGODA_ASSIGN_OR_RETURN(w.moe.router, b.matrix(p + "mlp.gate.weight", e.num_experts, hidden));
  if (e.score_correction_bias) {
    PAGODA_ASSIGN_OR_RETURN(w.moe.score_correction_bias,
                            b.vector_any_float(p + "mlp.gate.e_score_correction_bias", e.num_experts));
  }
  PAGODA_RETURN_IF_ERROR(bind_experts(b, c, p, w.moe));
  if (e.num_shared_experts > 0) {
    PAGODA_ASSIGN_OR_RETURN(w.moe.shared, bind_mlp(b, p + "mlp.shared_experts.", hidden, e.shared_intermediate_size()));
  }
  return ok_status();
}

}  // namespace pagoda
