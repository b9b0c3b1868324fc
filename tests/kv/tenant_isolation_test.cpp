// What one tenant can learn about another through the KV manager's answers and
// counters (nothing), who holds which block, and which blocks must be zeroed
// when they pass from one tenant to another.

#include <gtest/gtest.h>

#include <algorithm>

#include "kv_test_util.h"
#include "pagoda/kv/clock.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

using testing::iota_tokens;
using testing::make_manager;
using testing::prefill;
using testing::table_of;

// Everything tenant "b" is told about a prompt it sends, after tenant "a"
// did (or did not) send the same prompt first.
struct WhatBSees {
  MissReason reason = MissReason::kHit;
  int32_t cached_tokens = 0;
  NamespaceKvUsage usage;
  std::array<int64_t, kNumMissReasons> global_miss_by_reason{};
};

WhatBSees run_b_after_a(bool a_sends_it_first) {
  ManualClock clock;
  auto kv = make_manager(32, 4, &clock);
  const auto secret = iota_tokens(17, 1000);
  prefill(*kv, 1, "a", a_sends_it_first ? secret : iota_tokens(17, 5000));
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  WhatBSees seen;
  const PrefixMatch m = prefill(*kv, 2, "b", secret);
  seen.reason = m.reason;
  seen.cached_tokens = m.cached_tokens;
  seen.usage = kv->namespace_usage("b");
  seen.global_miss_by_reason = kv->stats().miss_tokens_by_reason;
  PAGODA_EXPECT_OK(kv->verify_integrity());
  return seen;
}

TEST(TenantIsolation, MissReasonsAndCountersDoNotDependOnWhatAnotherTenantCached) {
  const WhatBSees after_a_sent_it = run_b_after_a(true);
  const WhatBSees after_a_sent_other = run_b_after_a(false);
  EXPECT_EQ(after_a_sent_it.reason, MissReason::kNeverSeen);
  EXPECT_EQ(after_a_sent_it.reason, after_a_sent_other.reason);
  EXPECT_EQ(after_a_sent_it.cached_tokens, 0);
  EXPECT_EQ(after_a_sent_it.usage.miss_tokens_by_reason, after_a_sent_other.usage.miss_tokens_by_reason);
  EXPECT_EQ(after_a_sent_it.usage.hit_tokens, after_a_sent_other.usage.hit_tokens);
  // Even the server-wide counters (admin-only /metrics) carry no trace of it.
  EXPECT_EQ(after_a_sent_it.global_miss_by_reason, after_a_sent_other.global_miss_by_reason);
}

