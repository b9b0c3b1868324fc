#include "pagoda/kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "pagoda/kv/block_hashes.h"
#include "pagoda/kv/prefix_cache.h"

namespace pagoda::kv {
namespace {

using testing::concat;
using testing::iota_tokens;
using testing::make_manager;
using testing::prefill;
using testing::table_of;

class KvCacheManagerTest : public ::testing::Test {
 protected:
  ManualClock clock_;
  std::unique_ptr<KvCacheManager> kv_ = make_manager(/*num_blocks=*/16, /*block_size=*/4, &clock_);
  void check() { PAGODA_EXPECT_OK(kv_->verify_integrity()); }
};

TEST(KvCacheManagerConfig, RejectsBadSizesWithClearErrors) {
  KvCacheConfig config;
  config.num_blocks = 0;
  auto none = KvCacheManager::create(config);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("num_blocks"), std::string::npos);
  config.num_blocks = 4;
  config.block_size = 257;
  auto big = KvCacheManager::create(config);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("257"), std::string::npos);
  config.block_size = 0;
  EXPECT_FALSE(KvCacheManager::create(config).ok());
}

TEST_F(KvCacheManagerTest, AllocateReservesTheWholePrompt) {
  auto match = kv_->allocate_sequence(1, "t", iota_tokens(10));
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->cached_tokens, 0);
  EXPECT_EQ(match->reason, MissReason::kNeverSeen);
  EXPECT_EQ(table_of(*kv_, 1).size(), 3u);
  EXPECT_EQ(kv_->num_tokens(1), 10);
  EXPECT_EQ(kv_->num_computed_tokens(1), 0);
  EXPECT_EQ(kv_->num_free_blocks(), 13);
  check();
  EXPECT_FALSE(kv_->allocate_sequence(1, "t", iota_tokens(3)).ok()) << "duplicate id accepted";
  EXPECT_FALSE(kv_->allocate_sequence(2, "t", {}).ok()) << "empty prompt accepted";
  EXPECT_FALSE(kv_->block_table(99).ok());
}

