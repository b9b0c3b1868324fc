#include "pagoda/model/model_weights.h"

#include <cmath>
#include <optional>
#include <utility>

#include "pagoda/core/thread_pool.h"
#include "pagoda/model/fp8_matrix.h"
#include "pagoda/model/weight_binder.h"

namespace pagoda {

namespace {

Status bind_layer(WeightBinder& b, const ModelConfig& c, int32_t index, LayerWeights& w) {
  if (c.mla) return bind_deepseek_layer(b, c, index, w);
  const std::string p = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_out = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  PAGODA_ASSIGN_OR_RETURN(w.input_norm, b.vector(p + "input_layernorm.weight", hidden));
  PAGODA_ASSIGN_OR_RETURN(w.post_attention_norm, b.vector(p + "post_attention_layernorm.weight", hidden));
  PAGODA_ASSIGN_OR_RETURN(w.q_proj, b.linear(p + "self_attn.q_proj", q_out, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.k_proj, b.linear(p + "self_attn.k_proj", kv_out, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.v_proj, b.linear(p + "self_attn.v_proj", kv_out, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.o_proj, b.linear(p + "self_attn.o_proj", hidden, q_out));
  if (c.qkv_bias) {
    PAGODA_ASSIGN_OR_RETURN(w.q_bias, b.vector(p + "self_attn.q_proj.bias", q_out));
    PAGODA_ASSIGN_OR_RETURN(w.k_bias, b.vector(p + "self_attn.k_proj.bias", kv_out));
    PAGODA_ASSIGN_OR_RETURN(w.v_bias, b.vector(p + "self_attn.v_proj.bias", kv_out));
  }
  if (c.o_proj_bias) {
    PAGODA_ASSIGN_OR_RETURN(w.o_bias, b.vector(p + "self_attn.o_proj.bias", hidden));
  }
  if (c.qk_norm) {
    PAGODA_ASSIGN_OR_RETURN(w.q_norm, b.vector(p + "self_attn.q_norm.weight", c.head_dim));
    PAGODA_ASSIGN_OR_RETURN(w.k_norm, b.vector(p + "self_attn.k_norm.weight", c.head_dim));
  }
  // ModelOpt names the KV scales after the projections (self_attn.k_proj.k_scale).
  const char* k_scale_name = b.has(p + "self_attn.k_scale") ? "self_attn.k_scale" : "self_attn.k_proj.k_scale";
  const char* v_scale_name = b.has(p + "self_attn.v_scale") ? "self_attn.v_scale" : "self_attn.v_proj.v_scale";
  PAGODA_ASSIGN_OR_RETURN(w.k_scale, b.optional_positive_scalar(p + k_scale_name));
  PAGODA_ASSIGN_OR_RETURN(w.v_scale, b.optional_positive_scalar(p + v_scale_name));
  PAGODA_ASSIGN_OR_RETURN(w.gate_proj, b.linear(p + "mlp.gate_proj", inter, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.up_proj, b.linear(p + "mlp.up_proj", inter, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.down_proj, b.linear(p + "mlp.down_proj", hidden, inter));
  if (c.mlp_bias) {
    PAGODA_ASSIGN_OR_RETURN(w.gate_bias, b.vector(p + "mlp.gate_proj.bias", inter));
    PAGODA_ASSIGN_OR_RETURN(w.up_bias, b.vector(p + "mlp.up_proj.bias", inter));
    PAGODA_ASSIGN_OR_RETURN(w.down_bias, b.vector(p + "mlp.down_proj.bias", hidden));
  }
  return ok_status();
}

// Replaces a view by an owned f32 copy (fp8: dequantized with its scales; the
// activation scheme stays, so the layer still rounds its input to fp8).
void upcast(WeightMatrix& m, std::vector<std::unique_ptr<float[]>>& owned) {
  if (m.dtype == DType::kF32) return;
  const size_t n = m.rows * m.cols;
  auto copy = std::make_unique<float[]>(n);
  if (m.dtype == DType::kFP8E4M3) {
    ThreadPool::global().parallel_for(m.rows, [&](size_t begin, size_t end) {
      dequantize_fp8_rows(m, begin, end, copy.get() + begin * m.cols);
    }, 64);
    Fp8MatrixScales activation_only;
    activation_only.activation = m.fp8.activation;
    activation_only.activation_group = m.fp8.activation_group;
    activation_only.input_scale = m.fp8.input_scale;
    m = WeightMatrix{DType::kF32, copy.get(), m.rows, m.cols, activation_only};
    owned.push_back(std::move(copy));
    return;
  }
  const size_t elem = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    convert_to_f32(m.dtype, static_cast<const char*>(m.data) + begin * elem, copy.get() + begin, end - begin);
  }, 1 << 16);
  m = WeightMatrix{DType::kF32, copy.get(), m.rows, m.cols};
  owned.push_back(std::move(copy));
}

}  // namespace

std::vector<const WeightMatrix*> LayerWeights::matrices() const {
  std::vector<const WeightMatrix*> out;
  auto add = [&out](const WeightMatrix& m) {
    if (m.data != nullptr) out.push_back(&m);
  };
  for (const WeightMatrix* m : {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj}) add(*m);
  for (const WeightMatrix* m : {&mla.q_proj, &mla.q_a_proj, &mla.q_b_proj, &mla.kv_a_proj, &mla.kv_b_proj}) add(*m);
  add(moe.router);
  for (const ExpertWeights& e : moe.experts) {
    add(e.gate_proj);
    add(e.up_proj);
    add(e.down_proj);
  }
  add(moe.shared.gate_proj);
  add(moe.shared.up_proj);
  add(moe.shared.down_proj);
  return out;
}

std::vector<WeightMatrix*> LayerWeights::matrices() {
  std::vector<WeightMatrix*> out;
  for (const WeightMatrix* m : std::as_const(*this).matrices()) out.push_back(const_cast<WeightMatrix*>(m));
  return out;
}

StatusOr<ModelWeights> bind_model_weights(const ModelConfig& config,
                                          std::shared_ptr<const Checkpoint> checkpoint,
                                          const WeightLoadOptions& options) {
  ModelWeights w;
  WeightBinder b(config, *checkpoint);
  const int64_t vocab = config.vocab_size, hidden = config.hidden_size;
  PAGODA_ASSIGN_OR_RETURN(w.embed_tokens, b.matrix("model.embed_tokens.weight", vocab, hidden));
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for (int32_t i = 0; i < config.num_layers; ++i)
    PAGODA_RETURN_IF_ERROR(bind_layer(b, config, i, w.layers[static_cast<size_t>(i)]));
  PAGODA_ASSIGN_OR_RETURN(w.final_norm, b.vector("model.norm.weight", hidden));
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    PAGODA_ASSIGN_OR_RETURN(w.lm_head, b.linear("lm_head", vocab, hidden));
  }
  w.file_dtype = b.dtype().value_or(DType::kF32);
  w.owned_f32 = b.take_owned_scales();
  w.fp8 = config.fp8;

  // Upcast when the f32 copy is small enough: sgemm straight on f32 beats
  // converting tiles on every step.
  size_t f32_bytes = (config.tie_word_embeddings ? 1 : 2) * w.embed_tokens.rows * w.embed_tokens.cols;
  for (const auto& l : w.layers) {
    for (const WeightMatrix* m : l.matrices()) f32_bytes += m->rows * m->cols;
  }
  f32_bytes *= sizeof(float);
  if (w.file_dtype != DType::kF32 && f32_bytes <= options.f32_cache_bytes) {
    if (options.progress)
      options.progress(fmt::format("converting {} weights to f32 ({} MiB)", dtype_name(w.file_dtype), f32_bytes >> 20));
    upcast(w.embed_tokens, w.owned_f32);
    if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
    else upcast(w.lm_head, w.owned_f32);
    for (auto& l : w.layers) {
      for (WeightMatrix* m : l.matrices()) upcast(*m, w.owned_f32);
    }
    w.upcast_to_f32 = true;
  }
  w.checkpoint = std::move(checkpoint);
  return w;
}

}  // namespace pagoda
