#include "pagoda/core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pagoda {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (size_t n : {1u, 3u, 4u, 17u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  pool.parallel_for(6, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](size_t b2, size_t e2) { total += static_cast<int>(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 60);
}

TEST(ThreadPoolTest, ManyRoundsDoNotDeadlock) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int round = 0; round < 2000; ++round)
    pool.parallel_for(8, [&](size_t b, size_t e) { sum += static_cast<long>(e - b); });
  EXPECT_EQ(sum.load(), 16000);
}

TEST(ThreadPoolTest, FinerChunksCoverEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (size_t n : {2u, 7u, 12u, 13u, 1001u}) {
    for (size_t per_thread : {1u, 4u, 64u}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> calls{0};
      pool.parallel_for(n, [&](size_t b, size_t e) {
        ++calls;
        EXPECT_LT(b, e);
        for (size_t i = b; i < e; ++i) hits[i]++;
      }, 1, per_thread);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
      EXPECT_EQ(static_cast<size_t>(calls.load()), std::min(n, 3 * per_thread)) << "n=" << n;
    }
  }
}

// Workers park after their spin; a task published then must still reach them (and the
// caller must finish it alone if they are slow). Rounds alternate with pauses longer than
// the default spin of 1 ms.
TEST(ThreadPoolTest, ParkedWorkersWakeForTheNextTask) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(round % 2 == 0 ? 3 : 0));
    pool.parallel_for(64, [&](size_t b, size_t e) { sum += static_cast<long>(e - b); }, 1, 8);
  }
  EXPECT_EQ(sum.load(), 20 * 64);
}

// Each chunk sleeps, so while the caller sleeps in its chunk a worker claims the other:
// the pool hands chunks to workers, not only to the caller.
TEST(ThreadPoolTest, WorkersTakeChunksToo) {
  ThreadPool pool(2);
  std::atomic<int> seen_other_thread{0};
  const auto caller = std::this_thread::get_id();
  for (int round = 0; round < 50 && seen_other_thread.load() == 0; ++round) {
    pool.parallel_for(2, [&](size_t, size_t) {
      if (std::this_thread::get_id() != caller) seen_other_thread = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
  }
  EXPECT_EQ(seen_other_thread.load(), 1);
}

// Back-to-back tasks whose chunk counts alternate (few, then many) with more threads than
// cores, so workers are often preempted half way through a claim: a worker holding the last
// task's ticket must never claim a chunk of the next task, whose fields the caller is
// rewriting (that ran a chunk twice and left the caller waiting forever on a count past the
// total). Every index runs exactly once per task, and nothing runs after the call returns.
TEST(ThreadPoolTest, BackToBackTasksOfChangingSizeRunEachChunkOnce) {
  // The old race left the caller spinning forever: a watchdog turns that into a failure.
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !finished.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!finished.load()) {
      std::fprintf(stderr, "parallel_for never returned: a chunk was counted twice\n");
      std::_Exit(1);
    }
  });
  ThreadPool pool(6);
  constexpr size_t kMaxN = 48;
  std::vector<std::atomic<int>> hits(kMaxN);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  long rounds = 0, bad = 0;
  while (std::chrono::steady_clock::now() < deadline && bad == 0) {
    for (int k = 0; k < 1000; ++k, ++rounds) {
      const size_t n = rounds % 2 == 0 ? 2 : kMaxN;
      for (size_t i = 0; i < n; ++i) hits[i].store(0, std::memory_order_relaxed);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
      }, 1, 8);
      for (size_t i = 0; i < n; ++i) bad += hits[i].load() != 1;
    }
  }
  finished = true;
  watchdog.join();
  EXPECT_EQ(bad, 0) << "after " << rounds << " tasks";
}

}  // namespace
}  // namespace pagoda