TEST_F(KvCacheManagerTest, BadCallsGetClearErrorsAndChangeNothing) {
  prefill(*kv_, 1, "t", iota_tokens(5));
  const KvStats before = kv_->stats();
  EXPECT_EQ(kv_->append_tokens(42, std::vector<TokenId>{1}).code(), StatusCode::kNotFound);
  EXPECT_EQ(kv_->mark_computed(42, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(kv_->mark_computed(1, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->free_sequence(42).code(), StatusCode::kNotFound);
  EXPECT_EQ(kv_->fork(1, 1).status().code(), StatusCode::kInvalidArgument);
  const Status unknown = kv_->append_tokens(42, std::vector<TokenId>{1});
  EXPECT_NE(unknown.message().find("42"), std::string::npos) << "the error names the sequence";
  EXPECT_EQ(kv_->blocks_needed_to_append(1, -3), -1);
  EXPECT_EQ(kv_->num_tokens(42), -1);
  EXPECT_EQ(kv_->drop_conversation("t", iota_tokens(5), -4), 0);
  EXPECT_EQ(kv_->drop_namespace("never-seen"), 0);
  EXPECT_EQ(kv_->evict(-2), 0);
  EXPECT_TRUE(kv_->can_allocate(0));
  EXPECT_FALSE(kv_->can_allocate_sequence("t", {}));
  const KvStats after = kv_->stats();
  EXPECT_EQ(after.blocks_in_use, before.blocks_in_use);
  EXPECT_EQ(after.blocks_cached, before.blocks_cached);
  EXPECT_EQ(after.blocks_free, before.blocks_free);
  check();
}

TEST_F(KvCacheManagerTest, SecondPromptReusesTheCachedPrefixBlocks) {
  const auto system = iota_tokens(8, 100);
  prefill(*kv_, 1, "t", concat(system, {1, 2, 3}));
  const auto first_table = table_of(*kv_, 1);
  const PrefixMatch match = prefill(*kv_, 2, "t", concat(system, {7, 8}));
  EXPECT_EQ(match.cached_tokens, 8);
  EXPECT_EQ(match.reason, MissReason::kHit);
  const auto second_table = table_of(*kv_, 2);
  EXPECT_EQ(second_table[0], first_table[0]);
  EXPECT_EQ(second_table[1], first_table[1]);
  EXPECT_NE(second_table[2], first_table[2]);
  const KvStats s = kv_->stats();
  EXPECT_EQ(s.hit_tokens, 8);
  EXPECT_EQ(s.blocks_reused, 2);
}

TEST_F(KvCacheManagerTest, ASequenceThatSkipsThePrefixCacheNeitherReadsItNorHoldsItTwice) {
  const auto prompt = iota_tokens(13, 100);  // 3 full blocks of 4 and a partial one
  prefill(*kv_, 1, "t", prompt);
  ASSERT_TRUE(kv_->free_sequence(1).ok());
  ASSERT_EQ(kv_->num_available_blocks(), 16) << "the first prompt's blocks are cached, evictable";
  auto skipped = kv_->allocate_sequence(2, "t", prompt, {}, PrefixReuse::kSkip);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(skipped->cached_tokens, 0);
  EXPECT_EQ(skipped->reason, MissReason::kNotRead);
  EXPECT_EQ(kv_->stats().miss_tokens_by_reason[static_cast<int>(MissReason::kNotRead)], 12);
  ASSERT_TRUE(kv_->mark_computed(2, 13).ok());
  // Its first block duplicates a cached one: its offers end there, with no alias on the cached
  // blocks, which stay evictable (12 available: 16 less its own 4).
  EXPECT_EQ(kv_->num_available_blocks(), 12);
  EXPECT_TRUE(kv_->verify_integrity().ok()) << kv_->verify_integrity().to_string();
  ASSERT_TRUE(kv_->free_sequence(2).ok());
  EXPECT_EQ(kv_->num_available_blocks(), 16);
  // A prompt the cache has not seen enters it as it is written, kSkip or not.
  const auto fresh = iota_tokens(9, 500);
  ASSERT_TRUE(kv_->allocate_sequence(3, "t", fresh, {}, PrefixReuse::kSkip).ok());
  ASSERT_TRUE(kv_->mark_computed(3, 9).ok());
  ASSERT_TRUE(kv_->free_sequence(3).ok());
  EXPECT_EQ(prefill(*kv_, 4, "t", fresh).cached_tokens, 8);
}

TEST_F(KvCacheManagerTest, TokensAreComparedNotOnlyPositions) {
  prefill(*kv_, 1, "t", iota_tokens(9));
  auto other = iota_tokens(9);
  other[5] = 999;  // second block differs
  const PrefixMatch match = kv_->match_prefix("t", other);
  EXPECT_EQ(match.cached_tokens, 4);
  EXPECT_EQ(match.reason, MissReason::kNeverSeen);
}

TEST_F(KvCacheManagerTest, NoMatchCrossesNamespaces) {
  prefill(*kv_, 1, "org_a", iota_tokens(9));
  const PrefixMatch match = kv_->match_prefix("org_b", iota_tokens(9));
  EXPECT_EQ(match.cached_tokens, 0);
  EXPECT_EQ(match.reason, MissReason::kNeverSeen) << "another namespace's blocks must not show in the reason";
  EXPECT_EQ(kv_->match_prefix("org_a", iota_tokens(9)).cached_tokens, 8);
}

TEST_F(KvCacheManagerTest, NamespaceKeysAreLengthPrefixed) {
  // ("org_1", "2345...") must not meet ("org_12345", "..."): seeds differ and
  // namespaces are compared whole.
  EXPECT_NE(namespace_seed("org_1"), namespace_seed("org_12345"));
  EXPECT_NE(namespace_seed(""), namespace_seed(std::string_view("\0", 1)));
  const std::vector<TokenId> prompt = {'2', '3', '4', '5', 'x', 'y', 'z', 'w', '!'};
  prefill(*kv_, 1, "org_1", prompt);
  EXPECT_EQ(kv_->match_prefix("org_12345", prompt).cached_tokens, 0);
  EXPECT_EQ(kv_->match_prefix("org_1", prompt).cached_tokens, 8);
  EXPECT_EQ(kv_->match_prefix("org_", prompt).cached_tokens, 0);
}

TEST_F(KvCacheManagerTest, AppendTakesABlockOnlyAtABoundaryAndNothingWhenExhausted) {
  prefill(*kv_, 1, "t", iota_tokens(4));
  EXPECT_EQ(kv_->blocks_needed_to_append(1, 1), 1);
  PAGODA_EXPECT_OK(kv_->append_tokens(1, std::vector<TokenId>{5}));
  EXPECT_EQ(kv_->blocks_needed_to_append(1, 3), 0);
  EXPECT_EQ(kv_->blocks_needed_to_append(77, 1), -1);
  // Fill the rest of the pool with a second sequence.
  ASSERT_TRUE(kv_->allocate_sequence(2, "t", iota_tokens(14 * 4, 500)).ok());
  EXPECT_EQ(kv_->num_available_blocks(), 0);
  PAGODA_EXPECT_OK(kv_->append_tokens(1, std::vector<TokenId>{6, 7, 8}));  // fits the open block
  const Status full = kv_->append_tokens(1, std::vector<TokenId>{9});
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv_->num_tokens(1), 8) << "a failed append must reserve nothing";
  EXPECT_EQ(kv_->stats().allocation_failures, 1);
  check();
}

TEST_F(KvCacheManagerTest, CanAllocateCountsEvictableCachedBlocks) {
  prefill(*kv_, 1, "t", iota_tokens(64));  // all 16 blocks
  EXPECT_FALSE(kv_->can_allocate(1));
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  EXPECT_EQ(kv_->num_free_blocks(), 0);     // all cached
  EXPECT_EQ(kv_->num_available_blocks(), 16);
  EXPECT_TRUE(kv_->can_allocate(64));
  EXPECT_FALSE(kv_->can_allocate(65));
  EXPECT_TRUE(kv_->can_allocate_sequence("t", iota_tokens(64)));
  ASSERT_TRUE(kv_->allocate_sequence(2, "u", iota_tokens(64, 9000)).ok());  // evicts everything
  EXPECT_EQ(kv_->stats().removed_blocks_by_reason[static_cast<int>(RemovalReason::kEvictedForSpace)], 16);
  check();
}

TEST_F(KvCacheManagerTest, DryRunReleaseCountsSharedBlocksOnlyWhenAllHoldersGo) {
  prefill(*kv_, 1, "t", iota_tokens(9));  // 3 blocks, 2 full
  auto copies = kv_->fork(1, 2);           // shares 2, copies the partial one
  ASSERT_TRUE(copies.ok());
  const int32_t now = kv_->num_available_blocks();
  const std::vector<SequenceId> one{1};
  const std::vector<SequenceId> both{1, 2, 2, 404};
  EXPECT_EQ(kv_->available_blocks_after_release(one), now + 1);
  EXPECT_EQ(kv_->available_blocks_after_release(both), now + 4);
  EXPECT_EQ(kv_->num_available_blocks(), now) << "dry run changed state";
  check();
}

TEST_F(KvCacheManagerTest, ForkSharesFullBlocksAndCopiesThePartialOne) {
  prefill(*kv_, 1, "t", iota_tokens(6));  // block 0 full, block 1 holds 2 tokens
  auto copies = kv_->fork(1, 2);
  ASSERT_TRUE(copies.ok());
  const auto parent = table_of(*kv_, 1);
  const auto child = table_of(*kv_, 2);
  EXPECT_EQ(child[0], parent[0]);
  EXPECT_NE(child[1], parent[1]);
  ASSERT_EQ(copies->size(), 1u);
  EXPECT_EQ((*copies)[0], (BlockCopy{parent[1], child[1]}));
  // Both decode different tokens into their own last blocks.
  PAGODA_EXPECT_OK(kv_->append_tokens(1, std::vector<TokenId>{50}));
  PAGODA_EXPECT_OK(kv_->append_tokens(2, std::vector<TokenId>{60}));
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 1));
  PAGODA_EXPECT_OK(kv_->mark_computed(2, 1));
  check();
  EXPECT_FALSE(kv_->fork(1, 2).ok()) << "existing child accepted";
  EXPECT_EQ(kv_->fork(404, 5).status().code(), StatusCode::kNotFound);
}

