#include "pagoda/backend/cuda/cuda_host_kv_pool.h"

#include <algorithm>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/runtime/host_block_layout.h"
#include "pagoda/runtime/transfer_batches.h"

namespace pagoda::cuda {
namespace {

// Pieces per cudaMemcpyBatchAsync call: bounds the arrays the driver walks at once.
constexpr size_t kMaxPiecesPerCall = 8192;
// Blocks per round through a staging buffer (kStaged): about 64 MB per direction for ~2 MB blocks.
constexpr int32_t kStagingBlocks = 32;

constexpr int kD2H = static_cast<int>(runtime::TransferDirection::kDeviceToHost);

}  // namespace

StatusOr<std::unique_ptr<CudaHostKvPool>> CudaHostKvPool::create(const KvPoolShape& shape, int32_t num_blocks) {
  if (num_blocks <= 0) return invalid_argument_error("host KV pool: {} blocks", num_blocks);
  std::unique_ptr<CudaHostKvPool> pool(new CudaHostKvPool());
  pool->num_blocks_ = num_blocks;
  pool->num_layers_ = shape.num_layers;
  pool->block_bytes_ = runtime::host_block_layout(shape).block_bytes();
  const size_t bytes = pool->block_bytes_ * static_cast<size_t>(num_blocks);
  auto memory = PinnedBuffer::allocate(bytes);
  if (!memory.ok())
    return resource_exhausted_error("cannot pin {:.2f} GiB of host memory for the host KV tier ({} blocks of {} "
                                    "bytes): {}", bytes / double(1ull << 30), num_blocks, pool->block_bytes_,
                                    memory.status().message());
  pool->memory_ = std::move(*memory);
  // The highest priority: a copy's CTAs are scheduled before a running forward's queued ones.
  int least = 0, greatest = 0;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (auto& s : pool->streams_)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&pool->ready_, cudaEventDisableTiming));
  for (auto& e : pool->done_) PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& events : pool->layer_done_) {
    events.assign(static_cast<size_t>(shape.num_layers), nullptr);
    for (auto& e : events) PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return pool;
}

CudaHostKvPool::~CudaHostKvPool() {
  for (cudaStream_t s : streams_)
    if (s != nullptr) cudaStreamSynchronize(s);
  collect_timings(/*wait=*/true);
  for (cudaStream_t s : streams_)
    if (s != nullptr) cudaStreamDestroy(s);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  for (cudaEvent_t e : done_)
    if (e != nullptr) cudaEventDestroy(e);
  for (auto& events : layer_done_)
    for (cudaEvent_t e : events)
      if (e != nullptr) cudaEventDestroy(e);
}

Status CudaHostKvPool::issue(std::vector<void*>& dsts, std::vector<const void*>& srcs, std::vector<size_t>& sizes,
                             cudaStream_t stream) {
  size_t at = 0;
  while (batch_api_ && at < dsts.size()) {
    const size_t n = std::min(kMaxPiecesPerCall, dsts.size() - at);
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const cudaError_t err =
        cudaMemcpyBatchAsync(dsts.data() + at, srcs.data() + at, sizes.data() + at, n, &attributes, &first, 1, stream);
    if (err == cudaErrorNotSupported || (err == cudaErrorInvalidValue && at == 0)) {
      cudaGetLastError();
      batch_api_ = false;  // an older driver: one cudaMemcpyAsync per piece from here on
      break;
    }
    PAGODA_CUDA_RETURN_IF_ERROR(err);
    at += n;
  }
  for (; at < dsts.size(); ++at)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dsts[at], srcs[at], sizes[at], cudaMemcpyDefault, stream));
  return ok_status();
}

