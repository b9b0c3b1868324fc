// The host tier of the KV cache manager: demotion on device eviction, host
// hits promoted into device blocks, host eviction, swap out / in, transfer
// failures, tenant namespaces across tiers, and the invariants after every call.

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

using testing::concat;
using testing::iota_tokens;
using testing::prefill;
using testing::table_of;

constexpr auto kD2H = TransferDirection::kDeviceToHost;
constexpr auto kH2D = TransferDirection::kHostToDevice;

std::unique_ptr<KvCacheManager> make_tiered(int32_t device_blocks, int32_t host_blocks, int32_t block_size,
                                            const Clock* clock) {
  KvCacheConfig config;
  config.num_blocks = device_blocks;
  config.num_host_blocks = host_blocks;
  config.block_size = block_size;
  auto created = KvCacheManager::create(config, clock);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return std::move(created).value();
}

class HostTierTest : public ::testing::Test {
 protected:
  ManualClock clock_;
  // 4 device blocks, 8 host blocks of 4 tokens.
  std::unique_ptr<KvCacheManager> kv_ = make_tiered(4, 8, 4, &clock_);
  void check() { PAGODA_EXPECT_OK(kv_->verify_integrity()); }
  // A finished request whose `prompt` (full blocks) stays cached.
  void finish(SequenceId seq, std::string_view ns, const std::vector<TokenId>& prompt) {
    prefill(*kv_, seq, ns, prompt);
    PAGODA_EXPECT_OK(kv_->free_sequence(seq));
    check();
  }
  // Fills the device tier with another request's blocks, forcing eviction.
  void crowd_out(SequenceId seq, TokenId first) {
    clock_.advance(10);
    prefill(*kv_, seq, "t", iota_tokens(16, first));
    PAGODA_EXPECT_OK(kv_->free_sequence(seq));
    check();
  }
};

TEST_F(HostTierTest, ConfigRejectsNegativeHostBlocks) {
  KvCacheConfig config;
  config.num_blocks = 4;
  config.num_host_blocks = -1;
  auto bad = KvCacheManager::create(config);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_host_blocks"), std::string::npos);
  EXPECT_EQ(kv_->num_host_blocks(), 8);
}

TEST_F(HostTierTest, DeviceEvictionWritesBackAndAHostHitIsPromoted) {
  const auto prompt = iota_tokens(9, 100);  // two full blocks + one token
  finish(1, "t", prompt);
  const auto first_table_stats = kv_->stats();
  EXPECT_EQ(first_table_stats.blocks_cached, 2);
  EXPECT_TRUE(kv_->take_transfers().empty());

  crowd_out(2, 500);  // needs all 4 device blocks: the two cached ones are demoted
  const std::vector<BlockTransfer> demoted = kv_->take_transfers();
  ASSERT_EQ(demoted.size(), 2u);
  for (const BlockTransfer& t : demoted) EXPECT_EQ(t.direction, kD2H);
  KvStats stats = kv_->stats();
  EXPECT_EQ(stats.blocks_demoted, 2);
  EXPECT_EQ(stats.blocks_written_back, 2);
  EXPECT_GE(stats.host_blocks_cached, 2);
  EXPECT_EQ(stats.transfers[static_cast<int>(kD2H)], 2);

  // The prompt's blocks are found in the host tier, after the device ones (none here).
  const PrefixMatch peek = kv_->match_prefix("t", prompt);
  EXPECT_EQ(peek.cached_tokens, 8);
  EXPECT_EQ(peek.host_blocks, 2);
  for (BlockId b : peek.blocks) EXPECT_GE(b, kv_->num_blocks()) << "host-tier ids follow the device ids";

  auto match = kv_->allocate_sequence(3, "t", prompt);
  ASSERT_TRUE(match.ok());
  check();
  EXPECT_EQ(match->cached_tokens, 8);
  EXPECT_EQ(match->host_blocks, 2);
  const auto table = table_of(*kv_, 3);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(match->blocks, std::vector<BlockId>(table.begin(), table.begin() + 2)) << "returned ids are device ids";
  for (BlockId b : table) EXPECT_LT(b, kv_->num_blocks());
  // The promotions come after the demotions that made room for them, and read
  // the host blocks the demotions of the first request wrote.
  const std::vector<BlockTransfer> moves = kv_->take_transfers();
  std::vector<BlockTransfer> promotions;
  for (const BlockTransfer& t : moves)
    if (t.direction == kH2D) promotions.push_back(t);
  ASSERT_EQ(promotions.size(), 2u);
  EXPECT_EQ(promotions[0].device_block, table[0]);
  EXPECT_EQ(promotions[1].device_block, table[1]);
  EXPECT_EQ(promotions[0].host_block, demoted[0].host_block == promotions[0].host_block ? demoted[0].host_block
                                                                                        : demoted[1].host_block);
  EXPECT_EQ(kv_->num_computed_tokens(3), 8);
  stats = kv_->stats();
  EXPECT_EQ(stats.hit_tokens_by_tier[static_cast<int>(BlockTier::kHost)], 8);
  EXPECT_EQ(stats.hit_tokens_by_tier[static_cast<int>(BlockTier::kDevice)], 0);
  EXPECT_EQ(stats.hit_tokens, 8);
  EXPECT_EQ(stats.blocks_promoted, 2);
  PAGODA_EXPECT_OK(kv_->mark_computed(3, 1));
  check();
}

