#include "pagoda/core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pagoda {

namespace {
thread_local bool tls_inside_task = false;
thread_local ThreadPool* tls_current = nullptr;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t spin_ns_from_env() {
  constexpr int64_t kDefaultSpinUs = 1000;
  const char* env = std::getenv("PAGODA_POOL_SPIN_US");
  if (env == nullptr || *env == '\0') return kDefaultSpinUs * 1000;
  char* end = nullptr;
  const long long us = std::strtoll(env, &end, 10);
  if (end == env || us < 0) return kDefaultSpinUs * 1000;
  return static_cast<int64_t>(std::min<long long>(us, 1000000)) * 1000;
}

// After this long waiting for other threads' running chunks, the caller yields its
// core each round (the thread it waits for may be preempted on this core).
constexpr int64_t kCallerSpinBeforeYieldNs = 50'000;

// A ticket's chunk index while the caller writes the next task's fields: at or past any chunk count.
constexpr uint32_t kClosed = UINT32_MAX;
}  // namespace

ThreadPool::ScopedCurrent::ScopedCurrent(ThreadPool* pool) : previous_(tls_current) { tls_current = pool; }

ThreadPool::ScopedCurrent::~ScopedCurrent() { tls_current = previous_; }

ThreadPool::ThreadPool(size_t threads) : spin_ns_(spin_ns_from_env()) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  epoch_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(park_mutex_);
  }
  park_cv_.notify_all();
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

void ThreadPool::run_chunks(uint32_t gen) {
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(t >> 32) != gen) return;
    const uint32_t c = static_cast<uint32_t>(t);
    // These belong to generation `gen` whenever the claim below succeeds: before rewriting them for the
    // next task the caller closes the ticket (next generation, kClosed), and the fields are stored with
    // release and loaded with acquire, so a thread that reads a newer field value also sees the closed
    // ticket and its compare-and-swap on (gen, c) fails.
    const uint32_t chunks = task_chunks_.load(std::memory_order_acquire);
    if (c >= chunks) return;
    const auto* fn = task_.load(std::memory_order_acquire);
    const size_t n = task_n_.load(std::memory_order_acquire);
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    (*fn)(c * n / chunks, (static_cast<size_t>(c) + 1) * n / chunks);
    chunks_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk,
                              size_t chunks_per_thread) {
  if (n == 0) return;
  min_chunk = std::max<size_t>(1, min_chunk);
  const size_t max_chunks = size() * std::max<size_t>(1, chunks_per_thread);
  const size_t chunks = std::min({max_chunks, (n + min_chunk - 1) / min_chunk, size_t{kClosed}});
  if (chunks <= 1 || workers_.empty() || tls_inside_task) {
    fn(0, n);
    return;
  }
  update_spin_allowed();
  // Close the ticket first: a thread preempted between loading the last task's ticket and its claim
  // must not claim chunk (last gen, c) of the fields written below (it ran a chunk of this task twice
  // and counted it twice, so the caller returned early or waited forever).
  const uint32_t gen = ++generation_;
  ticket_.store((static_cast<uint64_t>(gen) << 32) | kClosed, std::memory_order_relaxed);
  task_.store(&fn, std::memory_order_release);
  task_n_.store(n, std::memory_order_release);
  task_chunks_.store(static_cast<uint32_t>(chunks), std::memory_order_release);
  chunks_done_.store(0, std::memory_order_relaxed);
  ticket_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  // Sleeping workers need a wake-up call; spinning ones see the ticket (or the epoch) change.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    // A parked worker checks the epoch under the mutex, so it either sees the new epoch or is waiting.
    { std::lock_guard<std::mutex> lock(park_mutex_); }
    park_cv_.notify_all();
  }
  // The calling thread takes chunks too, all of them if no worker is there yet.
  tls_inside_task = true;
  run_chunks(gen);
  tls_inside_task = false;
  // Only chunks that other threads claimed and still run are left to wait for.
  if (chunks_done_.load(std::memory_order_acquire) != chunks) {
    const int64_t start = now_ns();
    for (uint32_t i = 0; chunks_done_.load(std::memory_order_acquire) != chunks; ++i) {
      cpu_relax();
      if ((i & 63) == 63 && now_ns() - start > kCallerSpinBeforeYieldNs) std::this_thread::yield();
    }
  }
}

void ThreadPool::update_spin_allowed() {
  if (spin_ns_ == 0) return;
  const int64_t now = now_ns();
  if (now - load_checked_ns_ < 1'000'000'000) return;
  load_checked_ns_ = now;
  double load = 0.0;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // With more runnable threads than cores a spinning worker takes time slices from the threads that do
  // the work (its own pool's included), so spinning is only worth it while cores sit idle.
  const bool allowed = getloadavg(&load, 1) != 1 || load < static_cast<double>(cores) + 1.0;
  spin_allowed_.store(allowed, std::memory_order_relaxed);
}

void ThreadPool::worker_loop() {
  tls_inside_task = true;  // a task's own parallel_for runs inline
  // Epoch 0 is the pool before its first task: a worker that starts late still sees every later bump.
  uint32_t seen = 0;
  for (;;) {
    run_chunks(static_cast<uint32_t>(ticket_.load(std::memory_order_acquire) >> 32));
    // Spin for the next task for a while, then park.
    const bool spin = spin_ns_ > 0 && spin_allowed_.load(std::memory_order_relaxed);
    const int64_t start = spin ? now_ns() : 0;
    uint32_t e = epoch_.load(std::memory_order_acquire);
    for (uint32_t i = 0; e == seen && spin; ++i) {
      cpu_relax();
      if ((i & 255) == 255 && now_ns() - start > spin_ns_) break;
      e = epoch_.load(std::memory_order_acquire);
    }
    if (e == seen) {
      std::unique_lock<std::mutex> lock(park_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while ((e = epoch_.load(std::memory_order_seq_cst)) == seen && !stopping_.load()) park_cv_.wait(lock);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    }
    seen = e;
    if (stopping_.load(std::memory_order_acquire)) return;
  }
}

}  // namespace pagoda
