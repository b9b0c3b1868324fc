#pragma once
// The attention of a DeepSeek V2/V3 layer on the CPU (model/deepseek_config.h):
// q (plain or LoRA) and the compressed kv from the normed hidden state, the
// latent normalized and the rope parts rotated, the cache vector [c, kr] written
// into the layer's latent pool, then attention over the paged latent in the
// absorbed form (kernels/mla_attention.h): the query's nope part is folded
// through W_UK (kv_b_proj's key rows, kept transposed in f32 per head), the
// attended latent expanded through W_UV (kv_b_proj's value rows, read in place),
// and o_proj. Nothing is ever decompressed per cached token.
//
// Thread safety: one forward at a time (scratch is reused); kernels run on
// ThreadPool::global().

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/backend/cpu/kernels/paged_kv.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"

namespace pagoda {

class CpuMlaAttention {
 public:
  // Precomputes the transposed W_UK of every layer. config.mla must be set and
  // `weights` bound for it; both must outlive this object.
  CpuMlaAttention(const ModelConfig& config, const ModelWeights& weights);

  // out[T, hidden] = attention of layer `layer` for the normed hidden states x[T, hidden].
  // slots: each token's pool slot (kernels::plan_kv_slots); kv: the layer's latent pool.
  void forward(int32_t layer, const float* x, size_t num_tokens, const int32_t* positions,
               std::span<const int64_t> slots, std::span<const kernels::PagedSequence> sequences,
               const kernels::PagedKvLayer& kv, float* out);

 private:
  const ModelConfig& config_;
  const ModelWeights& weights_;
  MlaConfig mla_;
  std::vector<float> inv_freq_;  // [qk_rope_head_dim / 2]
  // Per layer: W_UK_h^T as f32 [heads][kv_lora_rank][qk_nope_head_dim].
  std::vector<std::vector<float>> absorbed_keys_;

  // Scratch, reused across calls.
  std::vector<float> q_a_, q_, kv_, q_absorbed_, gather_, product_, attended_, heads_out_;
};

}  // namespace pagoda