TEST_F(KvCacheManagerTest, ForkOfBlockAlignedSequenceNeedsNoCopy) {
  prefill(*kv_, 1, "t", iota_tokens(8));
  auto copies = kv_->fork(1, 2);
  ASSERT_TRUE(copies.ok());
  EXPECT_TRUE(copies->empty());
  EXPECT_EQ(table_of(*kv_, 1), table_of(*kv_, 2));
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  check();
}

TEST_F(KvCacheManagerTest, ForkMidPrefillGivesUnwrittenBlocksFreshIdsWithoutCopies) {
  ASSERT_TRUE(kv_->allocate_sequence(1, "t", iota_tokens(14)).ok());  // 4 blocks
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 5));                          // block 0 full, block 1 has 1 token
  auto copies = kv_->fork(1, 2);
  ASSERT_TRUE(copies.ok());
  const auto parent = table_of(*kv_, 1);
  const auto child = table_of(*kv_, 2);
  EXPECT_EQ(child[0], parent[0]);
  for (size_t j = 1; j < 4; ++j) EXPECT_NE(child[j], parent[j]) << j;
  ASSERT_EQ(copies->size(), 1u) << "only the block holding written K/V is copied";
  EXPECT_EQ((*copies)[0], (BlockCopy{parent[1], child[1]}));
  EXPECT_EQ(kv_->num_computed_tokens(2), 5);
  PAGODA_EXPECT_OK(kv_->mark_computed(2, 9));
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 9));  // same tokens: the child's blocks were cached first
  check();
  EXPECT_EQ(table_of(*kv_, 1), parent) << "tables are append-only: dedup never swaps a block";
  EXPECT_EQ(table_of(*kv_, 2), child);
  EXPECT_EQ(kv_->stats().blocks_deduplicated, 2);
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  check();
  const PrefixMatch m = prefill(*kv_, 3, "t", iota_tokens(14));
  EXPECT_EQ(m.cached_tokens, 12);
  EXPECT_EQ(m.blocks[1], child[1]) << "the child's blocks are the cached ones";
}

