#pragma once
// A Communicator whose buffers are GPU memory and whose collectives can also be
// enqueued on a caller's CUDA stream without waiting (docs/TENSOR_PARALLEL.md):
// what the CUDA tensor-parallel forward joins its ranks with, so that the
// collectives sit in stream order between the rank's kernels. Two
// implementations: NCCL, one GPU per rank (parallel/nccl_communicator.h), and
// N ranks on one GPU for tests (backend/cuda/same_device_communicator.h),
// since NCCL refuses two ranks on one device.
//
// enqueue_*: `stream` is a cudaStream_t of this rank's device. The call
// returns once the collective is queued; its result is in the buffers when
// the stream reaches that point. Every rank calls the same enqueue_* in the
// same order with the same count and dtype (host calls may block until every
// rank has made its call). The buffers must stay valid and untouched by other
// streams until the stream has passed the collective. Sums follow
// Communicator's contract (see there for NCCL's order).
//
// Thread safety: as Communicator: rank r's communicator is used by rank r's thread only.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/parallel/communicator.h"

namespace pagoda::parallel {

class DeviceCommunicator : public Communicator {
 public:
  // The stream the blocking collectives of Communicator run on (a cudaStream_t).
  virtual void* stream() const = 0;
  // The CUDA device of this rank.
  virtual int32_t device() const = 0;

  // In place on `stream`: data[i] becomes the sum over ranks; dtype kF32 or kBF16.
  virtual Status enqueue_all_reduce_sum(void* data, size_t count, DType dtype, void* stream) = 0;
  // On `stream`: recv[r * count + i] = rank r's send[i]; any dtype of whole bytes.
  virtual Status enqueue_all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) = 0;
};

}  // namespace pagoda::parallel
