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

EvictionCandidate candidate(BlockId block, uint64_t last_access, uint32_t branches) {
  EvictionCandidate c;
  c.block = block;
  c.last_access_ns = last_access;
  c.branch_count = branches;
  c.reuse_count = branches;
  return c;
}

TEST(ValueAwareEvictionPolicy, WithoutHistoryItIsLru) {
  auto policy = make_eviction_policy(EvictionPolicyKind::kValueAware);
  policy->reset(8);
  policy->add(candidate(0, 100, 10));
  policy->add(candidate(1, 50, 1));
  EXPECT_EQ(policy->pop_victim(), std::optional<BlockId>(1));
}

TEST(ValueAwareEvictionPolicy, KeepsASharedPrefixLongerThanLruThenLetsItAge) {
  auto policy = make_eviction_policy(EvictionPolicyKind::kValueAware);
  policy->reset(8);
  // Teach it a horizon: a victim that sat unused for 100 ns.
  policy->add(candidate(0, 0, 1));
  policy->add(candidate(1, 100, 1));
  ASSERT_EQ(policy->pop_victim(), std::optional<BlockId>(0));
  // A system prompt's last block, shared by 10 conversations, older than a
  // single conversation's block: ranked as if used 9 horizons later.
  policy->add(candidate(2, 150, 10));
  policy->add(candidate(3, 900, 1));
  EXPECT_EQ(policy->pop_victim(), std::optional<BlockId>(1));
  EXPECT_EQ(policy->pop_victim(), std::optional<BlockId>(3)) << "LRU would evict the shared prefix first";
  // Much later traffic outranks it: value delays eviction, it does not pin.
  policy->add(candidate(4, 5000, 1));
  EXPECT_EQ(policy->pop_victim(), std::optional<BlockId>(2));
  PAGODA_EXPECT_OK(policy->verify_integrity());
}

TEST(EvictionPolicy, RecomputeCostGrowsWithDepth) {
  EXPECT_LT(block_recompute_cost(0, 16), block_recompute_cost(10, 16));
  EXPECT_NEAR(block_recompute_cost(2048, 16), 32.0, 1e-9);  // 32K tokens of prefix: attention = linear
  EXPECT_DOUBLE_EQ(block_recompute_cost(0, 16), 16.0);
}

}  // namespace
}  // namespace pagoda::kv