TEST_F(HostTierTest, APromotedBlockKeepsItsHostCopySoTheNextDemotionCopiesNothing) {
  const auto prompt = iota_tokens(9, 100);
  finish(1, "t", prompt);
  crowd_out(2, 500);
  (void)kv_->take_transfers();
  prefill(*kv_, 3, "t", prompt);  // host hit: promoted, the host blocks stay as copies
  const auto promoted = table_of(*kv_, 3);
  PAGODA_EXPECT_OK(kv_->free_sequence(3));
  (void)kv_->take_transfers();
  crowd_out(4, 900);  // demotes the promoted blocks again (and write back others)
  int32_t written_back = 0;
  for (const BlockTransfer& t : kv_->take_transfers()) {
    if (t.direction != kD2H) continue;
    ++written_back;
    EXPECT_NE(t.device_block, promoted[0]) << "copied back again";
    EXPECT_NE(t.device_block, promoted[1]) << "copied back again";
  }
  EXPECT_EQ(written_back, 1) << "the crowding request's one cached block left on the device";
  EXPECT_EQ(kv_->match_prefix("t", prompt).host_blocks, 2);
}

TEST_F(HostTierTest, MixedDeviceThenHostMatchAndPartialHostMatch) {
  // A shared first block stays on the device (referenced), the second is demoted.
  const auto system = iota_tokens(4, 100);
  const auto a = concat(system, iota_tokens(5, 200));
  prefill(*kv_, 1, "t", a);  // blocks: system, a1, partial
  // Keep the system block referenced by a second sequence.
  prefill(*kv_, 2, "t", concat(system, {7}));
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  check();
  // Another request takes the free and evictable device blocks: a1 is demoted.
  prefill(*kv_, 3, "t", iota_tokens(8, 600));
  (void)kv_->take_transfers();
  const PrefixMatch m = kv_->match_prefix("t", a);
  EXPECT_EQ(m.cached_tokens, 8);
  EXPECT_EQ(m.host_blocks, 1);
  EXPECT_LT(m.blocks[0], kv_->num_blocks());
  EXPECT_GE(m.blocks[1], kv_->num_blocks());
  // Different tokens after the system prompt: only the device block matches.
  const PrefixMatch other = kv_->match_prefix("t", concat(system, iota_tokens(5, 300)));
  EXPECT_EQ(other.cached_tokens, 4);
  EXPECT_EQ(other.host_blocks, 0);
  check();
}

