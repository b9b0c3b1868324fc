#include "pagoda/backend/cpu/random_deepseek_model.h"

#include <algorithm>

#include "pagoda/backend/cpu/random_matrices.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/random_weights.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda {

namespace {

std::vector<float> filled(int64_t n, float value) { return std::vector<float>(static_cast<size_t>(n), value); }

}  // namespace

size_t random_deepseek_weight_bytes(const ModelConfig& c) {
  const MlaConfig& m = *c.mla;
  const MoeConfig& e = *c.moe;
  const size_t hidden = static_cast<size_t>(c.hidden_size), heads = static_cast<size_t>(c.num_q_heads);
  const size_t q_out = heads * static_cast<size_t>(m.qk_head_dim());
  size_t attention = m.q_lora_rank == 0 ? q_out * hidden
                                        : static_cast<size_t>(m.q_lora_rank) * (hidden + q_out);
  attention += static_cast<size_t>(m.latent_dim()) * hidden +
               heads * static_cast<size_t>(m.qk_nope_head_dim + m.v_head_dim) * static_cast<size_t>(m.kv_lora_rank) +
               hidden * heads * static_cast<size_t>(m.v_head_dim);
  const size_t dense_mlp = 3 * hidden * static_cast<size_t>(c.intermediate_size);
  const size_t moe_mlp = static_cast<size_t>(e.num_experts) * hidden +
                         3 * hidden * static_cast<size_t>(e.moe_intermediate_size) *
                             static_cast<size_t>(e.num_experts + e.num_shared_experts);
  const size_t dense_layers = static_cast<size_t>(std::min(e.first_k_dense_replace, c.num_layers));
  const size_t moe_layers = static_cast<size_t>(c.num_layers) - dense_layers;
  const size_t embeddings = static_cast<size_t>(c.vocab_size) * hidden * (c.tie_word_embeddings ? 1 : 2);
  return (attention * static_cast<size_t>(c.num_layers) + dense_mlp * dense_layers + moe_mlp * moe_layers +
          embeddings) * sizeof(float);
}

StatusOr<std::unique_ptr<CpuModel>> make_random_deepseek_cpu_model(const ModelConfig& c, uint64_t seed,
                                                                   size_t max_bytes) {
  const size_t bytes = random_deepseek_weight_bytes(c);
  if (bytes > max_bytes) {
    return resource_exhausted_error("random f32 weights of this {} config need {} of memory (more than the {} the "
                                    "CPU path allows)", c.architecture_name, format_bytes(static_cast<double>(bytes)),
                                    format_bytes(static_cast<double>(max_bytes)));
  }
  const MlaConfig& m = *c.mla;
  const MoeConfig& e = *c.moe;
  ModelWeights w;
  RandomMatrices random(seed, w.owned_f32);
  const int64_t hidden = c.hidden_size, heads = c.num_q_heads;
  const int64_t q_out = heads * m.qk_head_dim();
  w.embed_tokens = random.make(RandomMatrix::kEmbedTokens, -1, c.vocab_size, hidden);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    LayerWeights& l = w.layers[static_cast<size_t>(layer)];
    l.input_norm = filled(hidden, 1.0f);
    l.post_attention_norm = filled(hidden, 1.0f);
    MlaLayerWeights& a = l.mla;
    if (m.q_lora_rank == 0) {
      a.q_proj = random.make(RandomMatrix::kQProj, layer, q_out, hidden);
    } else {
      a.q_a_proj = random.make(RandomMatrix::kMlaQAProj, layer, m.q_lora_rank, hidden);
      a.q_a_norm = filled(m.q_lora_rank, 1.0f);
      a.q_b_proj = random.make(RandomMatrix::kMlaQBProj, layer, q_out, m.q_lora_rank);
      if (m.attention_bias) a.q_a_bias = filled(m.q_lora_rank, 0.0f);
    }
    a.kv_a_proj = random.make(RandomMatrix::kMlaKvAProj, layer, m.latent_dim(), hidden);
    if (m.attention_bias) a.kv_a_bias = filled(m.latent_dim(), 0.0f);
    a.kv_a_norm = filled(m.kv_lora_rank, 1.0f);
    a.kv_b_proj = random.make(RandomMatrix::kMlaKvBProj, layer, heads * (m.qk_nope_head_dim + m.v_head_dim),
                              m.kv_lora_rank);
    l.o_proj = random.make(RandomMatrix::kOProj, layer, hidden, heads * m.v_head_dim);
    if (m.attention_bias) l.o_bias = filled(hidden, 0.0f);
    if (!e.is_moe_layer(layer)) {
      l.gate_proj = random.make(RandomMatrix::kGateProj, layer, c.intermediate_size, hidden);
      l.up_proj = random.make(RandomMatrix::kUpProj, layer, c.intermediate_size, hidden);
      l.down_proj = random.make(RandomMatrix::kDownProj, layer, hidden, c.intermediate_size);
      continue;
    }
    MoeLayerWeights& moe = l.moe;
    moe.router = random.make(RandomMatrix::kMoeRouter, layer, e.num_experts, hidden);
    if (e.score_correction_bias) moe.score_correction_bias = filled(e.num_experts, 0.0f);
    moe.experts.resize(static_cast<size_t>(e.num_experts));
    for (int32_t x = 0; x < e.num_experts; ++x) {
      const int32_t key = random_expert_key(layer, x);
      ExpertWeights& ew = moe.experts[static_cast<size_t>(x)];
      ew.gate_proj = random.make(RandomMatrix::kMoeExpertGate, key, e.moe_intermediate_size, hidden);
      ew.up_proj = random.make(RandomMatrix::kMoeExpertUp, key, e.moe_intermediate_size, hidden);
      ew.down_proj = random.make(RandomMatrix::kMoeExpertDown, key, hidden, e.moe_intermediate_size);
    }
    if (e.num_shared_experts > 0) {
      const int64_t inter = e.shared_intermediate_size();
      moe.shared.gate_proj = random.make(RandomMatrix::kMoeSharedGate, layer, inter, hidden);
      moe.shared.up_proj = random.make(RandomMatrix::kMoeSharedUp, layer, inter, hidden);
      moe.shared.down_proj = random.make(RandomMatrix::kMoeSharedDown, layer, hidden, inter);
    }
  }
  w.final_norm = filled(hidden, 1.0f);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : random.make(RandomMatrix::kLmHead, -1, c.vocab_size, hidden);
  w.file_dtype = DType::kF32;
  w.upcast_to_f32 = false;
  return std::make_unique<CpuModel>(c, std::move(w));
}

}  // namespace pagoda
