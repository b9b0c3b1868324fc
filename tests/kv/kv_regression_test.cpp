// Regression tests for prefix-cache bugs seen in peer engines.
#include <gtest/gtest.h>

#include <algorithm>

#include "kv_test_util.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

using testing::concat;
using testing::iota_tokens;
using testing::make_manager;
using testing::prefill;
using testing::table_of;

// nano-vllm: a freed block reused for other content kept its old hash entry,
// so a later prompt with the old content "hit" a block holding other K/V.
TEST(KvRegression, AReusedBlockLosesItsOldKey) {
  ManualClock clock;
  auto kv = make_manager(/*num_blocks=*/2, /*block_size=*/4, &clock);
  const auto old_prompt = iota_tokens(5, 100);
  prefill(*kv, 1, "t", old_prompt);
  const BlockId old_block = table_of(*kv, 1)[0];
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  ASSERT_EQ(kv->match_prefix("t", old_prompt).cached_tokens, 4);
  // New content needs both blocks: the cached one is evicted and reused.
  prefill(*kv, 2, "t", iota_tokens(8, 900));
  const auto reused_table = table_of(*kv, 2);
  EXPECT_NE(std::find(reused_table.begin(), reused_table.end(), old_block), reused_table.end());
  const PrefixMatch stale = kv->match_prefix("t", old_prompt);
  EXPECT_EQ(stale.cached_tokens, 0) << "the old key still points at a reused block";
  EXPECT_EQ(stale.reason, MissReason::kEvicted);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

// nano-vllm: a prompt whose every block was cached left zero tokens to compute.
TEST(KvRegression, AHitOfTheWholePromptStillComputesOneToken) {
  ManualClock clock;
  auto kv = make_manager(8, 4, &clock);
  const auto prompt = iota_tokens(8);  // exactly two blocks
  prefill(*kv, 1, "t", prompt);
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  auto match = kv->allocate_sequence(2, "t", prompt);
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->cached_tokens, 4);  // the last block is recomputed: one query token at least
  EXPECT_LT(kv->num_computed_tokens(2), kv->num_tokens(2));
  EXPECT_EQ(match->reason, MissReason::kHit);
  // The recomputed last block is a fresh block, not the cached one being rewritten.
  PAGODA_EXPECT_OK(kv->mark_computed(2, 4));
  PAGODA_EXPECT_OK(kv->verify_integrity());
  // One more token: now the whole 8-token prefix may be reused.
  EXPECT_EQ(kv->match_prefix("t", concat(prompt, {99})).cached_tokens, 8);
}

TEST(KvRegression, APrefixShorterThanOneBlockIsNeverCached) {
  ManualClock clock;
  auto kv = make_manager(8, 16, &clock);
  const auto prompt = iota_tokens(10);
  const PrefixMatch first = prefill(*kv, 1, "t", prompt);
  EXPECT_EQ(first.reason, MissReason::kShorterThanBlock);
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->stats().blocks_cached, 0) << "a partial block entered the cache";
  EXPECT_EQ(kv->num_free_blocks(), 8);
  const PrefixMatch again = kv->match_prefix("t", prompt);
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(again.reason, MissReason::kShorterThanBlock);
  // Exactly one block plus one token: now one block may be reused.
  prefill(*kv, 2, "t", iota_tokens(17));
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  EXPECT_EQ(kv->match_prefix("t", iota_tokens(17)).cached_tokens, 16);
}

// A client disconnects in the middle of a chunked prefill: the written full
// blocks may be reused, the unwritten ones must not enter the cache, and
// nothing leaks.
TEST(KvRegression, AbortInTheMiddleOfAPrefill) {
  ManualClock clock;
  auto kv = make_manager(8, 4, &clock);
  const auto prompt = iota_tokens(14);
  ASSERT_TRUE(kv->allocate_sequence(1, "t", prompt).ok());
  PAGODA_EXPECT_OK(kv->mark_computed(1, 6));  // block 0 full, block 1 half written
  PAGODA_EXPECT_OK(kv->abort_sequence(1));
  PAGODA_EXPECT_OK(kv->verify_integrity());
  const KvStats s = kv->stats();
  EXPECT_EQ(s.blocks_cached, 1);
  EXPECT_EQ(s.blocks_in_use, 0);
  EXPECT_EQ(s.blocks_free, 7);
  EXPECT_EQ(s.sequences_aborted, 1);
  EXPECT_EQ(kv->match_prefix("t", prompt).cached_tokens, 4);
  EXPECT_EQ(kv->abort_sequence(1).code(), StatusCode::kNotFound);
}

// Blocks leaked on client disconnect (peer bug class): many aborted requests
// at every stage leave the pool whole.
TEST(KvRegression, AbortsAtEveryStageLeakNothing) {
  ManualClock clock;
  auto kv = make_manager(32, 4, &clock);
  for (int stage = 0; stage < 12; ++stage) {
    const SequenceId id = stage;
    ASSERT_TRUE(kv->allocate_sequence(id, "t", iota_tokens(9, 100 * stage)).ok());
    if (stage > 3) PAGODA_EXPECT_OK(kv->mark_computed(id, stage - 3));
    if (stage > 8) {
      PAGODA_EXPECT_OK(kv->mark_computed(id, 9 - (stage - 3)));
      PAGODA_EXPECT_OK(kv->append_tokens(id, std::vector<TokenId>{1, 2, 3, 4, 5}));
    }
    PAGODA_EXPECT_OK(kv->abort_sequence(id));
    PAGODA_EXPECT_OK(kv->verify_integrity());
  }
  EXPECT_EQ(kv->stats().blocks_in_use, 0);
  EXPECT_EQ(kv->num_available_blocks(), 32);
}

}  // namespace
}  // namespace pagoda::kv