TEST_F(KvCacheManagerTest, DroppingARunningConversationStopsItsCaching) {
  const auto prompt = iota_tokens(9);
  prefill(*kv_, 1, "t", prompt);
  EXPECT_EQ(kv_->drop_conversation("t", prompt), 2);
  check();
  // The sequence keeps its blocks and keeps decoding, but nothing more of it
  // is cached: its chain was dropped.
  PAGODA_EXPECT_OK(kv_->append_tokens(1, std::vector<TokenId>{10, 11, 12}));
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 3));
  check();
  EXPECT_EQ(kv_->stats().blocks_cached, 0);
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  EXPECT_EQ(kv_->num_free_blocks(), 16);
  check();
}

TEST_F(KvCacheManagerTest, LruEvictsTheLeastRecentlyUsedConversationFirst) {
  // 16 blocks: conversation A (t=1), B (t=2), then a fresh prompt needing room.
  prefill(*kv_, 1, "t", iota_tokens(25, 100));  // 7 blocks, 6 cached
  clock_.advance(10);
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  clock_.advance(10);
  prefill(*kv_, 2, "t", iota_tokens(25, 200));
  clock_.advance(10);
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  EXPECT_EQ(kv_->num_free_blocks(), 4);
  prefill(*kv_, 3, "t", iota_tokens(24, 300));  // needs 6 blocks: 4 free + 2 evicted
  EXPECT_EQ(kv_->match_prefix("t", iota_tokens(25, 100)).cached_tokens, 16) << "A is older: its leaves go first";
  EXPECT_EQ(kv_->match_prefix("t", iota_tokens(25, 200)).cached_tokens, 24) << "B is newer and should survive";
  const PrefixMatch a = kv_->match_prefix("t", iota_tokens(25, 100));
  EXPECT_EQ(a.reason, MissReason::kEvicted);
}

TEST_F(KvCacheManagerTest, DropNamespaceRemovesOnlyThatTenant) {
  prefill(*kv_, 1, "a", iota_tokens(9));
  prefill(*kv_, 2, "b", iota_tokens(9));
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  EXPECT_EQ(kv_->drop_namespace("a"), 2);
  check();
  EXPECT_EQ(kv_->match_prefix("a", iota_tokens(9)).cached_tokens, 0);
  EXPECT_EQ(kv_->match_prefix("b", iota_tokens(9)).cached_tokens, 8);
  // Referenced blocks leave the cache but stay with their sequence until freed.
  EXPECT_EQ(kv_->drop_namespace("b"), 2);
  EXPECT_EQ(table_of(*kv_, 2).size(), 3u);
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  EXPECT_EQ(kv_->num_free_blocks(), 16);
  check();
}

