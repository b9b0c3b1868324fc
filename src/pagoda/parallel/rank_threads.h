#pragma once
// The threads of a tensor-parallel group's ranks (docs/TENSOR_PARALLEL.md):
// run(job) runs job(r) for every rank r concurrently, rank 0 on the calling
// thread and rank r >= 1 on a thread of its own that lives as long as this
// object, and returns when all are done. A job that needs per-thread state
// (a CPU rank's ThreadPool, a GPU rank's current device) sets it up inside
// job(r) each call.
//
// Thread safety: run() from one thread at a time (the group runner's caller).

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::parallel {

class RankThreads {
 public:
  explicit RankThreads(int32_t size);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int32_t size() const { return size_; }
  // job(r) for every rank at once; the first error by rank order.
  Status run(const std::function<Status(int32_t)>& job);

 private:
  void thread_main(int32_t rank);

  const int32_t size_;
  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  const std::function<Status(int32_t)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int32_t pending_ = 0;
  bool stopping_ = false;
  std::vector<Status> results_;
  std::vector<std::thread> threads_;  // ranks 1..size-1
};

}  // namespace pagoda::parallel
