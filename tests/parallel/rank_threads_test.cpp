// parallel::RankThreads: every rank's job runs at once (a barrier inside the
// jobs would deadlock otherwise), rank 0 on the calling thread, the other
// ranks on the same thread of their own every round, and the first error by
// rank order comes back while the threads stay usable.

#include <atomic>
#include <barrier>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/parallel/rank_threads.h"

namespace pagoda::parallel {
namespace {

TEST(RankThreadsTest, JobsRunConcurrentlyOnStableThreads) {
  for (int32_t n = 1; n <= 4; ++n) {
    RankThreads threads(n);
    EXPECT_EQ(threads.size(), n);
    std::barrier<> meet(n);
    std::vector<std::thread::id> first(static_cast<size_t>(n));
    std::vector<int> runs(static_cast<size_t>(n), 0);
    for (int round = 0; round < 200; ++round) {
      const Status s = threads.run([&](int32_t r) {
        meet.arrive_and_wait();  // every rank is inside its job at the same time
        const size_t i = static_cast<size_t>(r);
        if (round == 0) first[i] = std::this_thread::get_id();
        EXPECT_EQ(first[i], std::this_thread::get_id()) << "rank " << r << " round " << round;
        ++runs[i];
        return ok_status();
      });
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    EXPECT_EQ(first[0], std::this_thread::get_id());  // rank 0 is the caller
    for (int32_t r = 1; r < n; ++r) EXPECT_NE(first[static_cast<size_t>(r)], first[0]);
    for (int count : runs) EXPECT_EQ(count, 200);
  }
}

TEST(RankThreadsTest, FirstErrorByRankOrderAndTheThreadsGoOn) {
  RankThreads threads(4);
  const Status s = threads.run([](int32_t r) -> Status {
    if (r == 3) return internal_error("rank 3 failed");
    if (r == 2) return invalid_argument_error("rank 2 failed");
    return ok_status();
  });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("rank 2 failed"), std::string::npos) << s.to_string();
  std::atomic<int> ran{0};
  EXPECT_TRUE(threads.run([&](int32_t) {
                ++ran;
                return ok_status();
              }).ok());
  EXPECT_EQ(ran.load(), 4);
}

}  // namespace
}  // namespace pagoda::parallel
