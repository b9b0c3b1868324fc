#include "pagoda/core/thread_pool.h"

#include <atomic>
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

}  // namespace
}  // namespace pagoda
