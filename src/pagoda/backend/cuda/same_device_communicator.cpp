#include "pagoda/backend/cuda/same_device_communicator.h"

#include <barrier>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/tensor_parallel_ops.h"

namespace pagoda::cuda {
namespace {

enum class Kind { kAllReduce, kAllGather, kBroadcast };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "all_reduce_sum";
    case Kind::kAllGather: return "all_gather";
    case Kind::kBroadcast: return "broadcast";
  }
  return "collective";
}

struct Post {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  int32_t root = 0;
  bool in_graph = false;  // enqueued while the rank's stream is being captured
};

// What the ranks of one group share.
struct Group {
  explicit Group(int32_t n) : size(n), sync(n), posts(static_cast<size_t>(n)), ready(static_cast<size_t>(n)) {}
  ~Group() {
    for (cudaEvent_t e : ready)
      if (e != nullptr) cudaEventDestroy(e);
    if (done != nullptr) cudaEventDestroy(done);
    if (counters != nullptr) cudaFree(counters);
  }
  const int32_t size;
  int32_t device = 0;
  std::barrier<> sync;
  std::vector<Post> posts;          // slot r: rank r's call
  std::vector<cudaEvent_t> ready;   // recorded on rank r's stream: its buffers are ready
  cudaEvent_t done = nullptr;       // recorded on rank 0's stream: the collective is done
  // Device memory of the rendezvous inside CUDA graphs (tensor_parallel_ops.h):
  // [0, size) the ranks' counts, [size] rank 0's "done" count.
  unsigned long long* counters = nullptr;
};