TEST_F(HostTierTest, NamespacesHoldInTheHostTier) {
  const auto prompt = iota_tokens(9, 100);
  finish(1, "tenant-a", prompt);
  crowd_out(2, 500);
  (void)kv_->take_transfers();
  EXPECT_EQ(kv_->match_prefix("tenant-a", prompt).host_blocks, 2);
  const PrefixMatch other = kv_->match_prefix("tenant-b", prompt);
  EXPECT_EQ(other.cached_tokens, 0);
  EXPECT_EQ(other.reason, MissReason::kNeverSeen) << "another namespace's blocks must not show in the reason";
  EXPECT_EQ(kv_->drop_namespace("tenant-a"), 2) << "the host blocks leave with their namespace";
  EXPECT_EQ(kv_->match_prefix("tenant-a", prompt).cached_tokens, 0);
  check();
}

TEST_F(HostTierTest, HostTierEvictsItsLeastRecentlyUsedBlocks) {
  auto small = make_tiered(4, 2, 4, &clock_);
  const auto a = iota_tokens(9, 100), b = iota_tokens(9, 300);
  prefill(*small, 1, "t", a);
  PAGODA_EXPECT_OK(small->free_sequence(1));
  clock_.advance(10);
  prefill(*small, 2, "t", b);
  PAGODA_EXPECT_OK(small->free_sequence(2));
  // Now 4 cached device blocks; a 16-token request demotes all four into a
  // host tier of two: a's blocks (older) are written back, then reclaimed for b's.
  clock_.advance(10);
  prefill(*small, 3, "t", iota_tokens(16, 700));
  PAGODA_EXPECT_OK(small->verify_integrity());
  EXPECT_EQ(small->match_prefix("t", a).cached_tokens, 0);
  EXPECT_EQ(small->match_prefix("t", a).reason, MissReason::kEvicted);
  EXPECT_EQ(small->match_prefix("t", b).cached_tokens, 8);
  EXPECT_GE(small->stats().host_blocks_evicted, 2);
  EXPECT_EQ(small->stats().host_blocks_free, 0);
}

TEST_F(HostTierTest, SwapOutFreesTheDeviceAndSwapInRestoresEveryWrittenSlot) {
  const auto prompt = iota_tokens(6, 100);  // one full block + 2 slots
  prefill(*kv_, 1, "t", prompt);
  PAGODA_EXPECT_OK(kv_->append_tokens(1, std::vector<TokenId>{9}));
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 1));  // 7 computed
  (void)kv_->take_transfers();
  const auto before = table_of(*kv_, 1);
  ASSERT_EQ(before.size(), 2u);

  PAGODA_ASSERT_OK(kv_->swap_out(1));
  check();
  EXPECT_TRUE(kv_->is_swapped(1));
  EXPECT_EQ(kv_->block_table(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv_->append_tokens(1, std::vector<TokenId>{3}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv_->num_computed_tokens(1), 7);
  const std::vector<BlockTransfer> out = kv_->take_transfers();
  ASSERT_EQ(out.size(), 2u) << "the full block and the partial one";
  EXPECT_EQ(out[0], (BlockTransfer{kD2H, before[0], out[0].host_block}));
  EXPECT_EQ(out[1], (BlockTransfer{kD2H, before[1], out[1].host_block}));
  KvStats stats = kv_->stats();
  EXPECT_EQ(stats.blocks_in_use, 0);
  EXPECT_EQ(stats.sequences_swapped, 1);
  EXPECT_EQ(stats.host_blocks_swapped, 2);
  EXPECT_EQ(kv_->swap_out(1).code(), StatusCode::kFailedPrecondition);

  // The full block is still cached on the device: swap-in shares it, and
  // copies back only the partial block.
  ASSERT_TRUE(kv_->can_swap_in(1, 1));
  PAGODA_ASSERT_OK(kv_->swap_in(1));
  check();
  const auto after = table_of(*kv_, 1);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0], before[0]);
  const std::vector<BlockTransfer> in = kv_->take_transfers();
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in[0], (BlockTransfer{kH2D, after[1], out[1].host_block}));
  EXPECT_EQ(kv_->num_computed_tokens(1), 7);
  PAGODA_EXPECT_OK(kv_->append_tokens(1, std::vector<TokenId>{4}));
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 1));
  stats = kv_->stats();
  EXPECT_EQ(stats.swap_outs, 1);
  EXPECT_EQ(stats.swap_ins, 1);
  EXPECT_EQ(stats.sequences_swapped, 0);
  check();
}

