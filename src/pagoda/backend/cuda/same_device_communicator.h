#pragma once
// N tensor-parallel ranks on ONE GPU, for tests (docs/TENSOR_PARALLEL.md): NCCL
// refuses two ranks on one device, so this communicator lets the CUDA
// tensor-parallel forward run TP=2/4 on a single GPU and be compared with TP=1.
// Not a fast path: NCCL over one GPU per rank is the real one.
//
// Each rank has its own stream; a collective is two host rendezvous between
// the ranks' threads and CUDA events between their streams:
//   1. every rank records an event on its stream (its buffer is ready) and
//      posts its pointers, count and dtype; all ranks meet; every rank checks
//      that the posts agree (so every rank returns the same error);
//   2. rank 0's stream waits for every rank's event, then does the whole
//      collective: all-reduce is one kernel that sums element i of every
//      buffer in rank order 0..N-1 (f32 accumulation, one bf16 rounding) and
//      writes the sum back into every buffer, so every rank holds the same
//      bits; all-gather and broadcast are device-to-device copies; it records
//      a "done" event; all ranks meet again;
//   3. every other rank's stream waits for "done".
// Nothing is allocated per collective.
//
// CUDA graphs: while the ranks' streams are being captured (each rank its own
// graph, all at once, as CudaModel captures a decode step), a collective
// records no host events: the ranks meet through counters in device memory
// (tensor_parallel_ops.h: each rank signals, rank 0's stream spins until all
// have, does the collective, releases; the others spin until released), so
// every rank's graph replays on its own stream without the host. The ranks
// must then replay the same graphs in the same order (a replay on some ranks
// only hangs the others' spinning kernels), and capture and eager calls must
// not mix within one collective (the ranks that disagree get the same error).
// The spinning needs the ranks' streams to run at once: streams that share a
// hardware queue (more streams than CUDA_DEVICE_MAX_CONNECTIONS, default 8)
// run in one order, and a spinning kernel ahead of the kernel it waits for
// would never end. The tests and --tensor-parallel-same-device set 32 (and
// eager module loading) before CUDA starts when the experimental graphs are
// asked for (PAGODA_TP_CUDA_GRAPHS=1); NCCL, one GPU per rank, has no such
// limit. Their first GPU run hung: docs/TENSOR_PARALLEL.md.
//
// Thread safety: communicator r is used by rank r's thread only; the ranks'
// calls run concurrently. Built only with PAGODA_CUDA.

#include <cstdint>
#include <memory>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/parallel/device_communicator.h"

namespace pagoda::cuda {

// `size` communicators on CUDA device `device`, index = rank. Errors:
// size outside [1, 8], a device that does not exist, CUDA failures.
StatusOr<std::vector<std::unique_ptr<parallel::DeviceCommunicator>>> make_same_device_communicators(int32_t size,
                                                                                                    int32_t device);

}  // namespace pagoda::cuda
