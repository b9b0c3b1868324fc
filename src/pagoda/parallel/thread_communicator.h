#pragma once
// Communicators for ranks that are threads of one process (the CPU backend's
// tensor parallelism, and the tests of the sharding logic): buffers are
// ordinary host memory, shared through the group's state, and every
// collective is two rendezvous on a std::barrier. First each rank posts its
// buffer pointers, count and dtype; then, after the first rendezvous, every
// rank checks that all posts agree (so all ranks return the same error), does
// its part (all_reduce: rank r sums elements [r*count/N, (r+1)*count/N) over
// all ranks' buffers in rank order and writes the sum into every buffer, so
// each element is read and written by one thread only; all_gather and
// broadcast: each rank copies what it receives), and the second rendezvous
// keeps every buffer alive and unchanged until all ranks are done with it.
// Nothing is allocated per collective, and the barrier is reusable, so the
// group is correct under any number of repetitions.
//
// Thread safety: communicator r is used by one thread at a time (rank r's);
// the N communicators of a group run concurrently. A rank that stops calling
// collectives while the others wait blocks them (as with NCCL): the caller
// keeps the ranks in step.

#include <cstdint>
#include <memory>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/parallel/communicator.h"

namespace pagoda::parallel {

// N communicators of one group, index = rank. kInvalidArgument when size < 1.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_thread_communicators(int32_t size);

}  // namespace pagoda::parallel