TEST_F(HostTierTest, SwappedBlocksDemotedMeanwhileArePromotedOnSwapIn) {
  const auto prompt = iota_tokens(9, 100);
  prefill(*kv_, 1, "t", prompt);  // 2 full cached blocks + 1 partial
  PAGODA_ASSERT_OK(kv_->swap_out(1));
  (void)kv_->take_transfers();
  crowd_out(2, 500);  // the cached device blocks are demoted onto their host copies: no copy
  for (const BlockTransfer& t : kv_->take_transfers()) EXPECT_NE(t.direction, kD2H);
  PAGODA_ASSERT_OK(kv_->swap_in(1));
  check();
  int32_t copied_in = 0;
  for (const BlockTransfer& t : kv_->take_transfers()) copied_in += t.direction == kH2D ? 1 : 0;
  EXPECT_EQ(copied_in, 3) << "two promoted cached blocks and the partial block";
  // The sequence is again the prefix cache's chain for its prompt.
  const auto table = table_of(*kv_, 1);
  const PrefixMatch m = kv_->match_prefix("t", prompt);
  EXPECT_EQ(m.host_blocks, 0);
  EXPECT_EQ(m.blocks, std::vector<BlockId>(table.begin(), table.begin() + 2));
}

TEST_F(HostTierTest, SwapOutNeedsHostRoomAndChangesNothingWithout) {
  auto small = make_tiered(8, 1, 4, &clock_);
  prefill(*small, 1, "t", iota_tokens(10, 100));  // three blocks with K/V
  const KvStats before = small->stats();
  EXPECT_EQ(small->swap_out(1).code(), StatusCode::kResourceExhausted);
  PAGODA_EXPECT_OK(small->verify_integrity());
  EXPECT_FALSE(small->is_swapped(1));
  EXPECT_EQ(small->stats().blocks_in_use, before.blocks_in_use);
  EXPECT_EQ(small->stats().swap_out_failures, 1);
  EXPECT_EQ(small->stats().host_blocks_free, 1);

  auto none = testing::make_manager(8, 4, &clock_);
  prefill(*none, 1, "t", iota_tokens(5));
  EXPECT_EQ(none->swap_out(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none->swap_in(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none->swap_out(77).code(), StatusCode::kNotFound);
  EXPECT_FALSE(none->can_swap_in(1));
}

TEST_F(HostTierTest, SwapInWaitsForDeviceRoom) {
  prefill(*kv_, 1, "t", iota_tokens(7, 100));  // 2 blocks
  PAGODA_ASSERT_OK(kv_->swap_out(1));
  prefill(*kv_, 2, "t", iota_tokens(14, 300));  // 4 blocks: the device is full
  EXPECT_FALSE(kv_->can_swap_in(1));
  EXPECT_EQ(kv_->swap_in(1).code(), StatusCode::kResourceExhausted);
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(2));
  EXPECT_TRUE(kv_->can_swap_in(1));
  PAGODA_EXPECT_OK(kv_->swap_in(1));
  check();
  // A swapped sequence can also be freed where it is.
  PAGODA_ASSERT_OK(kv_->swap_out(1));
  PAGODA_EXPECT_OK(kv_->abort_sequence(1));
  check();
  EXPECT_EQ(kv_->stats().host_blocks_swapped, 0);
}

TEST_F(HostTierTest, FailedDemotionsLeaveTheCacheAsMisses) {
  const auto prompt = iota_tokens(9, 100);
  finish(1, "t", prompt);
  crowd_out(2, 500);
  const std::vector<BlockTransfer> demoted = kv_->take_transfers();
  ASSERT_EQ(demoted.size(), 2u);
  EXPECT_TRUE(kv_->transfers_failed(demoted).empty()) << "no sequence held these blocks";
  check();
  const PrefixMatch m = kv_->match_prefix("t", prompt);
  EXPECT_EQ(m.cached_tokens, 0);
  EXPECT_EQ(m.reason, MissReason::kEvicted);
  const KvStats stats = kv_->stats();
  EXPECT_EQ(stats.blocks_lost, 2);
  EXPECT_GE(stats.removed_blocks_by_reason[static_cast<int>(RemovalReason::kTransferFailed)], 1);
}

TEST_F(HostTierTest, FailedPromotionNamesTheSequenceToRecompute) {
  const auto prompt = iota_tokens(9, 100);
  finish(1, "t", prompt);
  crowd_out(2, 500);
  (void)kv_->take_transfers();
  prefill(*kv_, 3, "t", prompt);  // promoted
  const std::vector<BlockTransfer> moves = kv_->take_transfers();
  EXPECT_EQ(kv_->transfers_failed(moves), std::vector<SequenceId>{3});
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(3));
  check();
  EXPECT_EQ(kv_->match_prefix("t", prompt).cached_tokens, 0) << "lost K/V is never served";
}

