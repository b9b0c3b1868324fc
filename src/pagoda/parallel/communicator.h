#pragma once
// Collectives among the ranks of one tensor-parallel group
// (docs/TENSOR_PARALLEL.md): every rank holds one Communicator and calls the
// same collectives in the same order with the same count and dtype, as NCCL
// requires. Two implementations: ranks as CPU threads of one process sharing
// memory (parallel/thread_communicator.h), and NCCL over GPUs
// (parallel/nccl_communicator.h, built only with PAGODA_CUDA), whose buffers
// are device memory.
//
// Sums are deterministic: every element is added in rank order 0, 1, ..., N-1
// (f32 accumulation for bf16, one rounding at the end) and every rank receives
// the same bits, so a TP=N run is reproducible and its ranks never diverge.
// (NCCL's own order is fixed for a given topology and size but is not rank
// order.)
//
// Errors: a dtype the collective does not take, a root outside [0, size), or
// ranks that disagree on count or dtype (kInvalidArgument, on every rank).
//
// Thread safety: a Communicator belongs to its rank's thread; different ranks'
// communicators are used concurrently, one thread each.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"

namespace pagoda::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;

  // In place: data[i] becomes the sum over ranks of data[i]; dtype kF32 or kBF16.
  virtual Status all_reduce_sum(void* data, size_t count, DType dtype) = 0;
  // recv[r * count + i] = rank r's send[i]; send and recv do not overlap.
  // Any dtype of whole bytes (not int4).
  virtual Status all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // data on every rank becomes root's data. Any dtype of whole bytes.
  virtual Status broadcast(void* data, size_t count, DType dtype, int32_t root) = 0;
  // Returns once every rank has called it.
  virtual Status barrier() = 0;
};

// The checks every implementation makes before a collective: kInvalidArgument
// naming the collective for a dtype it does not take.
Status check_reduce_dtype(DType dtype, const char* collective);
Status check_copy_dtype(DType dtype, const char* collective);
// Bytes of one element of a dtype of whole bytes.
size_t element_bytes(DType dtype);

}  // namespace pagoda::parallel
