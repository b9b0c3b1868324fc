// KvCacheManager::compact_sequence (token eviction): fresh blocks before the
// old ones are released (no block in both tables), cached prompt blocks stay
// cached and reusable, a compressed sequence never offers a block to the
// prefix cache, reserved tokens keep slots after the kept ones, nothing
// changes on error, and no block leaks.

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

using testing::iota_tokens;
using testing::make_manager;
using testing::prefill;
using testing::table_of;

class KvCompactionTest : public ::testing::Test {
 protected:
  ManualClock clock_;
  std::unique_ptr<KvCacheManager> kv_ = make_manager(/*num_blocks=*/16, /*block_size=*/4, &clock_);
  void check() { PAGODA_EXPECT_OK(kv_->verify_integrity()); }
};

TEST_F(KvCompactionTest, FreshBlocksReplaceTheTableAndShareNoBlockWithTheOldOne) {
  prefill(*kv_, 1, "t", iota_tokens(18));  // 5 blocks, 4 full ones cached
  const std::vector<BlockId> before = table_of(*kv_, 1);
  auto c = kv_->compact_sequence(1, 6);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->old_blocks, before);
  ASSERT_EQ(c->new_blocks.size(), 2u);
  for (BlockId b : c->new_blocks) EXPECT_EQ(std::count(before.begin(), before.end(), b), 0) << b;
  EXPECT_EQ(table_of(*kv_, 1), c->new_blocks);
  EXPECT_EQ(kv_->num_tokens(1), 6);
  EXPECT_EQ(kv_->num_computed_tokens(1), 6);
  EXPECT_TRUE(kv_->is_compressed(1));
  check();
  // The prompt's full blocks stay cached with their K/V (untouched): a new
  // sequence with the same prompt reuses them.
  const PrefixMatch m = kv_->match_prefix("t", iota_tokens(18));
  EXPECT_EQ(m.cached_tokens, 16);
  EXPECT_EQ(kv_->stats().blocks_cached, 4);
}

TEST_F(KvCompactionTest, ACompressedSequenceNeverEntersThePrefixCache) {
  prefill(*kv_, 1, "t", iota_tokens(10));
  ASSERT_TRUE(kv_->compact_sequence(1, 5).ok());
  const int64_t cached = kv_->stats().blocks_cached;
  // Decode 11 more tokens: its blocks fill up but are never offered.
  for (int i = 0; i < 11; ++i) {
    ASSERT_TRUE(kv_->append_tokens(1, std::vector<TokenId>{100 + i}).ok());
    ASSERT_TRUE(kv_->mark_computed(1, 1).ok());
    check();
  }
  EXPECT_EQ(kv_->stats().blocks_cached, cached);
  ASSERT_TRUE(kv_->free_sequence(1).ok());
  EXPECT_EQ(kv_->stats().blocks_cached, cached) << "freeing offered its blocks";
  // No block leaks: all are free or cached (evictable).
  EXPECT_EQ(kv_->num_available_blocks(), 16);
  check();
}

TEST_F(KvCompactionTest, ReservedTokensKeepSlotsAfterTheKeptOnes) {
  ASSERT_TRUE(kv_->allocate_sequence(1, "t", iota_tokens(20)).ok());
  ASSERT_TRUE(kv_->mark_computed(1, 12).ok());  // 8 reserved, not yet computed
  const std::vector<BlockId> before = table_of(*kv_, 1);
  const int32_t free_before = kv_->num_free_blocks();
  auto c = kv_->compact_sequence(1, 5);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(kv_->num_tokens(1), 13);
  EXPECT_EQ(kv_->num_computed_tokens(1), 5);
  ASSERT_EQ(c->new_blocks.size(), 4u);
  // The kept slots are in fresh blocks; the reserved tail moved over in the two old empty blocks.
  for (int j = 0; j < 2; ++j) EXPECT_EQ(std::count(before.begin(), before.end(), c->new_blocks[j]), 0);
  EXPECT_EQ(c->new_blocks[2], before[3]);
  EXPECT_EQ(c->new_blocks[3], before[4]);
  EXPECT_EQ(kv_->num_free_blocks(), free_before - 2) << "two fresh blocks, three old written ones cached";
  check();
  ASSERT_TRUE(kv_->mark_computed(1, 8).ok());
  check();
  EXPECT_EQ(kv_->mark_computed(1, 1).code(), StatusCode::kOutOfRange);
}

TEST_F(KvCompactionTest, BadCallsChangeNothing) {
  prefill(*kv_, 1, "t", iota_tokens(10));
  const std::vector<BlockId> before = table_of(*kv_, 1);
  EXPECT_EQ(kv_->compact_sequence(9, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(kv_->compact_sequence(1, 11).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->compact_sequence(1, -1).status().code(), StatusCode::kInvalidArgument);
  // Fill the pool: no room for the fresh blocks.
  prefill(*kv_, 2, "u", iota_tokens(52, 500));
  EXPECT_EQ(kv_->num_available_blocks(), 0);
  EXPECT_EQ(kv_->compact_sequence(1, 5).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(table_of(*kv_, 1), before);
  EXPECT_FALSE(kv_->is_compressed(1));
  check();
}

TEST_F(KvCompactionTest, AbortAfterCompactionFreesEverything) {
  prefill(*kv_, 1, "t", iota_tokens(30));
  ASSERT_TRUE(kv_->compact_sequence(1, 9).ok());
  ASSERT_TRUE(kv_->append_tokens(1, std::vector<TokenId>{7, 8}).ok());
  ASSERT_TRUE(kv_->abort_sequence(1).ok());
  EXPECT_EQ(kv_->num_available_blocks(), 16);
  EXPECT_EQ(kv_->stats().blocks_in_use, 0);
  check();
}

}  // namespace
}  // namespace pagoda::kv
