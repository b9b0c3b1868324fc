#include "pagoda/core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace pagoda {

namespace {
thread_local bool tls_inside_task = false;
thread_local ThreadPool* tls_current = nullptr;
}

ThreadPool::ScopedCurrent::ScopedCurrent(ThreadPool* pool) : previous_(tls_current) { tls_current = pool; }

ThreadPool::ScopedCurrent::~ScopedCurrent() { tls_current = previous_; }

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() { return tls_current != nullptr ? *tls_current : process(); }

ThreadPool& ThreadPool::process() {
  static ThreadPool pool([] {
    const char* env = std::getenv("PAGODA_THREADS");
    return env ? static_cast<size_t>(std::max(0, std::atoi(env))) : size_t{0};
  }());
  return pool;
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk) {
  if (n == 0) return;
  min_chunk = std::max<size_t>(1, min_chunk);
  size_t chunks = std::min(size(), (n + min_chunk - 1) / min_chunk);
  if (chunks <= 1 || workers_.empty() || tls_inside_task) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  task_ = &fn;
  task_n_ = n;
  task_chunks_ = chunks;
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  work_ready_.notify_all();
  // The calling thread takes chunks too.
  while (next_chunk_ < task_chunks_) {
    size_t c = next_chunk_++;
    lock.unlock();
    tls_inside_task = true;
    fn(c * n / chunks, (c + 1) * n / chunks);
    tls_inside_task = false;
    lock.lock();
    ++chunks_done_;
  }
  work_done_.wait(lock, [&] { return chunks_done_ == task_chunks_; });
  task_ = nullptr;
}

void ThreadPool::worker_loop(size_t) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || (generation_ != seen && task_ && next_chunk_ < task_chunks_); });
    if (stopping_) return;
    seen = generation_;
    while (task_ && next_chunk_ < task_chunks_) {
      size_t c = next_chunk_++;
      const auto* fn = task_;
      size_t n = task_n_, chunks = task_chunks_;
      lock.unlock();
      tls_inside_task = true;
      (*fn)(c * n / chunks, (c + 1) * n / chunks);
      tls_inside_task = false;
      lock.lock();
      if (++chunks_done_ == task_chunks_) work_done_.notify_all();
    }
  }
}

}  // namespace pagoda
