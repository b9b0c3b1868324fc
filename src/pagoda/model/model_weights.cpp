#include "pagoda/model/model_weights.h"

#include <cmath>
#include <optional>

#include "pagoda/core/thread_pool.h"

namespace pagoda {

namespace {

class WeightBinder {
 public:
  WeightBinder(const ModelConfig& config, const Checkpoint& ckpt) : config_(config), ckpt_(ckpt) {}

  StatusOr<const TensorInfo*> tensor(const std::string& name, std::vector<int64_t> shape) {
    const TensorInfo* t = ckpt_.find(name);
    if (t == nullptr) {
      return not_found_error("{}: missing tensor '{}' (expected shape {}) in {}", ckpt_.dir().string(),
                             name, shape_to_string(shape), ckpt_.source_name());
    }
    if (t->shape != shape) {
      return invalid_argument_error("{}/{}: tensor '{}' has shape {} but config.json implies {}",
                                    ckpt_.dir().string(), t->file_name, name, shape_to_string(t->shape),
                                    shape_to_string(shape));
    }
    const std::optional<DType> expected = config_.dtype ? config_.dtype : first_dtype_;
    if (expected && t->dtype != *expected) {
      return invalid_argument_error("{}/{}: tensor '{}' has dtype {} but {} is {}", ckpt_.dir().string(),
                                    t->file_name, name, dtype_name(t->dtype),
                                    config_.dtype ? "config.json torch_dtype" : "the rest of the checkpoint",
                                    dtype_name(*expected));
    }
    if (!first_dtype_) first_dtype_ = t->dtype;
    return t;
  }

  StatusOr<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) {
    PAGODA_ASSIGN_OR_RETURN(const TensorInfo* t, tensor(name, {rows, cols}));
    return WeightMatrix{t->dtype, t->data, static_cast<size_t>(rows), static_cast<size_t>(cols)};
  }

  StatusOr<std::vector<float>> vector(const std::string& name, int64_t size) {
    PAGODA_ASSIGN_OR_RETURN(const TensorInfo* t, tensor(name, {size}));
    std::vector<float> v(static_cast<size_t>(size));
    convert_to_f32(t->dtype, t->data, v.data(), v.size());
    return v;
  }

  // An optional scalar (shape [] or [1], any float dtype); 0 when absent. Errors:
  // another shape, or a value that is not finite and positive.
  StatusOr<float> optional_positive_scalar(const std::string& name) {
    const TensorInfo* t = ckpt_.find(name);
    if (t == nullptr) return 0.0f;
    if (!(t->shape.empty() || t->shape == std::vector<int64_t>{1})) {
      return invalid_argument_error("{}/{}: tensor '{}' has shape {} but a KV scale is a scalar ([] or [1])",
                                    ckpt_.dir().string(), t->file_name, name, shape_to_string(t->shape));
    }
    if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
      return invalid_argument_error("{}/{}: tensor '{}' has dtype {}; a KV scale is f32, f16 or bf16",
                                    ckpt_.dir().string(), t->file_name, name, dtype_name(t->dtype));
    }
    float value = 0.0f;
    convert_to_f32(t->dtype, t->data, &value, 1);
    if (!std::isfinite(value) || value <= 0.0f) {
      return invalid_argument_error("{}/{}: tensor '{}' is {}; a KV scale must be finite and positive",
                                    ckpt_.dir().string(), t->file_name, name, value);
    }
    return value;
  }

  std::optional<DType> dtype() const { return first_dtype_; }

 private:
  const ModelConfig& config_;
  const Checkpoint& ckpt_;
  std::optional<DType> first_dtype_;
};

Status bind_layer(WeightBinder& b, const ModelConfig& c, int32_t index, LayerWeights& w) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_out = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  PAGODA_ASSIGN_OR_RETURN(w.input_norm, b.vector(p + "input_layernorm.weight", hidden));
  PAGODA_ASSIGN_OR_RETURN(w.post_attention_norm, b.vector(p + "post_attention_layernorm.weight", hidden));
  PAGODA_ASSIGN_OR_RETURN(w.q_proj, b.matrix(p + "self_attn.q_proj.weight", q_out, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.k_proj, b.matrix(p + "self_attn.k_proj.weight", kv_out, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.v_proj, b.matrix(p + "self_attn.v_proj.weight", kv_out, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.o_proj, b.matrix(p + "self_attn.o_proj.weight", hidden, q_out));
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
  PAGODA_ASSIGN_OR_RETURN(w.k_scale, b.optional_positive_scalar(p + "self_attn.k_scale"));
  PAGODA_ASSIGN_OR_RETURN(w.v_scale, b.optional_positive_scalar(p + "self_attn.v_scale"));
  PAGODA_ASSIGN_OR_RETURN(w.gate_proj, b.matrix(p + "mlp.gate_proj.weight", inter, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.up_proj, b.matrix(p + "mlp.up_proj.weight", inter, hidden));
  PAGODA_ASSIGN_OR_RETURN(w.down_proj, b.matrix(p + "mlp.down_proj.weight", hidden, inter));
  if (c.mlp_bias) {
    PAGODA_ASSIGN_OR_RETURN(w.gate_bias, b.vector(p + "mlp.gate_proj.bias", inter));
    PAGODA_ASSIGN_OR_RETURN(w.up_bias, b.vector(p + "mlp.up_proj.bias", inter));
    PAGODA_ASSIGN_OR_RETURN(w.down_bias, b.vector(p + "mlp.down_proj.bias", hidden));
  }
  return ok_status();
}

// Replaces a view by an owned f32 copy.
void upcast(WeightMatrix& m, std::vector<std::unique_ptr<float[]>>& owned) {
  if (m.dtype == DType::kF32) return;
  const size_t n = m.rows * m.cols;
  auto copy = std::make_unique<float[]>(n);
  const size_t elem = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    convert_to_f32(m.dtype, static_cast<const char*>(m.data) + begin * elem, copy.get() + begin, end - begin);
  }, 1 << 16);
  m = WeightMatrix{DType::kF32, copy.get(), m.rows, m.cols};
  owned.push_back(std::move(copy));
}

}  // namespace

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
    PAGODA_ASSIGN_OR_RETURN(w.lm_head, b.matrix("lm_head.weight", vocab, hidden));
  }
  w.file_dtype = b.dtype().value_or(DType::kF32);

  // Upcast when the f32 copy is small enough: sgemm straight on f32 beats
  // converting tiles on every step.
  size_t f32_bytes = (config.tie_word_embeddings ? 1 : 2) * w.embed_tokens.rows * w.embed_tokens.cols;
  for (const auto& l : w.layers) {
    for (const auto* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      f32_bytes += m->rows * m->cols;
  }
  f32_bytes *= sizeof(float);
  if (w.file_dtype != DType::kF32 && f32_bytes <= options.f32_cache_bytes) {
    if (options.progress)
      options.progress(fmt::format("converting {} weights to f32 ({} MiB)", dtype_name(w.file_dtype), f32_bytes >> 20));
    upcast(w.embed_tokens, w.owned_f32);
    if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
    else upcast(w.lm_head, w.owned_f32);
    for (auto& l : w.layers) {
      for (auto* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
        upcast(*m, w.owned_f32);
    }
    w.upcast_to_f32 = true;
  }
  w.checkpoint = std::move(checkpoint);
  return w;
}

}  // namespace pagoda
