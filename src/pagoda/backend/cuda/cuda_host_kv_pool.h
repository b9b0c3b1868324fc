#pragma once
// The host tier on the GPU: a pool of KV blocks in pinned host memory, one
// contiguous chunk per block (runtime/host_block_layout.h), and the copies
// between it and the device pool (CudaKvPool).
//
// A transfer list runs asynchronously, after the work already queued on the
// model's stream (the previous step's forward) and before any work queued on
// it afterwards (the next forward, block copies): an event orders each side.
// The list is cut into batches in which no block is touched by two transfers
// (a later transfer may read or overwrite what an earlier one wrote: it goes
// into the batch after the last one that touched its blocks, so a full device
// pool's lists, write-backs then loads into the blocks they freed, take two
// batches). In a batch, device->host copies run on one copy
// stream and host->device copies on another (both of the highest priority, so
// their CTAs are not queued behind a forward's), so both directions of PCIe
// are busy at once. How a direction's blocks move (CopyMethod, per
// direction): by default one launch of the copy kernel (kv_host_copy.h), which
// reads and writes the pinned memory directly; or through a device staging
// buffer (the kernel gathers blocks into host-chunk layout on the device, the
// copy engines move each whole chunk with cudaMemcpyAsync, and the reverse
// for loads); or their pieces (2 to 4 per layer per block) issued to the copy
// engines with one cudaMemcpyBatchAsync, or one cudaMemcpyAsync each (the
// rates are in docs/BENCHMARKS.md). Each direction of each call is timed with
// a pair of events, read back once they have completed.
//
// Layer by layer (transfer_layered): when a list is one batch, a direction
// moved by the copy kernel is issued one layer at a time with an event after
// each layer; a list of several batches (a block written back and then
// reloaded in one list, say), with the kernel both ways, goes layer by layer
// on one copy stream, each layer's batches in list order, one event per
// layer. The model's stream is not made to wait; the caller takes
// those events (take_layer_waits) and its forward waits for layer l's before
// it touches layer l, so a load overlaps the step's compute. Until they are
// taken, any other use of the pool on the model's stream must call
// wait_all() first (copy_blocks does; the next transfer does it itself).
//
// Thread safety: the engine thread only, like the runner that owns it, but for
// wait_for_copies_on_host().

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/kv_layer_waits.h"
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
  // it next. Errors: the CUDA calls that queue the copies (the staging
  // buffer's allocation with kStaged).
  Status transfer(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device, cudaStream_t stream);
  // The same, layer by layer where it can (see above): true when some
  // direction went layer by layer and its events wait in take_layer_waits();
  // false when `stream` already waits for every copy, as after transfer().
  StatusOr<bool> transfer_layered(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device,
                                  cudaStream_t stream);
  // Hands the pending layer events to the forward that will wait on them
  // (empty when none are pending). The events stay valid until the next transfer.
  KvLayerWaits take_layer_waits();
  bool layer_waits_pending() const { return pending_[0] || pending_[1]; }
  // Makes `stream` wait for every pending layer-by-layer copy.
  Status wait_all(cudaStream_t stream);
  // Blocks the calling thread until every copy queued so far (both copy
  // streams) is done, without waiting for the model's stream: the host pool's
  // bytes are then what the transfers wrote. The one method that may be called
  // from a thread other than the engine's (it may then also wait for copies
  // queued meanwhile).
  Status wait_for_copies_on_host() const;
  // When the copies of the last transfer()/transfer_layered() call had all
  // completed (a host callback queued behind them on both copy streams), once
  // known; for request timelines. Safe from any thread.
  std::optional<std::chrono::steady_clock::time_point> last_done_at() const;
  // Calls that went layer by layer so far (tests, benchmarks).
  int64_t layered_calls() const { return layered_calls_; }

  // Totals so far; the times of copies still in flight are added once they finish.
  runtime::TransferStats stats();
  enum class CopyMethod { kKernel, kBatchedMemcpy, kMemcpyPerPiece, kStaged };
  void set_copy_method(CopyMethod method) {
    methods_[0] = methods_[1] = method;
    batch_api_ = true;
  }
  void set_copy_method(runtime::TransferDirection direction, CopyMethod method) {
    methods_[static_cast<int>(direction)] = method;
    batch_api_ = true;
  }
  CopyMethod copy_method(runtime::TransferDirection direction = runtime::TransferDirection::kDeviceToHost) const {
    return methods_[static_cast<int>(direction)];
  }
  // With kBatchedMemcpy: false once the driver refused cudaMemcpyBatchAsync (then one cudaMemcpyAsync per piece).
  bool batch_api_in_use() const { return batch_api_; }
  // The copy kernel's grid cap between the pools (kv_host_copy.h): 0 (default)
  // one CTA per block, layer and slice; n > 0 at most n CTAs per launch, so a
  // load beside the forward leaves it the other SMs.
  void set_copy_kernel_ctas(int32_t max_ctas) { copy_ctas_ = max_ctas < 0 ? 0 : max_ctas; }
  int32_t copy_kernel_ctas() const { return copy_ctas_; }

 private:
  struct Timing {
    int direction;  // -1: both directions on one stream
    cudaEvent_t start, stop;
    double share_out;  // direction -1: the device->host share of its blocks
  };
  CudaHostKvPool() = default;
  Status transfer_impl(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device,
                       cudaStream_t stream, bool layered, bool* went_layered);
  // One direction's blocks (distinct) on streams_[d] by methods_[d]; with
  // per_layer and the kernel, one layer at a time, layer_done_[d][l] after each.
  Status copy_direction(int d, std::span<const int32_t> device_blocks, std::span<const int32_t> host_blocks,
                        const CudaKvPool& device, bool per_layer);
  Status copy_staged(int d, std::span<const int32_t> device_blocks, std::span<const int32_t> host_blocks,
                     const CudaKvPool& device);
  Status issue(std::vector<void*>& dsts, std::vector<const void*>& srcs, std::vector<size_t>& sizes,
               cudaStream_t stream);
  void collect_timings(bool wait);
  // After a failed call: waits for whatever of it was queued, so that its destinations can be declared lost.
  void abandon();

  PinnedBuffer memory_;
  int32_t num_blocks_ = 0;
  int32_t num_layers_ = 0;
  size_t block_bytes_ = 0;
  cudaStream_t streams_[runtime::kNumTransferDirections] = {nullptr, nullptr};
  cudaEvent_t ready_ = nullptr;                                   // the model stream's work so far
  cudaEvent_t done_[runtime::kNumTransferDirections] = {nullptr, nullptr};  // a batch's copies per direction
  std::vector<cudaEvent_t> layer_done_[runtime::kNumTransferDirections];   // per layer, layer by layer
  bool pending_[runtime::kNumTransferDirections] = {false, false};        // layer events not yet taken
  int64_t layered_calls_ = 0;
  DeviceBuffer staging_[runtime::kNumTransferDirections];  // kStaged: blocks in host-chunk layout
  CopyMethod methods_[runtime::kNumTransferDirections] = {CopyMethod::kKernel, CopyMethod::kKernel};
  bool batch_api_ = true;  // cudaMemcpyBatchAsync works here
  int32_t copy_ctas_ = 0;  // the copy kernel's grid cap (0: none)
  std::vector<Timing> timings_;
  // Set by the host callback after a call's copies (steady-clock nanoseconds; 0: none yet).
  std::atomic<int64_t> done_ns_{0};
  static void mark_done(void* pool);
  void mark_done_after_copies();
  runtime::TransferStats stats_;
};

}  // namespace pagoda::cuda
