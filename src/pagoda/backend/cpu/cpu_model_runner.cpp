#include "pagoda/backend/cpu/cpu_model_runner.h"

#include <algorithm>

namespace pagoda {

CpuModelRunner::CpuModelRunner(std::shared_ptr<CpuModel> model, CpuKvPool pool)
    : model_(std::move(model)), pool_(std::move(pool)) {}

StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::create(std::shared_ptr<CpuModel> model,
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

StatusOr<runtime::StepResult> CpuModelRunner::execute(const ForwardBatch& batch,
                                                      std::span<const runtime::RowSampling> rows) {
  PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
  runtime::StepResult out;
  PAGODA_RETURN_IF_ERROR(model_->forward(batch, pool_, out.host_logits));
  const size_t num_rows = static_cast<size_t>(batch.num_logit_rows());
  out.tokens.assign(num_rows, 0);
  out.logprobs.assign(num_rows, 0.0f);
  return out;
}

Status CpuModelRunner::copy_blocks(std::span<const runtime::BlockCopy> copies) {
  const KvPoolShape& shape = pool_.shape();
  for (const runtime::BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= shape.num_blocks || c.dst < 0 || c.dst >= shape.num_blocks)
      return out_of_range_error("block copy {} -> {} outside the pool of {} blocks", c.src, c.dst, shape.num_blocks);
    pool_.copy_block(c.src, c.dst);  // data and scale records, every layer
  }
  return ok_status();
}

}  // namespace pagoda
