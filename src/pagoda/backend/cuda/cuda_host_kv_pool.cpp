#include "pagoda/backend/cuda/cuda_host_kv_pool.h"

#include <algorithm>
#include <unordered_set>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/runtime/host_block_layout.h"

namespace pagoda::cuda {
namespace {

// Pieces per cudaMemcpyBatchAsync call: bounds the arrays the driver walks at once.
constexpr size_t kMaxPiecesPerCall = 8192;

}  // namespace

StatusOr<std::unique_ptr<CudaHostKvPool>> CudaHostKvPool::create(const KvPoolShape& shape, int32_t num_blocks) {
  if (num_blocks <= 0) return invalid_argument_error("host KV pool: {} blocks", num_blocks);
  std::unique_ptr<CudaHostKvPool> pool(new CudaHostKvPool());
  pool->num_blocks_ = num_blocks;
  pool->block_bytes_ = runtime::host_block_layout(shape).block_bytes();
  const size_t bytes = pool->block_bytes_ * static_cast<size_t>(num_blocks);
  auto memory = PinnedBuffer::allocate(bytes);
  if (!memory.ok())
    return resource_exhausted_error("cannot pin {:.2f} GiB of host memory for the host KV tier ({} blocks of {} "
                                    "bytes): {}", bytes / double(1ull << 30), num_blocks, pool->block_bytes_,
                                    memory.status().message());
  pool->memory_ = std::move(*memory);
  for (auto& s : pool->streams_) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&pool->ready_, cudaEventDisableTiming));
  for (auto& e : pool->done_) PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
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

Status CudaHostKvPool::transfer(std::span<const runtime::BlockTransfer> transfers, const CudaKvPool& device,
                                cudaStream_t stream) {
  if (transfers.empty()) return ok_status();
  collect_timings(/*wait=*/false);
  // The copies start after everything queued on the model's stream so far.
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, stream));
  bool first_batch = true;
  bool used[runtime::kNumTransferDirections] = {false, false};
  size_t begin = 0;
  while (begin < transfers.size()) {
    // The longest run from `begin` in which no block is touched twice.
    std::unordered_set<int64_t> touched;
    size_t end = begin;
    for (; end < transfers.size(); ++end) {
      const int64_t device_key = transfers[end].device_block;
      const int64_t host_key = -1 - static_cast<int64_t>(transfers[end].host_block);
      if (touched.count(device_key) || touched.count(host_key)) break;
      touched.insert(device_key);
      touched.insert(host_key);
    }
    std::vector<void*> dsts[runtime::kNumTransferDirections];
    std::vector<const void*> srcs[runtime::kNumTransferDirections];
    std::vector<size_t> sizes[runtime::kNumTransferDirections];
    std::vector<int32_t> device_blocks[runtime::kNumTransferDirections], host_blocks[runtime::kNumTransferDirections];
    int64_t blocks[runtime::kNumTransferDirections] = {0, 0};
    for (size_t i = begin; i < end; ++i) {
      const runtime::BlockTransfer& t = transfers[i];
      const int d = static_cast<int>(t.direction);
      if (method_ == CopyMethod::kKernel) {
        device_blocks[d].push_back(t.device_block);
        host_blocks[d].push_back(t.host_block);
      } else {
        device.append_block_copies(t.device_block, block(t.host_block),
                                   t.direction == runtime::TransferDirection::kDeviceToHost, dsts[d], srcs[d],
                                   sizes[d]);
      }
      ++blocks[d];
    }
    for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
      if (blocks[d] == 0) continue;
      cudaStream_t copy = streams_[d];
      // After the model's work, and after every copy of the previous batch.
      if (first_batch) {
        PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, ready_, 0));
      } else {
        for (int e = 0; e < runtime::kNumTransferDirections; ++e)
          if (used[e]) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, done_[e], 0));
      }
      Timing timing{d, nullptr, nullptr};
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timing.start));
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timing.stop));
      timings_.push_back(timing);
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(timing.start, copy));
      if (method_ == CopyMethod::kKernel) {
        const KvHostCopyGeometry geometry = device.host_copy_geometry(block(0), block_bytes_);
        const bool to_host = d == static_cast<int>(runtime::TransferDirection::kDeviceToHost);
        KvHostCopyPairs pairs;
        for (size_t at = 0; at < device_blocks[d].size(); at += kKvHostCopyMaxPairs) {
          pairs.count = static_cast<int32_t>(std::min<size_t>(kKvHostCopyMaxPairs, device_blocks[d].size() - at));
          std::copy_n(device_blocks[d].begin() + static_cast<int64_t>(at), pairs.count, pairs.device_block);
          std::copy_n(host_blocks[d].begin() + static_cast<int64_t>(at), pairs.count, pairs.host_block);
          PAGODA_CUDA_RETURN_IF_ERROR(kv_host_copy(geometry, pairs, to_host, copy));
        }
      } else {
        if (method_ == CopyMethod::kMemcpyPerPiece) batch_api_ = false;
        PAGODA_RETURN_IF_ERROR(issue(dsts[d], srcs[d], sizes[d], copy));
      }
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(timing.stop, copy));
      stats_.blocks[d] += blocks[d];
      stats_.bytes[d] += blocks[d] * static_cast<int64_t>(block_bytes_);
    }
    // This batch's copies, as the next batch (and the model's stream) will wait on them.
    for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
      if (blocks[d] == 0) continue;
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[d], streams_[d]));
      used[d] = true;
    }
    // A direction idle in this batch keeps its older done_ event, which is
    // complete before this batch started: waiting on it again is harmless.
    first_batch = false;
    begin = end;
  }
  // The next work on the model's stream (the forward) waits for every copy.
  for (int d = 0; d < runtime::kNumTransferDirections; ++d)
    if (used[d]) PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, done_[d], 0));
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
    if (state == cudaSuccess && cudaEventElapsedTime(&ms, t.start, t.stop) == cudaSuccess)
      stats_.seconds[t.direction] += ms * 1e-3;
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
