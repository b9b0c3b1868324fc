#pragma once
// A fixed pool of worker threads for data-parallel CPU work (GEMM rows,
// attention heads). parallel_for splits [0, n) into contiguous chunks, runs them
// on the workers and the calling thread, and returns when all are done.
//
// Thread safety: parallel_for may be called from one thread at a time per pool
// (the engine loop); nested calls from inside a task run serially.

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pagoda {

class ThreadPool {
 public:
  // threads == 0: one per hardware thread.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n). Chunks are at
  // least min_chunk long, so tiny loops stay on the calling thread.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk = 1);

  // The pool for this thread's data-parallel work: the one a ScopedCurrent
  // installed on this thread, else the process-wide pool (size from
  // PAGODA_THREADS, else hardware threads).
  static ThreadPool& global();
  // The process-wide pool, whatever this thread's current one is.
  static ThreadPool& process();

  // Makes `pool` this thread's global() until the scope ends (tensor-parallel
  // ranks: each rank thread runs its kernels on its own pool, so ranks never
  // call one pool concurrently). Scopes nest; one thread only.
  class ScopedCurrent {
   public:
    explicit ScopedCurrent(ThreadPool* pool);
    ~ScopedCurrent();
    ScopedCurrent(const ScopedCurrent&) = delete;
    ScopedCurrent& operator=(const ScopedCurrent&) = delete;

   private:
    ThreadPool* previous_;
  };

 private:
  void worker_loop(size_t index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(size_t, size_t)>* task_ = nullptr;
  size_t task_n_ = 0;
  size_t task_chunks_ = 0;
  size_t next_chunk_ = 0;
  size_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace pagoda
