#pragma once
// ModelRunner over the CPU reference model (model/cpu_model.h) and its paged
// f32 KV pool (backend/cpu_kv_pool.h). Owns both.
//
// Thread safety: engine thread only (CpuModel::forward uses shared scratch).

#include <cstdint>
#include <filesystem>
#include <memory>

#include "pagoda/backend/cpu_kv_pool.h"
#include "pagoda/engine/model_runner.h"
#include "pagoda/model/cpu_model.h"

namespace pagoda::engine {

class CpuModelRunner final : public ModelRunner {
 public:
  // Pool of num_blocks blocks of block_size tokens for `model`, K and V stored
  // as key_dtype / value_dtype (f32, or a quantized format of kernels/kv_quant.h).
  static StatusOr<std::unique_ptr<CpuModelRunner>> create(std::unique_ptr<CpuModel> model, int32_t num_blocks,
                                                          int32_t block_size, DType key_dtype = DType::kF32,
                                                          DType value_dtype = DType::kF32);
  // Blocks that fit in `bytes` of KV memory for this model (K and V, every layer, scales included).
  static int64_t blocks_for_memory(const CpuModel& model, int64_t bytes, int32_t block_size,
                                   DType key_dtype = DType::kF32, DType value_dtype = DType::kF32);

  StatusOr<std::vector<float>> execute(const ForwardBatch& batch) override;
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override;
  int32_t vocab_size() const override { return model_->config().vocab_size; }
  int32_t max_context_length() const override { return model_->config().max_position_embeddings; }
  std::vector<int32_t> eos_token_ids() const override { return model_->config().eos_token_ids; }

  const CpuModel& model() const { return *model_; }
  const CpuKvPool& pool() const { return pool_; }

 private:
  CpuModelRunner(std::unique_ptr<CpuModel> model, CpuKvPool pool);
  std::unique_ptr<CpuModel> model_;
  CpuKvPool pool_;
};

}  // namespace pagoda::engine
