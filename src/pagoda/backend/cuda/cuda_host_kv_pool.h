#pragma once
// The host tier on the GPU: a pool of KV blocks in pinned host memory, one
// contiguous chunk per block (runtime/host_block_layout.h), and the copies
// between it and the device pool (CudaKvPool).
//
// A transfer list runs asynchronously, after the work already queued on the
// model's stream (the previous step's forward) and before any work queued on
// it afterwards (the next forward, block copies): an event orders each side.
// The list is cut into batches in which no block is touched by two transfers
// (a later transfer may read or overwrite what an earlier one wrote: those
// land in a later batch). In a batch, device->host copies run on one copy
// stream and host->device copies on another, so both directions of PCIe are
// busy at once. How a direction's blocks move (CopyMethod): by default one
// launch of the copy kernel (kv_host_copy.h), which reads and writes the
// pinned memory directly; or their pieces (2 to 4 per layer per block) issued
// to the copy engines with one cudaMemcpyBatchAsync, or one cudaMemcpyAsync
// each (the rates of the three are in docs/BENCHMARKS.md). Each direction of
// each batch is timed with a pair of events, read back once they have
// completed.
//
// Thread safety: the engine thread only, like the runner that owns it.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::cuda {

class CudaHostKvPool {
 public:
  // num_blocks pinned blocks of `device`'s block shape. kResourceExhausted
  // (with the size) when the memory cannot be pinned.
  static StatusOr<std::unique_ptr<CudaHostKvPool>> create(const KvPoolShape& shape, int32_t num_blocks);
  ~CudaHostKvPool();
  CudaHostKvPool(const CudaHostKvPool&) = delete;
  CudaHostKvPool& operator=(const CudaHostKvPool&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t total_bytes() const { return memory_.bytes(); }
  std::byte* block(int32_t host_block) const {
    return memory_.as<std::byte>() + static_cast<size_t>(host_block) * block_bytes_;
  }

  // Queues `transfers` (ids already checked) between `device` and this pool,
  // ordered after the work on `stream` so far and before the work queued on
  // it next. Errors: the CUDA calls that queue the copies.
  Status transfer(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device, cudaStream_t stream);
  // Totals so far; the times of copies still in flight are added once they finish.
  runtime::TransferStats stats();
  enum class CopyMethod { kKernel, kBatchedMemcpy, kMemcpyPerPiece };
  void set_copy_method(CopyMethod method) {
    method_ = method;
    batch_api_ = true;
  }
  CopyMethod copy_method() const { return method_; }
  // With kBatchedMemcpy: false once the driver refused cudaMemcpyBatchAsync (then one cudaMemcpyAsync per piece).
  bool batch_api_in_use() const { return batch_api_; }

 private:
  struct Timing {
    int direction;
    cudaEvent_t start, stop;
  };
  CudaHostKvPool() = default;
  Status issue(std::vector<void*>& dsts, std::vector<const void*>& srcs, std::vector<size_t>& sizes,
               cudaStream_t stream);
  void collect_timings(bool wait);

  PinnedBuffer memory_;
  int32_t num_blocks_ = 0;
  size_t block_bytes_ = 0;
  cudaStream_t streams_[runtime::kNumTransferDirections] = {nullptr, nullptr};
  cudaEvent_t ready_ = nullptr;                                   // the model stream's work so far
  cudaEvent_t done_[runtime::kNumTransferDirections] = {nullptr, nullptr};  // a batch's copies per direction
  CopyMethod method_ = CopyMethod::kKernel;
  bool batch_api_ = true;  // cudaMemcpyBatchAsync works here
  std::vector<Timing> timings_;
  runtime::TransferStats stats_;
};

}  // namespace pagoda::cuda
