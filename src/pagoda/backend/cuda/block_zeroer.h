#pragma once
// Zero on free for the CUDA runner (ModelRunner::zero_blocks): the listed
// device blocks are cleared in every layer (kv_zero_blocks.h) on a side
// stream, ordered after everything already queued on the model stream (a
// block's last reader) and before anything queued there afterwards (the
// transfers, block copies and forward that may write or read it): an event on
// each side, no host synchronisation. An empty list queues nothing.
//
// Thread safety: the engine thread only, like the runner.

#include <cstdint>
#include <memory>
#include <span>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/core/status.h"

namespace pagoda::cuda {

class BlockZeroer {
 public:
  static StatusOr<std::unique_ptr<BlockZeroer>> create();
  ~BlockZeroer();
  BlockZeroer(const BlockZeroer&) = delete;
  BlockZeroer& operator=(const BlockZeroer&) = delete;

  // Errors: ids outside [0, pool's num_blocks) (nothing queued), CUDA errors.
  Status zero(const CudaKvPool& pool, std::span<const int32_t> blocks, cudaStream_t model_stream);
  int64_t blocks_zeroed() const { return blocks_zeroed_; }

 private:
  BlockZeroer() = default;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t model_ready_ = nullptr;  // the model stream's work so far
  cudaEvent_t zeroed_ = nullptr;       // the side stream's clears
  int64_t blocks_zeroed_ = 0;
};

}  // namespace pagoda::cuda
