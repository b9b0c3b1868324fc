#include "pagoda/backend/cpu/mla_attention_layer.h"

#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/backend/cpu/kernels/mla_attention.h"
#include "pagoda/backend/cpu/kernels/mla_latent_write.h"
#include "pagoda/backend/cpu/kernels/rmsnorm.h"
#include "pagoda/backend/cpu/kernels/rope_strided.h"
#include "pagoda/model/rope_frequencies.h"
#include "pagoda/model/yarn_rope.h"

namespace pagoda {

namespace {

// DeepSeek's q_a_layernorm and kv_a_layernorm keep RMSNorm's default epsilon, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

const float* bias_or_null(const std::vector<float>& bias) { return bias.empty() ? nullptr : bias.data(); }

// Rows [first, first + rows) of a row-major weight matrix, as a view.
WeightMatrix row_block(const WeightMatrix& m, size_t first, size_t rows) {
  const size_t element_bytes = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  return WeightMatrix{m.dtype, static_cast<const char*>(m.data) + first * m.cols * element_bytes, rows, m.cols};
}

}  // namespace

CpuMlaAttention::CpuMlaAttention(const ModelConfig& config, const ModelWeights& weights)
    : config_(config), weights_(weights), mla_(*config.mla) {
  inv_freq_ = config.rope_yarn ? yarn_inverse_frequencies(mla_.qk_rope_head_dim, config.rope_theta, *config.rope_yarn)
                               : rope_inverse_frequencies(mla_.qk_rope_head_dim, config.rope_theta);
  const size_t heads = static_cast<size_t>(config.num_q_heads);
  const size_t nope = static_cast<size_t>(mla_.qk_nope_head_dim);
  const size_t v = static_cast<size_t>(mla_.v_head_dim);
  const size_t rank = static_cast<size_t>(mla_.kv_lora_rank);
  std::vector<float> row(rank);
  absorbed_keys_.resize(weights.layers.size());
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const WeightMatrix& kv_b = weights.layers[l].mla.kv_b_proj;
    const size_t element_bytes = static_cast<size_t>(dtype_bits(kv_b.dtype) / 8);
    std::vector<float>& wt = absorbed_keys_[l];
    wt.resize(heads * rank * nope);
    for (size_t h = 0; h < heads; ++h) {
      for (size_t n = 0; n < nope; ++n) {
        const size_t r = h * (nope + v) + n;  // W_UK_h row n
        convert_to_f32(kv_b.dtype, static_cast<const char*>(kv_b.data) + r * rank * element_bytes, row.data(), rank);
        for (size_t j = 0; j < rank; ++j) wt[(h * rank + j) * nope + n] = row[j];
      }
    }
  }
}

void CpuMlaAttention::forward(int32_t layer, const float* x, size_t T, const int32_t* positions,
                              std::span<const int64_t> slots, std::span<const kernels::PagedSequence> sequences,
                              const kernels::PagedKvLayer& kv, float* out) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const MlaLayerWeights& a = w.mla;
  const size_t heads = static_cast<size_t>(config_.num_q_heads);
  const size_t nope = static_cast<size_t>(mla_.qk_nope_head_dim);
  const size_t rope = static_cast<size_t>(mla_.qk_rope_head_dim);
  const size_t v = static_cast<size_t>(mla_.v_head_dim);
  const size_t rank = static_cast<size_t>(mla_.kv_lora_rank);
  const size_t qk = nope + rope;
  const size_t latent = rank + rope;
  const kernels::RopePairing pairing =
      mla_.rope_interleave ? kernels::RopePairing::kInterleaved : kernels::RopePairing::kHalves;

  // Query: [T, heads, nope + rope].
  q_.resize(T * heads * qk);
  if (mla_.q_lora_rank == 0) {
    kernels::linear(x, T, a.q_proj, nullptr, q_.data());
  } else {
    const size_t q_rank = static_cast<size_t>(mla_.q_lora_rank);
    q_a_.resize(T * q_rank);
    kernels::linear(x, T, a.q_a_proj, bias_or_null(a.q_a_bias), q_a_.data());
    kernels::rmsnorm(q_a_.data(), a.q_a_norm.data(), q_a_.data(), T, q_rank, kLatentNormEps);
    kernels::linear(q_a_.data(), T, a.q_b_proj, nullptr, q_.data());
  }
  // The cache vector: [T, rank + rope], latent normalized, rope key rotated.
  kv_.resize(T * latent);
  kernels::linear(x, T, a.kv_a_proj, bias_or_null(a.kv_a_bias), kv_.data());
  for (size_t t = 0; t < T; ++t)
    kernels::rmsnorm(kv_.data() + t * latent, a.kv_a_norm.data(), kv_.data() + t * latent, 1, rank, kLatentNormEps);
  kernels::apply_rope_strided(kv_.data() + rank, positions, T, latent, 1, 0, rope, inv_freq_.data(), pairing,
                              mla_.rope_attention_factor);
  kernels::apply_rope_strided(q_.data() + nope, positions, T, heads * qk, heads, qk, rope, inv_freq_.data(), pairing,
                              mla_.rope_attention_factor);
  kernels::mla_latent_write(kv_.data(), latent, slots, kv);

  // Absorbed query [T, heads, rank + rope]: W_UK_h^T q_nope_h, then q_pe_h.
  q_absorbed_.resize(T * heads * latent);
  gather_.resize(T * std::max(nope, rank));
  product_.resize(T * std::max(rank, v));
  const std::vector<float>& uk = absorbed_keys_[static_cast<size_t>(layer)];
  for (size_t h = 0; h < heads; ++h) {
    for (size_t t = 0; t < T; ++t) std::copy_n(q_.data() + (t * heads + h) * qk, nope, gather_.data() + t * nope);
    const WeightMatrix uk_h{DType::kF32, uk.data() + h * rank * nope, rank, nope};
    kernels::linear(gather_.data(), T, uk_h, nullptr, product_.data());
    for (size_t t = 0; t < T; ++t) {
      float* dst = q_absorbed_.data() + (t * heads + h) * latent;
      std::copy_n(product_.data() + t * rank, rank, dst);
      std::copy_n(q_.data() + (t * heads + h) * qk + nope, rope, dst + rank);
    }
  }

  attended_.resize(T * heads * rank);
  const kernels::MlaAttentionParams params{static_cast<int32_t>(heads), mla_.kv_lora_rank, mla_.softmax_scale};
  kernels::mla_paged_attention(q_absorbed_.data(), kv, sequences, params, attended_.data());

  // Per head: W_UV_h (kv_b_proj's value rows of head h) expands the attended latent.
  heads_out_.resize(T * heads * v);
  for (size_t h = 0; h < heads; ++h) {
    for (size_t t = 0; t < T; ++t)
      std::copy_n(attended_.data() + (t * heads + h) * rank, rank, gather_.data() + t * rank);
    const WeightMatrix uv_h = row_block(a.kv_b_proj, h * (nope + v) + nope, v);
    kernels::linear(gather_.data(), T, uv_h, nullptr, product_.data());
    for (size_t t = 0; t < T; ++t) std::copy_n(product_.data() + t * v, v, heads_out_.data() + (t * heads + h) * v);
  }
  kernels::linear(heads_out_.data(), T, w.o_proj, bias_or_null(w.o_bias), out);
}

}  // namespace pagoda
