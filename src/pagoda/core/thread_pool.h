#pragma once
// A fixed pool of worker threads for data-parallel CPU work (GEMM rows,
// attention heads). parallel_for splits [0, n) into contiguous chunks, runs them
// on the workers and the calling thread, and returns when all are done.
//
// Chunks are claimed one at a time from a shared atomic counter, so a thread
// that starts late (a worker still waking, or preempted by other load) only
// takes what is left: the caller works through every chunk nobody has claimed
// and waits only for chunks already running. Idle workers spin for a short
// while (PAGODA_POOL_SPIN_US microseconds, default 1000) before they park on a
// condition variable, so the next parallel_for of a decode step finds them
// awake without a wake-up call; a pool idle for longer costs no CPU. They do
// not spin while the box is oversubscribed (1-minute load average at or above
// the core count + 1: a spinning thread then takes time slices from working
// ones). PAGODA_POOL_SPIN_US=0 parks at once.
//
// Thread safety: parallel_for may be called from one thread at a time per pool
// (the engine loop); nested calls from inside a task run serially.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
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
  // least min_chunk long, so tiny loops stay on the calling thread. At most
  // chunks_per_thread * size() chunks: 1 gives one contiguous slice per thread
  // (what a GEMM that repacks its inputs per call wants); more lets threads
  // even out late starts (decode GEMVs, whose cost per row is fixed).
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk = 1,
                    size_t chunks_per_thread = 1);

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
  void worker_loop();
  // Claims and runs chunks of the task published as generation `gen` until none
  // is left; false once the ticket belongs to another generation.
  void run_chunks(uint32_t gen);

  std::vector<std::thread> workers_;
  // The current task. Written by the caller before it publishes the task's
  // generation in ticket_, read by workers after they load ticket_.
  std::atomic<const std::function<void(size_t, size_t)>*> task_{nullptr};
  std::atomic<size_t> task_n_{0};
  std::atomic<uint32_t> task_chunks_{0};
  // (generation << 32) | next unclaimed chunk: one compare-and-swap claims a
  // chunk of exactly that generation's task.
  alignas(64) std::atomic<uint64_t> ticket_{0};
  alignas(64) std::atomic<uint32_t> chunks_done_{0};
  // Parking: workers that gave up spinning wait on park_cv_ until epoch_ (bumped with every task) moves.
  alignas(64) std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> sleepers_{0};
  std::mutex park_mutex_;
  std::condition_variable park_cv_;
  std::atomic<bool> stopping_{false};
  uint32_t generation_ = 0;  // the caller's
  int64_t spin_ns_ = 0;
  // Whether workers spin before parking: off while the 1-minute load average is at or above the core
  // count + 1 (re-read at most once a second by the caller).
  void update_spin_allowed();
  std::atomic<bool> spin_allowed_{true};
  int64_t load_checked_ns_ = INT64_MIN / 2;
};

}  // namespace pagoda
