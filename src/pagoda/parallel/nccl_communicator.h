#pragma once
// Communicators over NCCL for the ranks of one process, one GPU and one
// thread each (docs/TENSOR_PARALLEL.md): made together by ncclCommInitAll.
// Buffers are device memory on the rank's GPU. Each collective is enqueued on
// the communicator's own stream and waited for before the call returns, so
// a caller sees the same blocking contract as the CPU threads' communicators;
// the CUDA tensor-parallel forward enqueues on its compute stream instead
// (DeviceCommunicator's enqueue_*), so NCCL runs in stream order between its kernels.
//
// NVLink multicast (NVLS) stays off: creation sets NCCL_NVLS_ENABLE=0 in the
// environment before NCCL reads it, as the GPU machines require.
//
// Thread safety: communicator r is used by rank r's thread only; the ranks'
// calls run concurrently. Built only with PAGODA_CUDA.

#include <cstdint>
#include <memory>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/parallel/device_communicator.h"

namespace pagoda::parallel {

class NcclCommunicator : public DeviceCommunicator {};

// One communicator per entry of `devices` (CUDA ordinals, distinct), index =
// rank. Errors: an empty or repeated device list, a device that does not
// exist (naming how many there are), NCCL or CUDA failures (with their text).
StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> make_nccl_communicators(const std::vector<int32_t>& devices);

}  // namespace pagoda::parallel
