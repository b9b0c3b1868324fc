#include "pagoda/core/thread_pool.h"

#include <atomic>
#include <chrono>
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

}  // namespace
}  // namespace pagoda
