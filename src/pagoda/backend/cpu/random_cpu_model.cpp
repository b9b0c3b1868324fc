#include "pagoda/backend/cpu/random_cpu_model.h"

#include <cmath>

#include "pagoda/backend/cpu/random_deepseek_model.h"
#include "pagoda/backend/cpu/random_matrices.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/random_weights.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda {

namespace {

std::vector<float> ones(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 1.0f); }
std::vector<float> zeros(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

}  // namespace

size_t random_cpu_weight_bytes(const ModelConfig& c) {
  if (c.mla) return random_deepseek_weight_bytes(c);
  const size_t hidden = c.hidden_size, inter = c.intermediate_size;
  const size_t q_out = static_cast<size_t>(c.num_q_heads) * c.head_dim;
  const size_t kv_out = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t per_layer = q_out * hidden * 2 + kv_out * hidden * 2 + inter * hidden * 3;
  const size_t embeddings = static_cast<size_t>(c.vocab_size) * hidden * (c.tie_word_embeddings ? 1 : 2);
  return (per_layer * static_cast<size_t>(c.num_layers) + embeddings) * sizeof(float);
}

StatusOr<std::unique_ptr<CpuModel>> make_random_cpu_model(const ModelConfig& c, uint64_t seed, size_t max_bytes) {
  if (c.mla) return make_random_deepseek_cpu_model(c, seed, max_bytes);
  const size_t bytes = random_cpu_weight_bytes(c);
  if (bytes > max_bytes) {
    return resource_exhausted_error(
        "random f32 weights of this {} config need {} of memory (more than the {} the CPU path allows); "
        "use --device cuda, which makes bf16 weights on the GPU", c.architecture_name, format_bytes(bytes),
        format_bytes(max_bytes));
  }
  ModelWeights w;
  RandomMatrices random(seed, w.owned_f32);
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_out = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  w.embed_tokens = random.make(RandomMatrix::kEmbedTokens, -1, c.vocab_size, hidden);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    LayerWeights& l = w.layers[static_cast<size_t>(layer)];
    l.input_norm = ones(hidden);
    l.post_attention_norm = ones(hidden);
    l.q_proj = random.make(RandomMatrix::kQProj, layer, q_out, hidden);
    l.k_proj = random.make(RandomMatrix::kKProj, layer, kv_out, hidden);
    l.v_proj = random.make(RandomMatrix::kVProj, layer, kv_out, hidden);
    l.o_proj = random.make(RandomMatrix::kOProj, layer, hidden, q_out);
    if (c.qkv_bias) {
      l.q_bias = zeros(q_out);
      l.k_bias = zeros(kv_out);
      l.v_bias = zeros(kv_out);
    }
    if (c.o_proj_bias) l.o_bias = zeros(hidden);
    if (c.qk_norm) {
      l.q_norm = ones(c.head_dim);
      l.k_norm = ones(c.head_dim);
    }
    l.gate_proj = random.make(RandomMatrix::kGateProj, layer, inter, hidden);
    l.up_proj = random.make(RandomMatrix::kUpProj, layer, inter, hidden);
    l.down_proj = random.make(RandomMatrix::kDownProj, layer, hidden, inter);
    if (c.mlp_bias) {
      l.gate_bias = zeros(inter);
      l.up_bias = zeros(inter);
      l.down_bias = zeros(hidden);
    }
  }
  w.final_norm = ones(hidden);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : random.make(RandomMatrix::kLmHead, -1, c.vocab_size, hidden);
  w.file_dtype = DType::kF32;
  w.upcast_to_f32 = false;
  return std::make_unique<CpuModel>(c, std::move(w));
}

}  // namespace pagoda
