#include "pagoda/backend/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>

#include "pagoda/backend/cpu/kernels/embedding.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"
#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/backend/cpu/kernels/rmsnorm.h"
#include "pagoda/backend/cpu/kernels/rope.h"
#include "pagoda/backend/cpu/kernels/silu_mul.h"
#include "pagoda/backend/cpu/quantize_weights.h"
#include "pagoda/model/kv_geometry.h"
#include "pagoda/runtime/batch_validation.h"
#include "pagoda/runtime/cross_layer_share.h"

namespace pagoda {

namespace {

const float* bias_or_null(const std::vector<float>& bias) { return bias.empty() ? nullptr : bias.data(); }

void add_in_place(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

StatusOr<std::unique_ptr<CpuModel>> CpuModel::load(const std::filesystem::path& model_dir,
                                                   const WeightLoadOptions& options) {
  PAGODA_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  PAGODA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(model_dir, options.progress));
  auto shared = std::make_shared<const Checkpoint>(std::move(checkpoint));
  PAGODA_ASSIGN_OR_RETURN(ModelWeights weights, bind_model_weights(config, std::move(shared), options));
  return std::make_unique<CpuModel>(std::move(config), std::move(weights));
}

CpuModel::CpuModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  if (config_.mla) {
    mla_ = std::make_unique<CpuMlaAttention>(config_, weights_);
    if (config_.moe) moe_ = std::make_unique<CpuMoeBlock>(*config_.moe, config_.hidden_size);
    return;
  }
  inv_freq_ = rope_inverse_frequencies(
      config_.head_dim, config_.rope_theta, config_.rope_llama3 ? &*config_.rope_llama3 : nullptr);
}

void CpuModel::attach_tensor_parallel(const TensorShard& shard, parallel::Communicator* comm) {
  shard_ = shard;
  comm_ = comm;
}

Status CpuModel::embed(const ForwardBatch& batch) {
  const size_t T = static_cast<size_t>(batch.num_tokens()), H = static_cast<size_t>(config_.hidden_size);
  if (comm_ == nullptr) {
    kernels::embedding_lookup(weights_.embed_tokens, batch.token_ids.data(), T, hidden_.data());
    return ok_status();
  }
  // Vocab-parallel: each rank fills the rows of its own tokens, zeros elsewhere; the sum is the lookup.
  for (size_t t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id >= shard_.vocab_begin && id < shard_.vocab_end) {
      const int32_t local = id - shard_.vocab_begin;
      kernels::embedding_lookup(weights_.embed_tokens, &local, 1, hidden_.data() + t * H);
    } else {
      std::fill_n(hidden_.data() + t * H, H, 0.0f);
    }
  }
  return comm_->all_reduce_sum(hidden_.data(), T * H, DType::kF32);
}

Status CpuModel::lm_head(size_t num_rows, std::vector<float>& logits) {
  if (comm_ == nullptr) {
    kernels::linear(normed_.data(), num_rows, weights_.lm_head, nullptr, logits.data());
    return ok_status();
  }
  // Vocab-parallel: each rank's [rows, chunk] slice (padded past the vocabulary), gathered by rank.
  const size_t V = static_cast<size_t>(config_.vocab_size), chunk = static_cast<size_t>(shard_.vocab_chunk);
  const size_t local = static_cast<size_t>(shard_.vocab_end - shard_.vocab_begin);
  const size_t ranks = static_cast<size_t>(shard_.size);
  gathered_logits_.resize(num_rows * local);
  kernels::linear(normed_.data(), num_rows, weights_.lm_head, nullptr, gathered_logits_.data());
  shard_logits_.assign(num_rows * chunk, 0.0f);
  for (size_t r = 0; r < num_rows; ++r)
    std::copy_n(gathered_logits_.data() + r * local, local, shard_logits_.data() + r * chunk);
  gathered_logits_.resize(ranks * num_rows * chunk);
  PAGODA_RETURN_IF_ERROR(
      comm_->all_gather(shard_logits_.data(), gathered_logits_.data(), num_rows * chunk, DType::kF32));
  for (size_t k = 0; k < ranks; ++k) {
    const size_t begin = std::min(V, k * chunk), width = std::min(V, begin + chunk) - begin;
    for (size_t r = 0; r < num_rows; ++r)
      std::copy_n(gathered_logits_.data() + (k * num_rows + r) * chunk, width, logits.data() + r * V + begin);
  }
  return ok_status();
}