Status CudaHostKvPool::copy_staged(int d, std::span<const int32_t> device_blocks,
                                   std::span<const int32_t> host_blocks, const CudaKvPool& device) {
  DeviceBuffer& staging = staging_[d];
  if (staging.data() == nullptr) {
    auto buffer = DeviceBuffer::allocate(block_bytes_ * kStagingBlocks);
    if (!buffer.ok())
      return resource_exhausted_error("host KV tier: no device memory for a {} MB staging buffer: {}",
                                      block_bytes_ * kStagingBlocks >> 20, buffer.status().message());
    staging = std::move(*buffer);
  }
  cudaStream_t copy = streams_[d];
  const bool to_host = d == kD2H;
  const KvHostCopyGeometry geometry = device.host_copy_geometry(staging.as<std::byte>(), block_bytes_);
  // The whole chunks, runs of consecutive host blocks in one copy each.
  auto move_chunks = [&](size_t at, int32_t n) -> Status {
    for (int32_t i = 0; i < n;) {
      int32_t run = 1;
      while (i + run < n && host_blocks[at + i + run] == host_blocks[at + i] + run) ++run;
      std::byte* host = block(host_blocks[at + i]);
      std::byte* staged = staging.as<std::byte>() + static_cast<size_t>(i) * block_bytes_;
      const size_t bytes = static_cast<size_t>(run) * block_bytes_;
      PAGODA_CUDA_RETURN_IF_ERROR(to_host ? cudaMemcpyAsync(host, staged, bytes, cudaMemcpyDeviceToHost, copy)
                                          : cudaMemcpyAsync(staged, host, bytes, cudaMemcpyHostToDevice, copy));
      i += run;
    }
    return ok_status();
  };
  KvHostCopyPairs pairs;
  for (size_t at = 0; at < device_blocks.size(); at += kStagingBlocks) {
    pairs.count = static_cast<int32_t>(std::min<size_t>(kStagingBlocks, device_blocks.size() - at));
    for (int32_t i = 0; i < pairs.count; ++i) {
      pairs.device_block[i] = device_blocks[at + static_cast<size_t>(i)];
      pairs.host_block[i] = i;  // the staging slot
    }
    // One stream: a round's chunks leave the staging buffer before the next round fills it.
    if (to_host) {
      PAGODA_CUDA_RETURN_IF_ERROR(kv_host_copy(geometry, pairs, true, copy));
      PAGODA_RETURN_IF_ERROR(move_chunks(at, pairs.count));
    } else {
      PAGODA_RETURN_IF_ERROR(move_chunks(at, pairs.count));
      PAGODA_CUDA_RETURN_IF_ERROR(kv_host_copy(geometry, pairs, false, copy));
    }
  }
  return ok_status();
}

Status CudaHostKvPool::copy_direction(int d, std::span<const int32_t> device_blocks,
                                      std::span<const int32_t> host_blocks, const CudaKvPool& device,
                                      bool per_layer) {
  cudaStream_t copy = streams_[d];
  const bool to_host = d == kD2H;
  switch (methods_[d]) {
    case CopyMethod::kKernel: {
      const KvHostCopyGeometry geometry = device.host_copy_geometry(block(0), block_bytes_);
      KvHostCopyPairs pairs;
      const int32_t layers = per_layer ? num_layers_ : 1;
      for (int32_t l = 0; l < layers; ++l) {
        for (size_t at = 0; at < device_blocks.size(); at += kKvHostCopyMaxPairs) {
          pairs.count = static_cast<int32_t>(std::min<size_t>(kKvHostCopyMaxPairs, device_blocks.size() - at));
          std::copy_n(device_blocks.begin() + static_cast<int64_t>(at), pairs.count, pairs.device_block);
          std::copy_n(host_blocks.begin() + static_cast<int64_t>(at), pairs.count, pairs.host_block);
          PAGODA_CUDA_RETURN_IF_ERROR(per_layer ? kv_host_copy_layers(geometry, pairs, to_host, l, 1, copy, copy_ctas_)
                                                : kv_host_copy(geometry, pairs, to_host, copy, copy_ctas_));
        }
        if (per_layer) PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(layer_done_[d][static_cast<size_t>(l)], copy));
      }
      return ok_status();
    }
    case CopyMethod::kStaged:
      return copy_staged(d, device_blocks, host_blocks, device);
    case CopyMethod::kBatchedMemcpy:
    case CopyMethod::kMemcpyPerPiece: {
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<size_t> sizes;
      for (size_t i = 0; i < device_blocks.size(); ++i)
        device.append_block_copies(device_blocks[i], block(host_blocks[i]), to_host, dsts, srcs, sizes);
      if (methods_[d] == CopyMethod::kMemcpyPerPiece) batch_api_ = false;
      return issue(dsts, srcs, sizes, copy);
    }
  }
  return internal_error("host KV tier: unknown copy method");
}