TEST(TenantIsolation, EvictedKeyMemoryIsPerNamespace) {
  // With room for one remembered key, "a"'s removals must not push out the
  // key "b" remembers: otherwise b's kEvicted turning into kNeverSeen would
  // tell b how busy a is.
  ManualClock clock;
  KvCacheConfig config;
  config.num_blocks = 8;
  config.block_size = 4;
  config.evicted_key_memory = 1;
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  // Tenants are groups (as the server makes them), kept while empty: an
  // ungrouped namespace with nothing left is reclaimed with its memory.
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("a", 0));
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("b", 0));
  const auto b_prompt = iota_tokens(5, 10);
  prefill(*kv, 1, "b", b_prompt);
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->drop_namespace("b"), 1);
  for (int i = 0; i < 5; ++i) {
    prefill(*kv, 10 + i, "a", iota_tokens(5, 100 * (i + 1)));
    PAGODA_EXPECT_OK(kv->free_sequence(10 + i));
    EXPECT_EQ(kv->drop_namespace("a"), 1);
  }
  EXPECT_EQ(kv->match_prefix("b", b_prompt).reason, MissReason::kEvicted);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(TenantIsolation, NamespaceUsageReportsOnlyThatNamespace) {
  ManualClock clock;
  auto kv = make_manager(32, 4, &clock);
  prefill(*kv, 1, "a", iota_tokens(9));
  prefill(*kv, 2, "a", iota_tokens(9));  // hit: 8 tokens
  prefill(*kv, 3, "b", iota_tokens(13, 400));
  const NamespaceKvUsage a = kv->namespace_usage("a");
  const NamespaceKvUsage b = kv->namespace_usage("b");
  EXPECT_EQ(a.hit_tokens, 8);
  EXPECT_EQ(a.miss_tokens, 9 + 1);
  EXPECT_EQ(a.sequences_allocated, 2);
  EXPECT_EQ(a.blocks_cached, 2);
  // Sequence 1: 3 blocks (2 cached + tail); sequence 2 shares the 2 cached and has its own tail.
  EXPECT_EQ(a.blocks_held, 4);
  EXPECT_EQ(b.hit_tokens, 0);
  EXPECT_EQ(b.miss_tokens, 13);
  EXPECT_EQ(b.sequences_allocated, 1);
  EXPECT_EQ(b.blocks_held, 4);
  EXPECT_EQ(b.blocks_cached, 3);
  const NamespaceKvUsage never = kv->namespace_usage("c");
  EXPECT_EQ(never.blocks_held, 0);
  EXPECT_EQ(never.miss_tokens, 0);
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  EXPECT_EQ(kv->namespace_usage("a").blocks_held, 2) << "the cached blocks stay held while cached";
  EXPECT_EQ(kv->namespace_usage("a").blocks_evictable, 2);
  EXPECT_EQ(kv->drop_namespace("a"), 2);
  EXPECT_EQ(kv->namespace_usage("a").blocks_held, 0);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(TenantIsolation, ABlockPassingToAnotherNamespaceIsListedForZeroingOnce) {
  ManualClock clock;
  auto kv = make_manager(4, 4, &clock);
  EXPECT_TRUE(kv->take_blocks_to_zero().empty());
  prefill(*kv, 1, "a", iota_tokens(16));  // all four blocks: three cached, one tail
  const auto a_blocks = table_of(*kv, 1);
  EXPECT_TRUE(kv->take_blocks_to_zero().empty()) << "never-used blocks hold nobody's data";
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  // "a" again: gets its own blocks back (cached hit + its own freed tail), nothing to zero.
  prefill(*kv, 2, "a", iota_tokens(16));
  EXPECT_TRUE(kv->take_blocks_to_zero().empty());
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  // "b" takes every block: the free tail and three evicted blocks of "a".
  prefill(*kv, 3, "b", iota_tokens(16, 900));
  auto zeroed = kv->take_blocks_to_zero();
  std::sort(zeroed.begin(), zeroed.end());
  auto expected = a_blocks;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(zeroed, expected);
  EXPECT_TRUE(kv->take_blocks_to_zero().empty()) << "listed once";
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(TenantIsolation, ForkedBlocksOfTheSameNamespaceAreNotZeroedButOtherTenantsBlocksAre) {
  ManualClock clock;
  auto kv = make_manager(8, 4, &clock);
  prefill(*kv, 1, "a", iota_tokens(10));  // three blocks of a's
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->drop_namespace("a"), 2);
  // The free list is last-in first-out: a's three blocks are handed out next.
  prefill(*kv, 2, "b", iota_tokens(6, 50));
  EXPECT_EQ(kv->take_blocks_to_zero().size(), 2u);
  auto copies = kv->fork(2, 3);
  ASSERT_TRUE(copies.ok());
  ASSERT_EQ(copies->size(), 1u);
  EXPECT_EQ(kv->take_blocks_to_zero(), std::vector<BlockId>{(*copies)[0].dst})
      << "the fork's copy target was a's: zeroed (before the copy runs)";
  // b forks again: its new block comes from never-used ones, or b's own.
  PAGODA_EXPECT_OK(kv->free_sequence(3));
  ASSERT_TRUE(kv->fork(2, 4).ok());
  EXPECT_TRUE(kv->take_blocks_to_zero().empty()) << "b's own freed block goes back to b unzeroed";
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(TenantIsolation, ZeroingCanBeTurnedOff) {
  ManualClock clock;
  KvCacheConfig config;
  config.num_blocks = 2;
  config.block_size = 4;
  config.zero_blocks_between_namespaces = false;
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  prefill(*kv, 1, "a", iota_tokens(6));
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  prefill(*kv, 2, "b", iota_tokens(6, 50));
  EXPECT_TRUE(kv->take_blocks_to_zero().empty());
}

}  // namespace
}  // namespace pagoda::kv

