#include "pagoda/parallel/rank_threads.h"

namespace pagoda::parallel {

RankThreads::RankThreads(int32_t size) : size_(size < 1 ? 1 : size), results_(static_cast<size_t>(size_)) {
  for (int32_t r = 1; r < size_; ++r) threads_.emplace_back([this, r] { thread_main(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankThreads::thread_main(int32_t rank) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const auto* job = job_;
    lock.unlock();
    Status status = (*job)(rank);
    lock.lock();
    results_[static_cast<size_t>(rank)] = std::move(status);
    if (--pending_ == 0) work_done_.notify_all();
  }
}

Status RankThreads::run(const std::function<Status(int32_t)>& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    pending_ = size_ - 1;
    ++generation_;
  }
  work_ready_.notify_all();
  results_[0] = job(0);
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  for (const Status& s : results_)
    if (!s.ok()) return s;
  return ok_status();
}

}  // namespace pagoda::parallel