class SameDeviceRank final : public parallel::DeviceCommunicator {
 public:
  SameDeviceRank(std::shared_ptr<Group> group, int32_t rank, cudaStream_t stream)
      : group_(std::move(group)), rank_(rank), stream_(stream) {}
  ~SameDeviceRank() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return group_->size; }
  void* stream() const override { return stream_; }
  int32_t device() const override { return group_->device; }

  Status enqueue_all_reduce_sum(void* data, size_t count, DType dtype, void* stream) override {
    PAGODA_RETURN_IF_ERROR(parallel::check_reduce_dtype(dtype, "all_reduce_sum"));
    return collective(Post{Kind::kAllReduce, data, data, count, dtype, 0}, static_cast<cudaStream_t>(stream));
  }
  Status enqueue_all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
    PAGODA_RETURN_IF_ERROR(parallel::check_copy_dtype(dtype, "all_gather"));
    return collective(Post{Kind::kAllGather, send, recv, count, dtype, 0}, static_cast<cudaStream_t>(stream));
  }
  Status all_reduce_sum(void* data, size_t count, DType dtype) override {
    PAGODA_RETURN_IF_ERROR(enqueue_all_reduce_sum(data, count, dtype, stream_));
    return wait();
  }
  Status all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    PAGODA_RETURN_IF_ERROR(enqueue_all_gather(send, recv, count, dtype, stream_));
    return wait();
  }
  Status broadcast(void* data, size_t count, DType dtype, int32_t root) override {
    if (root < 0 || root >= size())
      return invalid_argument_error("broadcast: root {} outside the group of {} ranks", root, size());
    PAGODA_RETURN_IF_ERROR(parallel::check_copy_dtype(dtype, "broadcast"));
    PAGODA_RETURN_IF_ERROR(collective(Post{Kind::kBroadcast, data, data, count, dtype, root}, stream_));
    return wait();
  }
  Status barrier() override {
    group_->sync.arrive_and_wait();
    return ok_status();
  }

 private:
  Status wait() {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
  }

  // The three steps of same_device_communicator.h. Every rank passes both
  // rendezvous unless the posts disagree, which every rank sees alike. While
  // the streams are being captured (every rank's at once: each rank captures
  // its own graph), the events become the device-side counters of
  // tensor_parallel_ops.h, since an event recorded in one rank's capture
  // cannot be waited on in another's; the host rendezvous then only trades
  // the pointers, once, at capture.
  Status collective(Post post, cudaStream_t stream) {
    Group& g = *group_;
    const size_t me = static_cast<size_t>(rank_);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t queried = cudaStreamIsCapturing(stream, &capture);
    post.in_graph = queried == cudaSuccess && capture == cudaStreamCaptureStatusActive;
    cudaError_t recorded = queried;
    if (queried == cudaSuccess)
      recorded = post.in_graph ? rank_signal(g.counters, rank_, stream) : cudaEventRecord(g.ready[me], stream);
    g.posts[me] = post;
    g.sync.arrive_and_wait();
    const Post& first = g.posts[0];
    for (int32_t r = 1; r < g.size; ++r) {
      const Post& p = g.posts[static_cast<size_t>(r)];
      if (p.kind != first.kind || p.count != first.count || p.dtype != first.dtype || p.root != first.root ||
          p.in_graph != first.in_graph) {
        const Status disagree = invalid_argument_error(
            "same-device collective: the ranks disagree (rank 0: {} of {} x {} root {}{}, rank {}: {} of {} x {} root "
            "{}{})",
            kind_name(first.kind), first.count, dtype_name(first.dtype), first.root,
            first.in_graph ? " in a graph capture" : "", r, kind_name(p.kind), p.count, dtype_name(p.dtype), p.root,
            p.in_graph ? " in a graph capture" : "");
        // Everyone has read the posts before anyone posts again.
        g.sync.arrive_and_wait();
        return disagree;
      }
    }
    Status status = ok_status();
    if (rank_ == 0) status = run_on_rank0(stream, first.in_graph);
    g.sync.arrive_and_wait();
    if (rank_ != 0) {
      const cudaError_t waited = first.in_graph ? rank_wait_done(g.counters, rank_, g.counters + g.size, stream)
                                                : cudaStreamWaitEvent(stream, g.done, 0);
      if (waited != cudaSuccess) status = cuda_status(waited, "waiting for rank 0's collective", __FILE__, __LINE__);
    }
    if (recorded != cudaSuccess) return cuda_status(recorded, "signalling this rank's buffers", __FILE__, __LINE__);
    return status;
  }

  Status run_on_rank0(cudaStream_t stream, bool in_graph) {
    Group& g = *group_;
    if (in_graph) {
      PAGODA_CUDA_RETURN_IF_ERROR(rank_wait_all(g.counters, g.size, stream));
    } else {
      for (int32_t r = 1; r < g.size; ++r)
        PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, g.ready[static_cast<size_t>(r)], 0));
    }
    const Post& first = g.posts[0];
    const size_t bytes = first.count * parallel::element_bytes(first.dtype);
    switch (first.kind) {
      case Kind::kAllReduce: {
        RankBuffers buffers;
        for (int32_t r = 0; r < g.size; ++r) buffers.data[r] = g.posts[static_cast<size_t>(r)].recv;
        PAGODA_CUDA_RETURN_IF_ERROR(sum_in_rank_order(buffers, g.size, static_cast<int64_t>(first.count),
                                                      first.dtype == DType::kBF16, stream));
        break;
      }
      case Kind::kAllGather:
        for (int32_t r = 0; r < g.size; ++r)
          for (int32_t k = 0; k < g.size; ++k)
            PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                static_cast<char*>(g.posts[static_cast<size_t>(r)].recv) + static_cast<size_t>(k) * bytes,
                g.posts[static_cast<size_t>(k)].send, bytes, cudaMemcpyDeviceToDevice, stream));
        break;
      case Kind::kBroadcast:
        for (int32_t r = 0; r < g.size; ++r)
          if (r != first.root && bytes > 0)
            PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g.posts[static_cast<size_t>(r)].recv,
                                                        g.posts[static_cast<size_t>(first.root)].send, bytes,
                                                        cudaMemcpyDeviceToDevice, stream));
        break;
    }
    if (in_graph) {
      PAGODA_CUDA_RETURN_IF_ERROR(rank_release(g.counters, g.counters + g.size, stream));
    } else {
      PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(g.done, stream));
    }
    return ok_status();
  }

  std::shared_ptr<Group> group_;
  const int32_t rank_;
  cudaStream_t stream_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<parallel::DeviceCommunicator>>> make_same_device_communicators(int32_t size,
                                                                                                    int32_t device) {
  if (size < 1 || size > kMaxRankBuffers)
    return invalid_argument_error("same-device communicators: {} ranks (1 to {})", size, kMaxRankBuffers);
  int count = 0;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    return invalid_argument_error("same-device communicators: device {} does not exist ({} CUDA devices)", device,
                                  count);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  auto group = std::make_shared<Group>(size);
  group->device = device;
  for (cudaEvent_t& e : group->ready) PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&group->done, cudaEventDisableTiming));
  const size_t counter_bytes = static_cast<size_t>(size + 1) * sizeof(unsigned long long);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&group->counters), counter_bytes));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(group->counters, 0, counter_bytes));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  PAGODA_CUDA_RETURN_IF_ERROR(preload_rank_kernels());
  std::vector<std::unique_ptr<parallel::DeviceCommunicator>> ranks;
  for (int32_t r = 0; r < size; ++r) {
    cudaStream_t stream = nullptr;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ranks.push_back(std::make_unique<SameDeviceRank>(group, r, stream));
  }
  return ranks;
}

}  // namespace pagoda::cuda
