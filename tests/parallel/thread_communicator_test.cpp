// The CPU threads' communicator: every collective gives every rank the same
// bits, sums run in rank order, the group stays correct over many repetitions
// and sizes, and disagreements come back as the same error on every rank.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "pagoda/parallel/thread_communicator.h"

namespace pagoda::parallel {
namespace {

// Runs body(comm) on one thread per rank and waits for all.
void run_ranks(int32_t size, const std::function<void(Communicator&)>& body) {
  auto comms = make_thread_communicators(size);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  std::vector<std::thread> threads;
  for (auto& c : *comms) threads.emplace_back([&body, comm = c.get()] { body(*comm); });
  for (auto& t : threads) t.join();
}

float rank_value(int32_t rank, size_t i, uint32_t round) {
  // Magnitudes far apart, so a sum in another order gives other bits.
  const float scale = (rank % 2 == 0) ? 1e7f : 1e-3f;
  return scale * static_cast<float>(static_cast<int32_t>((i * 7919 + rank * 104729 + round * 13) % 2001) - 1000);
}

TEST(ThreadCommunicatorTest, RejectsAnEmptyGroup) {
  auto comms = make_thread_communicators(0);
  ASSERT_FALSE(comms.ok());
  EXPECT_NE(comms.status().message().find("at least 1 rank, got 0"), std::string::npos) << comms.status().to_string();
}

TEST(ThreadCommunicatorTest, AllReduceF32SumsInRankOrderOnEveryRankRepeatedly) {
  for (int32_t size : {1, 2, 3, 4}) {
    std::vector<std::vector<float>> results(static_cast<size_t>(size));
    std::atomic<int> failures{0};
    run_ranks(size, [&](Communicator& comm) {
      EXPECT_EQ(comm.size(), size);
      for (uint32_t round = 0; round < 300; ++round) {
        const size_t count = (round * 37) % 101;  // 0, fewer than the ranks, and more
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = rank_value(comm.rank(), i, round);
        if (!comm.all_reduce_sum(data.data(), count, DType::kF32).ok()) ++failures;
        for (size_t i = 0; i < count; ++i) {
          float expected = rank_value(0, i, round);
          for (int32_t r = 1; r < size; ++r) expected += rank_value(r, i, round);
          uint32_t got_bits, want_bits;
          std::memcpy(&got_bits, &data[i], 4);
          std::memcpy(&want_bits, &expected, 4);
          if (got_bits != want_bits) {
            ++failures;
            break;
          }
        }
      }
    });
    EXPECT_EQ(failures.load(), 0) << "size " << size;
  }
}

TEST(ThreadCommunicatorTest, AllReduceBf16AccumulatesInF32AndRoundsOnce) {
  const int32_t size = 4;
  std::vector<std::vector<uint16_t>> out(size);
  run_ranks(size, [&](Communicator& comm) {
    // 1 + 3 x 2^-9: each bf16 partial sum would round the small terms away.
    std::vector<uint16_t> data = {f32_to_bf16(comm.rank() == 0 ? 1.0f : 1.0f / 512.0f), f32_to_bf16(comm.rank() + 1.0f)};
    EXPECT_TRUE(comm.all_reduce_sum(data.data(), data.size(), DType::kBF16).ok());
    out[static_cast<size_t>(comm.rank())] = data;
  });
  for (int32_t r = 0; r < size; ++r) {
    EXPECT_EQ(out[static_cast<size_t>(r)][0], f32_to_bf16(1.0f + 3.0f / 512.0f)) << r;
    EXPECT_EQ(bf16_to_f32(out[static_cast<size_t>(r)][1]), 10.0f) << r;
  }
  EXPECT_NE(f32_to_bf16(1.0f + 3.0f / 512.0f), f32_to_bf16(1.0f));  // the test can tell the two apart
}

TEST(ThreadCommunicatorTest, AllGatherPlacesRanksInOrder) {
  for (int32_t size : {1, 2, 4}) {
    std::atomic<int> failures{0};
    run_ranks(size, [&](Communicator& comm) {
      for (uint32_t round = 0; round < 100; ++round) {
        const size_t count = 1 + round % 9;
        std::vector<float> send(count), recv(count * static_cast<size_t>(size), -1.0f);
        for (size_t i = 0; i < count; ++i) send[i] = rank_value(comm.rank(), i, round);
        if (!comm.all_gather(send.data(), recv.data(), count, DType::kF32).ok()) ++failures;
        for (int32_t r = 0; r < size; ++r)
          for (size_t i = 0; i < count; ++i)
            if (recv[static_cast<size_t>(r) * count + i] != rank_value(r, i, round)) ++failures;
      }
      // Whole bytes of any dtype move unchanged.
      std::vector<uint8_t> bytes = {static_cast<uint8_t>(comm.rank()), 0xAB}, all(2 * static_cast<size_t>(size));
      if (!comm.all_gather(bytes.data(), all.data(), 2, DType::kInt8).ok()) ++failures;
      for (int32_t r = 0; r < size; ++r)
        if (all[2 * static_cast<size_t>(r)] != r || all[2 * static_cast<size_t>(r) + 1] != 0xAB) ++failures;
    });
    EXPECT_EQ(failures.load(), 0) << "size " << size;
  }
}

TEST(ThreadCommunicatorTest, BroadcastFromEveryRoot) {
  const int32_t size = 3;
  std::atomic<int> failures{0};
  run_ranks(size, [&](Communicator& comm) {
    for (int32_t root = 0; root < size; ++root) {
      std::vector<float> data(5, static_cast<float>(comm.rank() * 10));
      if (!comm.broadcast(data.data(), data.size(), DType::kF32, root).ok()) ++failures;
      for (float v : data)
        if (v != static_cast<float>(root * 10)) ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadCommunicatorTest, BarrierHoldsEveryRankUntilAllArrive) {
  const int32_t size = 4;
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  run_ranks(size, [&](Communicator& comm) {
    for (int round = 1; round <= 50; ++round) {
      if (comm.rank() == round % size) std::this_thread::sleep_for(std::chrono::microseconds(200));
      arrived.fetch_add(1);
      EXPECT_TRUE(comm.barrier().ok());
      if (arrived.load() < round * size) ++early;
      EXPECT_TRUE(comm.barrier().ok());  // nobody starts the next round before all have checked
    }
  });
  EXPECT_EQ(early.load(), 0);
}

TEST(ThreadCommunicatorTest, DisagreementIsTheSameErrorOnEveryRankAndTheGroupGoesOn) {
  const int32_t size = 3;
  std::vector<std::string> errors(size);
  std::atomic<int> failures{0};
  run_ranks(size, [&](Communicator& comm) {
    std::vector<float> data(8, 1.0f);
    const size_t count = comm.rank() == 2 ? 7 : 8;
    Status s = comm.all_reduce_sum(data.data(), count, DType::kF32);
    errors[static_cast<size_t>(comm.rank())] = s.ok() ? "" : s.message();
    for (float v : data)
      if (v != 1.0f) ++failures;  // nothing was reduced
    if (comm.all_reduce_sum(data.data(), 8, DType::kInt4).ok()) ++failures;
    if (comm.broadcast(data.data(), 8, DType::kF32, size).ok()) ++failures;
    // The next collective works.
    if (!comm.all_reduce_sum(data.data(), 8, DType::kF32).ok()) ++failures;
    for (float v : data)
      if (v != static_cast<float>(size)) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  for (int32_t r = 0; r < size; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], errors[0]);
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 2 gave 7"), std::string::npos) << errors[static_cast<size_t>(r)];
  }
}

}  // namespace
}  // namespace pagoda::parallel