TEST_F(KvCacheManagerTest, DropConversationKeepsTheSharedSystemPrompt) {
  const auto system = iota_tokens(4, 100);
  const auto conv_a = concat(system, iota_tokens(9, 200));
  const auto conv_b = concat(system, iota_tokens(9, 300));
  prefill(*kv_, 1, "t", conv_a);
  prefill(*kv_, 2, "t", conv_b);
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  EXPECT_EQ(kv_->drop_conversation("t", conv_a, /*keep_prefix_tokens=*/4), 2);
  check();
  EXPECT_EQ(kv_->match_prefix("t", conv_a).cached_tokens, 4);
  EXPECT_EQ(kv_->match_prefix("t", conv_b).cached_tokens, 12);
  EXPECT_EQ(kv_->stats().removed_blocks_by_reason[static_cast<int>(RemovalReason::kDroppedConversation)], 2);
}

TEST_F(KvCacheManagerTest, EventsReportStoredAndRemovedBlocksInOrder) {
  prefill(*kv_, 1, "t", iota_tokens(9));
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  EXPECT_EQ(kv_->evict(5), 2);
  const auto events = kv_->drain_events();
  ASSERT_EQ(events.size(), 4u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence_number, i + 1);
    EXPECT_EQ(events[i].tenant_namespace, "t");
  }
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kBlockStored);
  EXPECT_EQ(events[0].parent_key_hash, 0u);
  EXPECT_EQ(events[1].parent_key_hash, events[0].key_hash);
  EXPECT_EQ(events[2].kind, KvEvent::Kind::kBlockRemoved);
  EXPECT_EQ(events[2].key_hash, events[1].key_hash) << "the leaf goes first";
  EXPECT_TRUE(kv_->drain_events().empty());
}

TEST(KvCacheManagerEvents, OldestEventsAreDroppedAndCountedWhenNobodyDrains) {
  ManualClock clock;
  KvCacheConfig config;
  config.num_blocks = 8;
  config.block_size = 2;
  config.max_pending_events = 3;
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  testing::prefill(*kv, 1, "t", iota_tokens(11));  // stores 5 blocks
  EXPECT_EQ(kv->dropped_events(), 2u);
  const auto events = kv->drain_events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events.front().sequence_number, 3u) << "sequence numbers reveal the gap";
}

TEST(KvCacheManagerEvents, SnapshotAfterAGapHoldsEveryCachedBlockParentsFirst) {
  ManualClock clock;
  KvCacheConfig config;
  config.num_blocks = 8;
  config.block_size = 2;
  config.max_pending_events = 3;
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  testing::prefill(*kv, 1, "t", iota_tokens(11));  // stores 5 blocks, 2 events dropped
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->last_event_number(), 5u);
  const auto snapshot = kv->cached_blocks();
  ASSERT_EQ(snapshot.size(), 5u);
  EXPECT_EQ(snapshot.front().parent_key_hash, 0u);
  for (size_t i = 1; i < snapshot.size(); ++i) {
    EXPECT_EQ(snapshot[i].parent_key_hash, snapshot[i - 1].key_hash);
    EXPECT_EQ(snapshot[i].kind, KvEvent::Kind::kBlockStored);
    EXPECT_EQ(snapshot[i].tenant_namespace, "t");
  }
  EXPECT_EQ(kv->evict(8), 5);
  EXPECT_TRUE(kv->cached_blocks().empty());
  EXPECT_EQ(kv->last_event_number(), 10u);
}

TEST_F(KvCacheManagerTest, FragmentationCountsAllocatedButUnwrittenSlots) {
  ASSERT_TRUE(kv_->allocate_sequence(1, "t", iota_tokens(10)).ok());
  EXPECT_EQ(kv_->stats().allocated_slots, 12);
  EXPECT_EQ(kv_->stats().unwritten_slots, 12);
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 7));
  EXPECT_EQ(kv_->stats().unwritten_slots, 5);
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 3));
  EXPECT_EQ(kv_->stats().unwritten_slots, 2);  // the tail of the last block
  EXPECT_EQ(kv_->mark_computed(1, 1).code(), StatusCode::kOutOfRange);
  check();
}