Status CpuModel::quantize_weights(DType dtype) { return quantize_model_weights(config_, weights_, dtype); }

KvPoolShape CpuModel::kv_pool_shape(int32_t num_blocks, int32_t block_size, DType key_dtype,
                                    DType value_dtype) const {
  return model_kv_pool_shape(config_, num_blocks, block_size, key_dtype, value_dtype);
}

Status CpuModel::validate(const ForwardBatch& batch, const CpuKvPool& pool) const {
  const KvPoolShape& ps = pool.shape();
  KvPoolShape expected = kv_pool_shape(ps.num_blocks, ps.block_size, ps.key_dtype, ps.value_dtype);
  if (ps.cross_layer_share != 1) {
    if (config_.mla) return unimplemented_error("cross-layer KV sharing needs a model without MLA");
    PAGODA_RETURN_IF_ERROR(
        runtime::validate_cross_layer_share(ps.cross_layer_share, config_.num_layers, "--kv-cross-layer-share"));
    expected.cross_layer_share = ps.cross_layer_share;
  }
  PAGODA_RETURN_IF_ERROR(runtime::check_pool_matches(ps, expected));
  runtime::BatchLimits limits;
  limits.vocab_size = config_.vocab_size;
  return runtime::validate_forward_batch(batch, ps, limits);
}

void CpuModel::attention_layer(int32_t l, const ForwardBatch& batch, std::span<const int64_t> slots,
                               std::span<kernels::PagedSequence> sequences,
                               std::span<CpuSequenceEviction* const> eviction,
                               const kernels::PagedAttentionParams& attention, CpuKvPool& pool) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const size_t T = static_cast<size_t>(batch.num_tokens());
  const size_t D = static_cast<size_t>(c.head_dim);
  kernels::linear(normed_.data(), T, w.q_proj, bias_or_null(w.q_bias), q_.data());
  kernels::linear(normed_.data(), T, w.k_proj, bias_or_null(w.k_bias), k_.data());
  kernels::linear(normed_.data(), T, w.v_proj, bias_or_null(w.v_bias), v_.data());
  if (c.qk_norm) {
    kernels::rmsnorm(q_.data(), w.q_norm.data(), q_.data(), T * c.num_q_heads, D, c.rms_norm_eps);
    kernels::rmsnorm(k_.data(), w.k_norm.data(), k_.data(), T * c.num_kv_heads, D, c.rms_norm_eps);
  }
  kernels::apply_rope(q_.data(), batch.positions.data(), T, c.num_q_heads, D, inv_freq_.data());
  kernels::apply_rope(k_.data(), batch.positions.data(), T, c.num_kv_heads, D, inv_freq_.data());

  kernels::PagedKvLayer kv = pool.layer(l);
  kv.key_fixed_scale = w.k_scale;  // checkpoint-calibrated fp8 scales, when present (0: per vector)
  kv.value_fixed_scale = w.v_scale;
  kernels::kv_write(k_.data(), v_.data(), slots, kv);
  for (size_t i = 0; i < eviction.size(); ++i)
    if (eviction[i] != nullptr)
      sequences[i].eviction = eviction[i]->layer_view(l, batch.sequences[i].score_from_index);
  kernels::paged_attention(q_.data(), kv, sequences, attention, attn_.data());
  kernels::linear(attn_.data(), T, w.o_proj, bias_or_null(w.o_bias), proj_.data());
}

