#include "pagoda/parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>

namespace pagoda::parallel {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ok_status();
  return internal_error("{}: {}", what, cudaGetErrorString(err));
}

Status nccl_status(ncclResult_t res, const char* what) {
  if (res == ncclSuccess) return ok_status();
  return internal_error("{}: {}", what, ncclGetErrorString(res));
}

StatusOr<ncclDataType_t> nccl_type(DType dtype, const char* collective) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kFP8E4M3:
    case DType::kInt8: return ncclUint8;  // moved as bytes
    case DType::kInt4: break;
  }
  return invalid_argument_error("{}: dtype {} is not whole bytes per element", collective, dtype_name(dtype));
}

class NcclRank final : public NcclCommunicator {
 public:
  NcclRank(ncclComm_t comm, cudaStream_t stream, float* scratch, int32_t rank, int32_t size, int32_t device)
      : comm_(comm), stream_(stream), scratch_(scratch), rank_(rank), size_(size), device_(device) {}
  ~NcclRank() override {
    cudaSetDevice(device_);
    ncclCommDestroy(comm_);
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  void* stream() const override { return stream_; }
  int32_t device() const override { return device_; }

  Status all_reduce_sum(void* data, size_t count, DType dtype) override {
    PAGODA_RETURN_IF_ERROR(check_reduce_dtype(dtype, "all_reduce_sum"));
    PAGODA_ASSIGN_OR_RETURN(const ncclDataType_t type, nccl_type(dtype, "all_reduce_sum"));
    PAGODA_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    PAGODA_RETURN_IF_ERROR(nccl_status(ncclAllReduce(data, data, count, type, ncclSum, comm_, stream_), "ncclAllReduce"));
    return wait("ncclAllReduce");
  }
  Status all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    PAGODA_ASSIGN_OR_RETURN(const ncclDataType_t type, nccl_type(dtype, "all_gather"));
    const size_t n = type == ncclUint8 ? count * element_bytes(dtype) : count;
    PAGODA_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    PAGODA_RETURN_IF_ERROR(nccl_status(ncclAllGather(send, recv, n, type, comm_, stream_), "ncclAllGather"));
    return wait("ncclAllGather");
  }
  Status broadcast(void* data, size_t count, DType dtype, int32_t root) override {
    if (root < 0 || root >= size_)
      return invalid_argument_error("broadcast: root {} outside the group of {} ranks", root, size_);
    PAGODA_ASSIGN_OR_RETURN(const ncclDataType_t type, nccl_type(dtype, "broadcast"));
    const size_t n = type == ncclUint8 ? count * element_bytes(dtype) : count;
    PAGODA_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    PAGODA_RETURN_IF_ERROR(nccl_status(ncclBroadcast(data, data, n, type, root, comm_, stream_), "ncclBroadcast"));
    return wait("ncclBroadcast");
  }
  Status enqueue_all_reduce_sum(void* data, size_t count, DType dtype, void* stream) override {
    PAGODA_RETURN_IF_ERROR(check_reduce_dtype(dtype, "all_reduce_sum"));
    PAGODA_ASSIGN_OR_RETURN(const ncclDataType_t type, nccl_type(dtype, "all_reduce_sum"));
    return nccl_status(ncclAllReduce(data, data, count, type, ncclSum, comm_, static_cast<cudaStream_t>(stream)),
                       "ncclAllReduce");
  }
  Status enqueue_all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
    PAGODA_ASSIGN_OR_RETURN(const ncclDataType_t type, nccl_type(dtype, "all_gather"));
    const size_t n = type == ncclUint8 ? count * element_bytes(dtype) : count;
    return nccl_status(ncclAllGather(send, recv, n, type, comm_, static_cast<cudaStream_t>(stream)), "ncclAllGather");
  }
  // An all-reduce of one float: returns when every rank has reached it.
  Status barrier() override { return all_reduce_sum(scratch_, 1, DType::kF32); }

 private:
  Status wait(const char* what) { return cuda_status(cudaStreamSynchronize(stream_), what); }

  ncclComm_t comm_;
  cudaStream_t stream_;
  float* scratch_;
  const int32_t rank_, size_, device_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> make_nccl_communicators(const std::vector<int32_t>& devices) {
  if (devices.empty()) return invalid_argument_error("NCCL communicators: no devices given");
  int count = 0;
  PAGODA_RETURN_IF_ERROR(cuda_status(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  std::vector<int32_t> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return invalid_argument_error("NCCL communicators: a device is listed twice (one rank per GPU)");
  for (int32_t d : devices)
    if (d < 0 || d >= count)
      return invalid_argument_error("NCCL communicators: device {} does not exist ({} CUDA devices)", d, count);
  // NVLink multicast off: NCCL reads its environment when the first communicator is made.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  PAGODA_RETURN_IF_ERROR(nccl_status(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll"));
  std::vector<std::unique_ptr<NcclCommunicator>> ranks;
  for (int r = 0; r < n; ++r) {
    cudaStream_t stream = nullptr;
    float* scratch = nullptr;
    Status s = cuda_status(cudaSetDevice(devices[static_cast<size_t>(r)]), "cudaSetDevice");
    if (s.ok()) s = cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (s.ok()) s = cuda_status(cudaMalloc(&scratch, sizeof(float)), "cudaMalloc");
    if (!s.ok()) {
      // Ranks already wrapped free their own comm; the rest are destroyed here.
      for (int rest = r; rest < n; ++rest) ncclCommDestroy(comms[static_cast<size_t>(rest)]);
      if (stream != nullptr) cudaStreamDestroy(stream);
      return s;
    }
    ranks.push_back(std::make_unique<NcclRank>(comms[static_cast<size_t>(r)], stream, scratch, r, n,
                                               devices[static_cast<size_t>(r)]));
  }
  return ranks;
}

}  // namespace pagoda::parallel
