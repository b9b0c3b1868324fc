#pragma once
// ModelRunner over the CPU reference model (backend/cpu/cpu_model.h) and its
// paged KV pool (backend/cpu/cpu_kv_pool.h). Owns the pool and shares the
// model (several runners with different KV settings may use one model, one at
// a time). Every row comes back as logits: the engine's host sampler picks the
// tokens.
//
// Host tier: with num_host_blocks > 0 the runner also owns a second pool of
// that many blocks, one contiguous chunk each (runtime/host_block_layout.h),
// and transfer_blocks() memcpys blocks between the two: the same tier logic as
// on a GPU, with both pools in RAM, so it runs (and is tested) anywhere.
//
// Thread safety: one thread (CpuModel::forward uses shared scratch).

#include <cstdint>
#include <memory>

#include "pagoda/backend/cpu/cpu_kv_eviction.h"
#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda {

class CpuModelRunner final : public runtime::ModelRunner {
 public:
  // Pool of num_blocks blocks of block_size tokens for `model`, K and V stored
  // as key_dtype / value_dtype (f32, or a quantized format of runtime/kv_quant.h).
  // num_host_blocks: blocks of the host tier's pool (0: none); kResourceExhausted
  // when that memory cannot be had. cross_layer_share: --kv-cross-layer-share
  // (runtime/cross_layer_share.h; 1: off); errors name the flag (K out of
  // range, an MLA model, a host tier with it).
  static StatusOr<std::unique_ptr<CpuModelRunner>> create(std::shared_ptr<CpuModel> model, int32_t num_blocks,
                                                          int32_t block_size, DType key_dtype = DType::kF32,
                                                          DType value_dtype = DType::kF32, int32_t num_host_blocks = 0,
                                                          int32_t cross_layer_share = 1);
  // Blocks that fit in `bytes` of KV memory for this model (K and V, every layer, scales included).
  static int64_t blocks_for_memory(const CpuModel& model, int64_t bytes, int32_t block_size,
                                   DType key_dtype = DType::kF32, DType value_dtype = DType::kF32,
                                   int32_t cross_layer_share = 1);

  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch,
                                        std::span<const runtime::RowSampling> rows) override;
  Status copy_blocks(std::span<const runtime::BlockCopy> copies) override;
  Status zero_blocks(std::span<const int32_t> blocks) override;  // memset, data and scales
  Status transfer_blocks(std::span<const runtime::BlockTransfer> transfers) override;
  runtime::TransferStats transfer_stats() const override { return transfer_stats_; }
  std::optional<std::chrono::steady_clock::time_point> last_transfer_done_at() const override {
    return last_transfer_done_;
  }
  Status read_host_block(int32_t host_block, std::span<std::byte> out) override;
  Status write_host_block(int32_t host_block, std::span<const std::byte> data) override;
  StatusOr<std::vector<std::span<std::byte>>> host_blocks_for_writing(std::span<const int32_t> blocks) override;
  runtime::RunnerCapabilities capabilities() const override {
    return {.zeroes_blocks = true,
            .host_kv_blocks = num_host_blocks_,
            .host_block_access = num_host_blocks_ > 0,
            .compacts_kv = model_->supports_token_eviction() && pool_.shape().cross_layer_share == 1,
            .kv_attention_scores = true};
  }
  // Token eviction (backend/cpu/cpu_kv_eviction.h).
  Status compact_kv(const runtime::KvCompaction& compaction) override;
  void release_kv_state(int64_t kv_state) override { eviction_.release(kv_state); }
  const CpuKvEviction& eviction() const { return eviction_; }
  const KvPoolShape& kv_geometry() const override { return pool_.shape(); }
  int32_t vocab_size() const override { return model_->config().vocab_size; }
  int32_t max_context_length() const override { return model_->config().max_position_embeddings; }
  std::vector<int32_t> eos_token_ids() const override { return model_->config().eos_token_ids; }

  const CpuModel& model() const { return *model_; }
  const CpuKvPool& pool() const { return pool_; }
  int32_t num_host_blocks() const { return num_host_blocks_; }
  size_t host_block_bytes() const { return host_block_bytes_; }
  // One host block's chunk (0 <= host_block < num_host_blocks), for tests.
  const std::byte* host_block(int32_t host_block) const {
    return host_pool_.get() + static_cast<size_t>(host_block) * host_block_bytes_;
  }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  CpuModelRunner(std::shared_ptr<CpuModel> model, CpuKvPool pool);
  std::shared_ptr<CpuModel> model_;
  CpuKvPool pool_;
  int32_t num_host_blocks_ = 0;
  size_t host_block_bytes_ = 0;
  std::unique_ptr<std::byte[], FreeDeleter> host_pool_;
  runtime::TransferStats transfer_stats_;
  std::optional<std::chrono::steady_clock::time_point> last_transfer_done_;
  CpuKvEviction eviction_;
};

}  // namespace pagoda