namespace pagoda::kv {
namespace {

using testing::iota_tokens;
using testing::prefill;

// Tenant "b" caches `b_prompts` prompts of 2 full blocks; then tenant "a"
// churns through many different prompts. Returns how many of b's prompts
// still hit fully afterwards.
int b_prompts_surviving_a_churn(int32_t a_cap) {
  ManualClock clock;
  KvCacheConfig config;
  config.num_blocks = 24;
  config.block_size = 4;
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  if (a_cap > 0) PAGODA_EXPECT_OK(kv->set_namespace_block_limit("a", a_cap));
  SequenceId id = 1;
  for (int p = 0; p < 6; ++p) {  // 6 prompts x 2 cached blocks = 12 of b's blocks
    clock.advance(10);
    prefill(*kv, id, "b", iota_tokens(9, 100 * (p + 1)));
    PAGODA_EXPECT_OK(kv->free_sequence(id++));
  }
  for (int p = 0; p < 40; ++p) {  // a's churn: newer than all of b's blocks
    clock.advance(10);
    const auto prompt = iota_tokens(13, 5000 + 50 * p);
    if (!kv->can_allocate_sequence("a", prompt)) {
      ADD_FAILURE() << "a must always be able to run by recycling its own blocks";
      break;
    }
    prefill(*kv, id, "a", prompt);
    PAGODA_EXPECT_OK(kv->free_sequence(id++));
    EXPECT_TRUE(a_cap == 0 || kv->namespace_usage("a").blocks_held <= a_cap);
    PAGODA_EXPECT_OK(kv->verify_integrity());
  }
  int surviving = 0;
  for (int p = 0; p < 6; ++p) surviving += kv->match_prefix("b", iota_tokens(9, 100 * (p + 1))).cached_tokens == 8;
  return surviving;
}

TEST(TenantKvCap, ATenantAtItsCapRecyclesItsOwnCacheAndNeverEvictsOthers) {
  EXPECT_EQ(b_prompts_surviving_a_churn(/*a_cap=*/8), 6) << "a, capped, must leave b's whole cache alone";
  // The control: without a cap, a's churn pushes b's cache out.
  EXPECT_LT(b_prompts_surviving_a_churn(/*a_cap=*/0), 6);
}

TEST(TenantKvCap, RoomSaysFitsWaitOrNever) {
  ManualClock clock;
  auto kv = testing::make_manager(32, 4, &clock);
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("a", 4));
  EXPECT_EQ(kv->namespace_room("a", iota_tokens(16)), NamespaceRoom::kFits);
  EXPECT_EQ(kv->namespace_room("a", iota_tokens(17)), NamespaceRoom::kNeverFits) << "5 blocks over a cap of 4";
  EXPECT_EQ(kv->namespace_room("b", iota_tokens(100)), NamespaceRoom::kFits) << "no cap";
  prefill(*kv, 1, "a", iota_tokens(12, 500));  // 3 blocks in use
  EXPECT_EQ(kv->namespace_room("a", iota_tokens(8, 900)), NamespaceRoom::kWaitForOwnBlocks);
  EXPECT_FALSE(kv->can_allocate_sequence("a", iota_tokens(8, 900)));
  EXPECT_FALSE(kv->allocate_sequence(2, "a", iota_tokens(8, 900)).ok());
  EXPECT_TRUE(kv->can_allocate_sequence("b", iota_tokens(8, 900))) << "the cap is a's alone";
  // Appending past the cap fails for a; once its sequence ends its blocks are recyclable.
  PAGODA_EXPECT_OK(kv->append_tokens(1, std::vector<TokenId>{1, 2, 3, 4}));  // the 4th block
  EXPECT_FALSE(kv->append_tokens(1, std::vector<TokenId>{5}).ok());
  PAGODA_EXPECT_OK(kv->mark_computed(1, 0));
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->namespace_room("a", iota_tokens(8, 900)), NamespaceRoom::kFits);
  EXPECT_EQ(kv->namespace_usage("a").block_limit, 4);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

}  // namespace
}  // namespace pagoda::kv