Status CudaHostKvPool::transfer(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device,
                                cudaStream_t stream) {
  bool went_layered = false;
  Status status = transfer_impl(transfers, device, stream, /*layered=*/false, &went_layered);
  if (!status.ok()) abandon();
  else if (!transfers.empty()) mark_done_after_copies();
  return status;
}

void CudaHostKvPool::mark_done(void* pool) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  std::atomic<int64_t>& done = static_cast<CudaHostKvPool*>(pool)->done_ns_;
  int64_t seen = done.load();
  while (seen < now && !done.compare_exchange_weak(seen, now)) {
  }
}

std::optional<std::chrono::steady_clock::time_point> CudaHostKvPool::last_done_at() const {
  const int64_t ns = done_ns_.load();
  if (ns == 0) return std::nullopt;
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

StatusOr<bool> CudaHostKvPool::transfer_layered(std::span<const runtime::BlockTransfer> transfers,
                                                const CudaKvPool& device, cudaStream_t stream) {
  bool went_layered = false;
  Status status = transfer_impl(transfers, device, stream, /*layered=*/true, &went_layered);
  if (!status.ok()) {
    abandon();
    return status;
  }
  if (!transfers.empty()) mark_done_after_copies();
  return went_layered;
}

void CudaHostKvPool::mark_done_after_copies() {
  // Timing only: a refused callback leaves the last time as it was.
  for (cudaStream_t copy : streams_)
    if (cudaLaunchHostFunc(copy, &CudaHostKvPool::mark_done, this) != cudaSuccess) cudaGetLastError();
}

void CudaHostKvPool::abandon() {
  for (cudaStream_t s : streams_) cudaStreamSynchronize(s);
  pending_[0] = pending_[1] = false;
  cudaGetLastError();
}

KvLayerWaits CudaHostKvPool::take_layer_waits() {
  KvLayerWaits waits;
  for (int d = 0; d < runtime::kNumTransferDirections; ++d)
    if (pending_[d]) ++waits.per_layer;
  if (waits.per_layer == 0) return waits;
  for (int32_t l = 0; l < num_layers_; ++l)
    for (int d = 0; d < runtime::kNumTransferDirections; ++d)
      if (pending_[d]) waits.events.push_back(layer_done_[d][static_cast<size_t>(l)]);
  pending_[0] = pending_[1] = false;
  return waits;
}

Status CudaHostKvPool::wait_all(cudaStream_t stream) {
  const KvLayerWaits waits = take_layer_waits();
  PAGODA_CUDA_RETURN_IF_ERROR(waits.wait_all(stream));
  return ok_status();
}

Status CudaHostKvPool::transfer_impl(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device,
                                     cudaStream_t stream, bool layered, bool* went_layered) {
  *went_layered = false;
  if (transfers.empty()) return ok_status();
  // Copies of an earlier call whose layer events nobody took come first (their events get re-recorded below).
  PAGODA_RETURN_IF_ERROR(wait_all(stream));
  collect_timings(/*wait=*/false);
  // The copies start after everything queued on the model's stream so far.
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, stream));
  // Batches of distinct blocks, each block's transfers in list order (runtime/transfer_batches.h).
  using Batch = runtime::TransferBatch;
  const std::vector<Batch> batches = runtime::plan_transfer_batches(transfers);
  int64_t blocks[runtime::kNumTransferDirections] = {0, 0};
  for (const Batch& batch : batches)
    for (int d = 0; d < runtime::kNumTransferDirections; ++d)
      blocks[d] += static_cast<int64_t>(batch.device_blocks[d].size());
  for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
    stats_.blocks[d] += blocks[d];
    stats_.bytes[d] += blocks[d] * static_cast<int64_t>(block_bytes_);
  }
  auto start_timing = [&](int d, cudaStream_t copy, double share_out) -> StatusOr<size_t> {
    Timing timing{d, nullptr, nullptr, share_out};
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timing.start));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timing.stop));
    timings_.push_back(timing);
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(timing.start, copy));
    return timings_.size() - 1;
  };

  const bool kernels = methods_[0] == CopyMethod::kKernel && methods_[1] == CopyMethod::kKernel;
  if (layered && kernels && batches.size() > 1) {
    // Several batches, layer by layer: everything on one copy stream in list order per layer (layer l of
    // batch b after layer l of batch b - 1), one event per layer. The directions share the stream.
    cudaStream_t copy = streams_[0];
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, ready_, 0));
    const double out_share = static_cast<double>(blocks[0]) / static_cast<double>(blocks[0] + blocks[1]);
    PAGODA_ASSIGN_OR_RETURN(const size_t timing, start_timing(-1, copy, out_share));
    const KvHostCopyGeometry geometry = device.host_copy_geometry(block(0), block_bytes_);
    KvHostCopyPairs pairs;
    for (int32_t l = 0; l < num_layers_; ++l) {
      for (const Batch& batch : batches)
        for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
          const auto& device_blocks = batch.device_blocks[d];
          for (size_t at = 0; at < device_blocks.size(); at += kKvHostCopyMaxPairs) {
            pairs.count = static_cast<int32_t>(std::min<size_t>(kKvHostCopyMaxPairs, device_blocks.size() - at));
            std::copy_n(device_blocks.begin() + static_cast<int64_t>(at), pairs.count, pairs.device_block);
            std::copy_n(batch.host_blocks[d].begin() + static_cast<int64_t>(at), pairs.count, pairs.host_block);
            PAGODA_CUDA_RETURN_IF_ERROR(kv_host_copy_layers(geometry, pairs, d == kD2H, l, 1, copy, copy_ctas_));
          }
        }
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(layer_done_[0][static_cast<size_t>(l)], copy));
    }
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(timings_[timing].stop, copy));
    pending_[0] = true;
    *went_layered = true;
    ++layered_calls_;
    return ok_status();
  }

  bool used[runtime::kNumTransferDirections] = {false, false};
  for (size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    // Layer by layer only when the whole list is this one batch.
    const bool per_layer = layered && batches.size() == 1;
    for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
      if (batch.device_blocks[d].empty()) continue;
      cudaStream_t copy = streams_[d];
      // After the model's work, and after every copy of the previous batch.
      if (b == 0) {
        PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, ready_, 0));
      } else {
        for (int e = 0; e < runtime::kNumTransferDirections; ++e)
          if (used[e]) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, done_[e], 0));
      }
      PAGODA_ASSIGN_OR_RETURN(const size_t timing, start_timing(d, copy, 0.0));
      const bool direction_per_layer = per_layer && methods_[d] == CopyMethod::kKernel;
      PAGODA_RETURN_IF_ERROR(copy_direction(d, batch.device_blocks[d], batch.host_blocks[d], device,
                                            direction_per_layer));
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(timings_[timing].stop, copy));
      if (direction_per_layer) {
        pending_[d] = true;
        *went_layered = true;
      }
    }
    // This batch's copies, as the next batch (and the model's stream) will wait on them.
    for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
      if (batch.device_blocks[d].empty()) continue;
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[d], streams_[d]));
      used[d] = true;
    }
    // A direction idle in this batch keeps its older done_ event, which is
    // complete before this batch started: waiting on it again is harmless.
  }
  if (*went_layered) ++layered_calls_;
  // The next work on the model's stream waits for every copy not left to the layer events.
  for (int d = 0; d < runtime::kNumTransferDirections; ++d)
    if (used[d] && !pending_[d]) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, done_[d], 0));
  return ok_status();
}

Status CudaHostKvPool::wait_for_copies_on_host() const {
  for (cudaStream_t copy : streams_) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy));
  return ok_status();
}

void CudaHostKvPool::collect_timings(bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < timings_.size(); ++i) {
    Timing& t = timings_[i];
    if (wait) cudaEventSynchronize(t.stop);
    const cudaError_t state = cudaEventQuery(t.stop);
    if (state == cudaErrorNotReady) {
      timings_[kept++] = t;
      continue;
    }
    float ms = 0.0f;
    if (state == cudaSuccess && cudaEventElapsedTime(&ms, t.start, t.stop) == cudaSuccess) {
      if (t.direction >= 0) {
        stats_.seconds[t.direction] += ms * 1e-3;
      } else {  // both directions on one stream: split by their share of the blocks
        stats_.seconds[kD2H] += ms * 1e-3 * t.share_out;
        stats_.seconds[1 - kD2H] += ms * 1e-3 * (1.0 - t.share_out);
      }
    }
    cudaGetLastError();
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
  }
  timings_.resize(kept);
}

runtime::TransferStats CudaHostKvPool::stats() {
  collect_timings(/*wait=*/false);
  return stats_;
}

}  // namespace pagoda::cuda