Status CpuModel::forward(const ForwardBatch& batch, CpuKvPool& pool, std::vector<float>& logits,
                         std::span<CpuSequenceEviction* const> eviction) {
  PAGODA_RETURN_IF_ERROR(validate(batch, pool));
  if (!eviction.empty() && eviction.size() != batch.sequences.size())
    return invalid_argument_error("token eviction: {} states for {} sequences", eviction.size(),
                                  batch.sequences.size());
  if (!eviction.empty() && !supports_token_eviction())
    return unimplemented_error("token eviction needs a model without MLA or a sliding window");
  if (!eviction.empty() && pool.shape().cross_layer_share > 1)
    return unimplemented_error("token eviction with --kv-cross-layer-share is not supported");
  const ModelConfig& c = config_;
  const size_t T = static_cast<size_t>(batch.num_tokens());
  const size_t H = static_cast<size_t>(c.hidden_size);
  const size_t D = static_cast<size_t>(c.head_dim);
  const size_t q_width = static_cast<size_t>(c.num_q_heads) * D;
  const size_t kv_width = static_cast<size_t>(c.num_kv_heads) * D;
  const size_t I = static_cast<size_t>(c.intermediate_size);
  logits.assign(static_cast<size_t>(batch.num_logit_rows()) * c.vocab_size, 0.0f);
  if (T == 0) return ok_status();

  // Plan once per batch: the attention view of every sequence and the KV slot of every token.
  std::vector<kernels::PagedSequence> sequences;
  sequences.reserve(batch.sequences.size());
  for (const SequenceSlice& s : batch.sequences)
    sequences.push_back({s.token_offset, s.num_new_tokens, s.num_cached_tokens, s.block_table, {}});
  const std::vector<int64_t> slots = kernels::plan_kv_slots(sequences, pool.shape().block_size, T);
  const kernels::PagedAttentionParams attention{c.num_q_heads, 1.0f / std::sqrt(static_cast<float>(D)),
                                                c.sliding_window};

  hidden_.resize(T * H);
  normed_.resize(T * H);
  if (!mla_) {
    q_.resize(T * q_width);
    k_.resize(T * kv_width);
    v_.resize(T * kv_width);
    attn_.resize(T * q_width);
  }
  proj_.resize(T * H);
  gate_.resize(T * I);
  up_.resize(T * I);

  PAGODA_RETURN_IF_ERROR(embed(batch));

  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    kernels::rmsnorm(hidden_.data(), w.input_norm.data(), normed_.data(), T, H, c.rms_norm_eps);
    if (mla_) {
      mla_->forward(l, normed_.data(), T, batch.positions.data(), slots, sequences, pool.layer(l), proj_.data());
    } else {
      attention_layer(l, batch, slots, sequences, eviction, attention, pool);
    }
    if (comm_ != nullptr) PAGODA_RETURN_IF_ERROR(comm_->all_reduce_sum(proj_.data(), T * H, DType::kF32));
    add_in_place(hidden_.data(), proj_.data(), T * H);

    kernels::rmsnorm(hidden_.data(), w.post_attention_norm.data(), normed_.data(), T, H, c.rms_norm_eps);
    if (moe_ && c.moe->is_moe_layer(l)) {
      moe_->forward(normed_.data(), T, w.moe, proj_.data());
    } else {
      kernels::linear(normed_.data(), T, w.gate_proj, bias_or_null(w.gate_bias), gate_.data());
      kernels::linear(normed_.data(), T, w.up_proj, bias_or_null(w.up_bias), up_.data());
      kernels::silu_mul(gate_.data(), up_.data(), gate_.data(), T * I);
      kernels::linear(gate_.data(), T, w.down_proj, bias_or_null(w.down_bias), proj_.data());
    }
    if (comm_ != nullptr) PAGODA_RETURN_IF_ERROR(comm_->all_reduce_sum(proj_.data(), T * H, DType::kF32));
    add_in_place(hidden_.data(), proj_.data(), T * H);
  }

  // Only the requested rows go through the final norm and the (large) lm_head.
  std::vector<size_t> rows;
  for (const SequenceSlice& s : batch.sequences) {
    if (s.logits_for_all_new_tokens) {
      for (int32_t i = 0; i < s.num_new_tokens; ++i) rows.push_back(static_cast<size_t>(s.token_offset + i));
    } else if (s.logits_for_last_token) {
      rows.push_back(static_cast<size_t>(s.token_offset + s.num_new_tokens - 1));
    }
  }
  if (rows.empty()) return ok_status();
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(hidden_.data() + rows[r] * H, H, normed_.data() + r * H);  // normed_ has >= T rows
  kernels::rmsnorm(normed_.data(), weights_.final_norm.data(), normed_.data(), rows.size(), H, c.rms_norm_eps);
  return lm_head(rows.size(), logits);
}

}  // namespace pagoda
