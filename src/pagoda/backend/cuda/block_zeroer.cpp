#include "pagoda/backend/cuda/block_zeroer.h"

#include <algorithm>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/kv_zero_blocks.h"

namespace pagoda::cuda {

StatusOr<std::unique_ptr<BlockZeroer>> BlockZeroer::create() {
  std::unique_ptr<BlockZeroer> z(new BlockZeroer());
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&z->stream_, cudaStreamNonBlocking));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&z->model_ready_, cudaEventDisableTiming));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&z->zeroed_, cudaEventDisableTiming));
  return z;
}

BlockZeroer::~BlockZeroer() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (zeroed_) cudaEventDestroy(zeroed_);
  if (model_ready_) cudaEventDestroy(model_ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status BlockZeroer::zero(const CudaKvPool& pool, std::span<const int32_t> blocks, cudaStream_t model_stream) {
  if (blocks.empty()) return ok_status();
  const int32_t num_blocks = pool.shape().num_blocks;
  for (int32_t b : blocks)
    if (b < 0 || b >= num_blocks) return invalid_argument_error("zero_blocks: block {} outside [0, {})", b, num_blocks);
  const KvHostCopyGeometry geometry = pool.host_copy_geometry(nullptr, 0);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(model_ready_, model_stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, model_ready_, 0));
  for (size_t start = 0; start < blocks.size(); start += kKvZeroMaxBlocks) {
    KvZeroBlocks batch;
    batch.count = static_cast<int32_t>(std::min<size_t>(kKvZeroMaxBlocks, blocks.size() - start));
    std::copy_n(blocks.begin() + static_cast<std::ptrdiff_t>(start), batch.count, batch.block);
    PAGODA_CUDA_RETURN_IF_ERROR(kv_zero_blocks(geometry, batch, stream_));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(pool.zero_share_norms(blocks, stream_));  // cross-layer sharing's records
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(zeroed_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(model_stream, zeroed_, 0));
  blocks_zeroed_ += static_cast<int64_t>(blocks.size());
  return ok_status();
}

}  // namespace pagoda::cuda