TEST_F(KvCacheManagerTest, ConcurrentIdenticalPrefillsDeduplicateWithoutTouchingTheTables) {
  const auto prompt = iota_tokens(9);
  ASSERT_TRUE(kv_->allocate_sequence(1, "t", prompt).ok());
  ASSERT_TRUE(kv_->allocate_sequence(2, "t", prompt).ok());  // nothing cached yet
  const auto a_before = table_of(*kv_, 1);
  const auto b_before = table_of(*kv_, 2);
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 9));
  PAGODA_EXPECT_OK(kv_->mark_computed(2, 9));
  check();
  // Tables are append-only: the duplicate keeps its own blocks.
  EXPECT_EQ(table_of(*kv_, 1), a_before);
  EXPECT_EQ(table_of(*kv_, 2), b_before);
  EXPECT_EQ(kv_->stats().blocks_deduplicated, 2);
  EXPECT_EQ(kv_->stats().blocks_in_use, 6);
  // Sequence 2's own full blocks leave with it; the cache keeps sequence 1's.
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  check();
  EXPECT_EQ(kv_->stats().blocks_in_use, 3);
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  check();
  const PrefixMatch m = prefill(*kv_, 3, "t", prompt);
  EXPECT_EQ(m.cached_tokens, 8);
  EXPECT_EQ(m.blocks[0], a_before[0]);
  EXPECT_EQ(m.blocks[1], a_before[1]);
}

TEST_F(KvCacheManagerTest, BlocksAfterADuplicateChainBelowTheCachedTwin) {
  const auto prompt = iota_tokens(9);
  ASSERT_TRUE(kv_->allocate_sequence(1, "t", prompt).ok());
  ASSERT_TRUE(kv_->allocate_sequence(2, "t", prompt).ok());
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 9));
  PAGODA_EXPECT_OK(kv_->mark_computed(2, 9));
  // Sequence 2 goes on past the shared prompt: its third block is new content
  // whose cache parent is sequence 1's second block (the twin of its own).
  const std::vector<TokenId> more = {100, 101, 102, 103};
  PAGODA_EXPECT_OK(kv_->append_tokens(2, more));
  PAGODA_EXPECT_OK(kv_->mark_computed(2, 4));
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(1));  // the twin stays referenced by sequence 2's alias
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  check();
  const PrefixMatch m = prefill(*kv_, 3, "t", concat(concat(prompt, more), {7}));
  EXPECT_EQ(m.cached_tokens, 12) << "the block after the duplicate was cached below its twin";
}

TEST_F(KvCacheManagerTest, ForkOfASequenceWithAliasesSharesThemToo) {
  const auto prompt = iota_tokens(9);
  ASSERT_TRUE(kv_->allocate_sequence(1, "t", prompt).ok());
  ASSERT_TRUE(kv_->allocate_sequence(2, "t", prompt).ok());
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 9));
  PAGODA_EXPECT_OK(kv_->mark_computed(2, 9));
  ASSERT_TRUE(kv_->fork(2, 3).ok());
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(3));
  check();
  EXPECT_EQ(kv_->stats().blocks_in_use, 0);
}

TEST_F(KvCacheManagerTest, PrecomputedBlockHashesMatchLikeHashingTheTokens) {
  const auto prompt = iota_tokens(13);
  prefill(*kv_, 1, "t", prompt);
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  BlockHashes hashes(4);
  hashes.extend(std::span<const TokenId>(prompt).first(6));  // one full block so far
  EXPECT_EQ(hashes.hashes().size(), 1u);
  hashes.extend(prompt);
  EXPECT_EQ(hashes.hashes().size(), 3u);
  const PrefixMatch plain = kv_->match_prefix("t", prompt);
  const PrefixMatch fast = kv_->match_prefix("t", prompt, hashes.hashes());
  EXPECT_EQ(fast.cached_tokens, plain.cached_tokens);
  EXPECT_EQ(fast.blocks, plain.blocks);
  EXPECT_TRUE(kv_->can_allocate_sequence("t", prompt, hashes.hashes()));
  auto m = kv_->allocate_sequence(2, "t", prompt, hashes.hashes());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->cached_tokens, 12);
  // Hashes only propose: a wrong hash for the first block is a miss, never a wrong hit.
  std::vector<uint64_t> wrong(hashes.hashes().begin(), hashes.hashes().end());
  wrong[0] ^= 1;
  EXPECT_EQ(kv_->match_prefix("t", prompt, wrong).cached_tokens, 0);
  check();
}

