// The KV pool sizing arithmetic (gpu_memory_utilization), without a GPU.

#include <cstdint>

#include <gtest/gtest.h>

#include "pagoda/backend/cuda/cuda_kv_pool.h"

namespace pagoda::cuda {
namespace {

constexpr size_t kGiB = 1ull << 30;

TEST(KvPoolSizing, LeavesOneMinusUtilizationOfTotalFree) {
  // 140 GiB GPU, 16 GiB weights + 2 GiB scratch already allocated, 0.9 utilization:
  // keep 14 GiB free, so 122 - 14 = 108 GiB of 2 MiB blocks (Llama-3-8B, block 16).
  EXPECT_EQ(kv_pool_blocks_that_fit(122 * kGiB, 140 * kGiB, 0.9, 2ull << 20), 108 * 512);
  EXPECT_EQ(kv_pool_blocks_that_fit(122 * kGiB, 140 * kGiB, 1.0, 2ull << 20), 122 * 512);
}

TEST(KvPoolSizing, NothingFitsWhenOthersAlreadyHoldTheShare) {
  EXPECT_EQ(kv_pool_blocks_that_fit(10 * kGiB, 140 * kGiB, 0.9, 2ull << 20), 0);
  EXPECT_EQ(kv_pool_blocks_that_fit(14 * kGiB, 140 * kGiB, 0.9, 2ull << 20), 0);
  EXPECT_EQ(kv_pool_blocks_that_fit(14 * kGiB + (2ull << 20), 140 * kGiB, 0.9, 2ull << 20), 1);
  EXPECT_EQ(kv_pool_blocks_that_fit(100 * kGiB, 140 * kGiB, 0.9, 0), 0);
}

TEST(KvPoolSizing, RoundsDownToWholeBlocks) {
  EXPECT_EQ(kv_pool_blocks_that_fit(1000, 1000, 1.0, 300), 3);
}

}  // namespace
}  // namespace pagoda::cuda
