#include "pagoda/kv/eviction_policy.h"

#include <gtest/gtest.h>

#include "kv_test_util.h"

namespace pagoda::kv {
namespace {

TEST(LruEvictionPolicy, EvictsOldestAccessFirstAndHonoursRemove) {
  auto lru = make_eviction_policy(EvictionPolicyKind::kLru);
  lru->reset(8);
  lru->add({3, 300, 0, 0, 16});
  lru->add({1, 100, 9, 5, 16});
  lru->add({2, 200, 0, 0, 16});
  lru->remove(1);
  PAGODA_EXPECT_OK(lru->verify_integrity());
  EXPECT_EQ(lru->pop_victim(), std::optional<BlockId>(2));
  EXPECT_EQ(lru->pop_victim(), std::optional<BlockId>(3));
  EXPECT_EQ(lru->pop_victim(), std::nullopt);
}

TEST(ValueAwareEvictionPolicy, KeepsOftenReusedBlocksOverOlderAccess) {
  auto policy = make_eviction_policy(EvictionPolicyKind::kValueAware);
  policy->reset(8);
  policy->add({0, 100, /*reuse=*/10, 0, 16});  // old but reused often: a shared system prompt
  policy->add({1, 900, /*reuse=*/0, 0, 16});   // recent, never reused
  EXPECT_EQ(policy->pop_victim(), std::optional<BlockId>(1));
}

TEST(ValueAwareEvictionPolicy, AgingLetsStaleValuableBlocksGo) {
  auto policy = make_eviction_policy(EvictionPolicyKind::kValueAware);
  policy->reset(64);
  policy->add({0, 1, /*reuse=*/3, 0, 16});  // priority 4 x 16 = 64
  // A stream of never-reused blocks: each eviction raises the inflation, so
  // later arrivals eventually outrank block 0.
  BlockId next = 1;
  bool evicted_zero = false;
  for (int round = 0; round < 10 && !evicted_zero; ++round) {
    policy->add({next, static_cast<uint64_t>(10 + round), 0, 0, 16});
    ++next;
    evicted_zero = policy->pop_victim() == std::optional<BlockId>(0);
    PAGODA_EXPECT_OK(policy->verify_integrity());
  }
  EXPECT_TRUE(evicted_zero);
}

TEST(EvictionPolicy, RecomputeCostGrowsWithDepth) {
  EXPECT_LT(block_recompute_cost(0, 16), block_recompute_cost(10, 16));
  EXPECT_DOUBLE_EQ(block_recompute_cost(0, 16), 16.0);
}

}  // namespace
}  // namespace pagoda::kv