TEST_F(HostTierTest, FailedSwapOutNamesTheSwappedSequence) {
  prefill(*kv_, 1, "t", iota_tokens(6, 100));
  (void)kv_->take_transfers();
  PAGODA_ASSERT_OK(kv_->swap_out(1));
  const std::vector<BlockTransfer> out = kv_->take_transfers();
  EXPECT_EQ(kv_->transfers_failed(out), std::vector<SequenceId>{1});
  check();
  PAGODA_EXPECT_OK(kv_->free_sequence(1));
  check();
}

TEST_F(HostTierTest, WithoutAHostTierEvictionStillDrops) {
  auto none = testing::make_manager(4, 4, &clock_);
  prefill(*none, 1, "t", iota_tokens(9, 100));
  PAGODA_EXPECT_OK(none->free_sequence(1));
  prefill(*none, 2, "t", iota_tokens(16, 500));
  EXPECT_TRUE(none->take_transfers().empty());
  EXPECT_EQ(none->stats().blocks_demoted, 0);
  EXPECT_EQ(none->match_prefix("t", iota_tokens(9, 100)).cached_tokens, 0);
  PAGODA_EXPECT_OK(none->verify_integrity());
}

TEST_F(HostTierTest, AHostOnlyDuplicateIsTakenOverByTheDeviceBlock) {
  // A prompt is computed again while its blocks sit in the host tier only (a
  // sequence that does not match them, e.g. admitted before they were demoted).
  kv_ = make_tiered(8, 8, 4, &clock_);
  const auto prompt = iota_tokens(9, 100);
  auto seq = kv_->allocate_sequence(1, "t", prompt);  // miss: nothing cached yet
  ASSERT_TRUE(seq.ok());
  finish(2, "t", prompt);  // sequence 2 caches the prompt first
  EXPECT_EQ(kv_->evict(2), 2);  // demotes the two cached blocks
  (void)kv_->take_transfers();
  EXPECT_EQ(kv_->match_prefix("t", prompt).host_blocks, 2);
  PAGODA_EXPECT_OK(kv_->mark_computed(1, 9));  // its blocks take the host nodes' places
  check();
  const PrefixMatch m = kv_->match_prefix("t", prompt);
  EXPECT_EQ(m.cached_tokens, 8);
  EXPECT_EQ(m.host_blocks, 0);
  const auto table = table_of(*kv_, 1);
  EXPECT_EQ(m.blocks, std::vector<BlockId>(table.begin(), table.begin() + 2));
  EXPECT_TRUE(kv_->take_transfers().empty()) << "no copy: the device block has the K/V";
}

}  // namespace
}  // namespace pagoda::kv