TEST(KvCacheManagerNoCache, DisabledPrefixCacheNeverHits) {
  ManualClock clock;
  auto kv = make_manager(8, 4, &clock, EvictionPolicyKind::kLru, /*prefix_cache=*/false);
  prefill(*kv, 1, "t", iota_tokens(9));
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->num_free_blocks(), 8);
  const PrefixMatch m = prefill(*kv, 2, "t", iota_tokens(9));
  EXPECT_EQ(m.cached_tokens, 0);
  EXPECT_EQ(kv->stats().hit_tokens, 0);
}

TEST(KvCacheManagerBlockSizes, ExtremeBlockSizesWork) {
  for (int32_t block_size : {1, 256}) {
    ManualClock clock;
    auto kv = make_manager(8, block_size, &clock);
    const auto prompt = iota_tokens(block_size * 2 + 1);
    prefill(*kv, 1, "t", prompt);
    PAGODA_EXPECT_OK(kv->free_sequence(1));
    const PrefixMatch m = prefill(*kv, 2, "t", prompt);
    EXPECT_EQ(m.cached_tokens, block_size * 2) << "block size " << block_size;
  }
}

TEST_F(KvCacheManagerTest, MissTokensAreSplitByReason) {
  prefill(*kv_, 1, "a", iota_tokens(9));  // 8 cacheable never seen + 1 tail
  prefill(*kv_, 2, "b", iota_tokens(9));  // never seen in "b" (cached in "a" only)
  prefill(*kv_, 3, "a", iota_tokens(3));  // shorter than a block
  const KvStats s = kv_->stats();
  EXPECT_EQ(s.miss_tokens_by_reason[static_cast<int>(MissReason::kNeverSeen)], 8 + 8);
  EXPECT_EQ(s.miss_tokens_by_reason[static_cast<int>(MissReason::kShorterThanBlock)], 1 + 1 + 3);
  int64_t sum = 0;
  for (int64_t v : s.miss_tokens_by_reason) sum += v;
  EXPECT_EQ(sum, s.miss_tokens);
  EXPECT_EQ(s.hit_tokens, 0);
}

TEST(KvCacheManagerMissReasons, EvictedKeyMemoryIsBounded) {
  ManualClock clock;
  KvCacheConfig config;
  config.num_blocks = 4;
  config.block_size = 4;
  config.evicted_key_memory = 1;
  auto kv = std::move(KvCacheManager::create(config, &clock)).value();
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("t", 0));  // a group: kept, with its memory, while empty
  const auto a = iota_tokens(5, 10);
  const auto b = iota_tokens(5, 50);
  prefill(*kv, 1, "t", a);
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->evict(1), 1);
  EXPECT_EQ(kv->match_prefix("t", a).reason, MissReason::kEvicted);
  prefill(*kv, 2, "t", b);
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  EXPECT_EQ(kv->evict(1), 1);
  EXPECT_EQ(kv->match_prefix("t", b).reason, MissReason::kEvicted);
  EXPECT_EQ(kv->match_prefix("t", a).reason, MissReason::kNeverSeen) << "memory of one key kept two";
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST_F(KvCacheManagerTest, VerifyIntegrityRunsAfterEveryStepOfAConversation) {
  // A multi-turn chat: each turn's prompt is the previous prompt + answer + a
  // new user message; every turn must reuse everything but the tail.
  std::vector<TokenId> history = iota_tokens(6, 100);
  for (int turn = 0; turn < 5; ++turn) {
    const SequenceId id = turn + 1;
    const PrefixMatch m = prefill(*kv_, id, "t", history);
    if (turn > 0) {
      EXPECT_EQ(m.cached_tokens, static_cast<int32_t>((history.size() - 1) / 4 * 4)) << "turn " << turn;
    }
    for (TokenId answer = 0; answer < 3; ++answer) {
      PAGODA_EXPECT_OK(kv_->append_tokens(id, std::vector<TokenId>{200 + 10 * turn + answer}));
      PAGODA_EXPECT_OK(kv_->mark_computed(id, 1));
      check();
      history.push_back(200 + 10 * turn + answer);
    }
    PAGODA_EXPECT_OK(kv_->free_sequence(id));
    check();
    history.push_back(300 + turn);  // the next user message
  }
}

}  // namespace
}  // namespace pagoda::kv
