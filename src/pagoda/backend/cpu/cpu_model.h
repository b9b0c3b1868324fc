#pragma once
// The CPU reference forward of the llama family (Llama incl. llama3 RoPE,
// Mistral, Qwen2, Qwen3) and of DeepSeek V2/V3 (multi-head latent attention
// over a paged latent pool, backend/cpu/mla_attention_layer.h, and mixture of
// experts, backend/cpu/moe_block.h), f32 compute on f32/f16/bf16 weights,
// multi-threaded on ThreadPool::global().
//
// One call runs one ForwardBatch: any mix of prefill chunks (after cached
// tokens or not) and decodes, several sequences. Per layer: rmsnorm -> q/k/v
// (+bias) -> (Qwen3 q/k norm) -> RoPE -> write K/V into the pool at the slots
// of each sequence's block table -> paged attention (K/V read only through the
// block tables) -> o_proj -> residual -> rmsnorm -> silu(gate) * up -> down ->
// residual; then final norm and lm_head for the requested rows only. A
// DeepSeek layer swaps the attention for MLA (the pool holds one latent vector
// per token) and, from first_k_dense_replace on, the MLP for the MoE block.
//
// Tensor parallelism (docs/TENSOR_PARALLEL.md): a model may be one rank's
// shard (attach_tensor_parallel); its forward then runs the rank's heads and
// intermediate features and joins the other ranks through a Communicator: an
// all-reduce of the embedding (vocab-parallel rows), of o_proj's and of
// down_proj's outputs (row-parallel), and an all-gather of the logits.
//
// Thread safety: forward() uses per-model scratch buffers: one call at a time
// per model (the ranks of a group run concurrently, one thread each). The pool
// is written at the batch's slots only.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/backend/cpu/cpu_kv_eviction.h"
#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/backend/cpu/mla_attention_layer.h"
#include "pagoda/backend/cpu/moe_block.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/parallel/communicator.h"

namespace pagoda {

class CpuModel {
 public:
  // Reads config.json (+ generation_config.json), mmaps the safetensors and binds the weights.
  static StatusOr<std::unique_ptr<CpuModel>> load(const std::filesystem::path& model_dir,
                                                  const WeightLoadOptions& options = {});
  CpuModel(ModelConfig config, ModelWeights weights);
  CpuModel(const CpuModel&) = delete;
  CpuModel& operator=(const CpuModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // --quantization: block-quantizes the linear weights (int8 or int4) before
  // the first forward; see backend/cpu/quantize_weights.h for what and errors.
  Status quantize_weights(DType dtype);
  // Token eviction works with the llama family's attention without a sliding
  // window (window indices would count compacted slots, not positions).
  bool supports_token_eviction() const { return !config_.mla && config_.sliding_window <= 0 && comm_ == nullptr; }

  // Makes this model rank shard.rank of a tensor-parallel group: config() and
  // weights() must be shard_config / shard_model_weights of that shard
  // (model/tensor_shard.h), `comm` is the rank's communicator (outlives the
  // model), and every rank of the group must run forward() on the same
  // batches in the same order.
  void attach_tensor_parallel(const TensorShard& shard, parallel::Communicator* comm);
  const TensorShard& tensor_shard() const { return shard_; }

  // The pool shape this model needs for num_blocks blocks of block_size tokens,
  // K and V stored as key_dtype / value_dtype (f32, f16, bf16, fp8, int8, int4);
  // for an MLA model one latent pool stored as key_dtype (model/kv_geometry.h).
  KvPoolShape kv_pool_shape(int32_t num_blocks, int32_t block_size, DType key_dtype = DType::kF32,
                            DType value_dtype = DType::kF32) const;

  // Runs the batch. logits is resized to [batch.num_logit_rows(), vocab_size],
  // rows in order of sequences, then tokens. Errors (nothing is written to the
  // pool then): batch inconsistent (lengths, offsets, token ids out of vocab,
  // block table too short or naming blocks outside the pool) or a pool whose
  // shape does not fit the model.
  // `eviction` (token eviction, backend/cpu/cpu_kv_eviction.h): empty, or
  // one entry per slice, null for slices without eviction state; the
  // attention skips each head's holes and adds scores as the state says.
  Status forward(const ForwardBatch& batch, CpuKvPool& pool, std::vector<float>& logits,
                 std::span<CpuSequenceEviction* const> eviction = {});

 private:
  Status validate(const ForwardBatch& batch, const CpuKvPool& pool) const;
  // The llama family's attention of layer l on normed_, into proj_.
  void attention_layer(int32_t l, const ForwardBatch& batch, std::span<const int64_t> slots,
                       std::span<kernels::PagedSequence> sequences, std::span<CpuSequenceEviction* const> eviction,
                       const kernels::PagedAttentionParams& attention, CpuKvPool& pool);

  ModelConfig config_;
  ModelWeights weights_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::unique_ptr<CpuMlaAttention> mla_;  // DeepSeek only
  std::unique_ptr<CpuMoeBlock> moe_;      // DeepSeek only
  TensorShard shard_;                     // rank 0 of 1 unless attached
  parallel::Communicator* comm_ = nullptr;

  Status embed(const ForwardBatch& batch);
  Status lm_head(size_t num_rows, std::vector<float>& logits);

  // Scratch, reused across calls: [num_tokens, ...].
  std::vector<float> hidden_, normed_, q_, k_, v_, attn_, proj_, gate_, up_;
  std::vector<float> shard_logits_, gathered_logits_;  // tensor parallelism only
};

}  // namespace pagoda
