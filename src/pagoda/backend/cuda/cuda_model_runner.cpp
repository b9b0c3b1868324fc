#include "pagoda/backend/cuda/cuda_model_runner.h"

#include <cstdio>

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::create(std::unique_ptr<CudaModel> model,
                                                                   const CudaRunnerOptions& options) {
  KvPoolShape shape = model->kv_pool_shape(options.num_blocks);
  std::string report;
  if (options.num_blocks <= 0) {
    PAGODA_ASSIGN_OR_RETURN(KvPoolSizing sizing,
                            size_kv_pool_from_free_memory(shape, options.gpu_memory_utilization));
    shape.num_blocks = sizing.num_blocks;
    report = sizing.report;
  } else {
    report = fmt::format("KV pool: {} blocks x {} tokens (fixed)", shape.num_blocks, shape.block_size);
  }
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvPool> pool, CudaKvPool::create(shape));
  if (options.print_report) std::fprintf(stderr, "%s\n", report.c_str());
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(model), std::move(pool), std::move(report)));
}

StatusOr<std::vector<float>> CudaModelRunner::execute(const ForwardBatch& batch) {
  std::vector<float> logits;
  PAGODA_RETURN_IF_ERROR(model_->forward(batch, *pool_, logits));
  return logits;
}

StatusOr<std::vector<int32_t>> CudaModelRunner::execute_greedy(const ForwardBatch& batch) {
  std::vector<int32_t> tokens;
  PAGODA_RETURN_IF_ERROR(model_->forward_greedy(batch, *pool_, tokens));
  return tokens;
}

Status CudaModelRunner::copy_blocks(std::span<const kv::BlockCopy> copies) {
  PAGODA_RETURN_IF_ERROR(pool_->copy_blocks(copies, model_->stream()));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream()));
  return ok_status();
}

}  // namespace pagoda::cuda
