#include "pagoda/engine/cpu_model_runner.h"

#include <algorithm>

namespace pagoda::engine {

CpuModelRunner::CpuModelRunner(std::unique_ptr<CpuModel> model, CpuKvPool pool)
    : model_(std::move(model)), pool_(std::move(pool)) {}

StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::create(std::unique_ptr<CpuModel> model,
                                                                  int32_t num_blocks, int32_t block_size,
                                                                  DType key_dtype, DType value_dtype) {
  if (!model) return invalid_argument_error("CpuModelRunner needs a model");
  const KvPoolShape shape = model->kv_pool_shape(num_blocks, block_size, key_dtype, value_dtype);
  PAGODA_ASSIGN_OR_RETURN(CpuKvPool pool, CpuKvPool::create(shape));
  return std::unique_ptr<CpuModelRunner>(new CpuModelRunner(std::move(model), std::move(pool)));
}

int64_t CpuModelRunner::blocks_for_memory(const CpuModel& model, int64_t bytes, int32_t block_size,
                                          DType key_dtype, DType value_dtype) {
  const KvPoolShape shape = model.kv_pool_shape(1, block_size, key_dtype, value_dtype);
  const size_t per_token = shape.bytes_per_token();
  if (per_token == 0 || block_size <= 0) return 0;
  return bytes / static_cast<int64_t>(per_token * block_size);
}

StatusOr<std::vector<float>> CpuModelRunner::execute(const ForwardBatch& batch) {
  std::vector<float> logits;
  PAGODA_RETURN_IF_ERROR(model_->forward(batch, pool_, logits));
  return logits;
}

Status CpuModelRunner::copy_blocks(std::span<const kv::BlockCopy> copies) {
  const KvPoolShape& shape = pool_.shape();
  for (const kv::BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= shape.num_blocks || c.dst < 0 || c.dst >= shape.num_blocks)
      return out_of_range_error("block copy {} -> {} outside the pool of {} blocks", c.src, c.dst, shape.num_blocks);
    pool_.copy_block(c.src, c.dst);  // data and scale records, every layer
  }
  return ok_status();
}

}  // namespace pagoda::engine
