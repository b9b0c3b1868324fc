// The minimum shared-prefix granularity (KvCacheConfig::prefix_share_min_tokens):
// a hit is used only in whole units, never below one, in either tier; what a
// namespace's own figures say about a cut-off hit.

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "pagoda/kv/clock.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

using testing::concat;
using testing::iota_tokens;
using testing::prefill;

std::unique_ptr<KvCacheManager> make_unit_manager(int32_t unit, const Clock* clock, int32_t host_blocks = 0,
                                                  int32_t num_blocks = 64) {
  KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = 4;
  config.num_host_blocks = host_blocks;
  config.prefix_share_min_tokens = unit;
  auto created = KvCacheManager::create(config, clock);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return std::move(created).value();
}

TEST(PrefixShareUnit, TheUnitMustBeAMultipleOfTheBlockSize) {
  KvCacheConfig config;
  config.num_blocks = 8;
  config.block_size = 4;
  for (int32_t bad : {-4, 2, 6, 10}) {
    config.prefix_share_min_tokens = bad;
    auto created = KvCacheManager::create(config);
    ASSERT_FALSE(created.ok()) << bad;
    EXPECT_NE(created.status().message().find("prefix_share_min_tokens"), std::string::npos);
  }
  for (int32_t good : {0, 4, 8, 64}) {
    config.prefix_share_min_tokens = good;
    EXPECT_TRUE(KvCacheManager::create(config).ok()) << good;
  }
}

TEST(PrefixShareUnit, HitsAreRoundedDownToWholeUnitsAndNoneBelowOne) {
  // Block 4, unit 12: a cached 40-token prompt (10 full blocks) serves
  // prefixes of its first k tokens as hits of floor(hit / 12) * 12 tokens.
  ManualClock clock;
  auto kv = make_unit_manager(12, &clock, 0, /*num_blocks=*/1024);  // room for every probe: nothing is evicted
  const auto cached = iota_tokens(41, 100);
  prefill(*kv, 1, "a", cached);
  PAGODA_ASSERT_OK(kv->free_sequence(1));
  SequenceId next = 2;
  for (int32_t shared = 1; shared <= 40; ++shared) {
    // The first `shared` tokens of the cached prompt, then tokens never sent.
    auto probe = concat(std::vector<TokenId>(cached.begin(), cached.begin() + shared), iota_tokens(9, 9000 + 100 * shared));
    const int32_t block_hit = shared / 4 * 4;  // what the cache holds of it
    const int32_t expected = block_hit / 12 * 12;
    const PrefixMatch q = kv->match_prefix("a", probe);
    EXPECT_EQ(q.cached_tokens, expected) << shared;
    EXPECT_EQ(q.blocks.size(), static_cast<size_t>(expected / 4)) << shared;
    if (block_hit % 12 != 0) EXPECT_EQ(q.reason, MissReason::kBelowShareUnit) << shared;
    const PrefixMatch m = prefill(*kv, next, "a", probe);
    EXPECT_EQ(m.cached_tokens, expected) << shared;
    PAGODA_EXPECT_OK(kv->free_sequence(next++));
    PAGODA_EXPECT_OK(kv->verify_integrity());
  }
  // Control, without a unit the same probes hit every cached block.
  auto plain = make_unit_manager(0, &clock);
  prefill(*plain, 1, "a", cached);
  PAGODA_ASSERT_OK(plain->free_sequence(1));
  auto probe = concat(std::vector<TokenId>(cached.begin(), cached.begin() + 8), iota_tokens(9, 70000));
  EXPECT_EQ(plain->match_prefix("a", probe).cached_tokens, 8);
  EXPECT_EQ(kv->match_prefix("a", probe).cached_tokens, 0) << "a probe shorter than one unit never hits";
}

TEST(PrefixShareUnit, ANamespacesOwnFiguresDoNotTellACutHitFromANeverSeenPrompt) {
  // Tenant-visible figures (/v1/usage) after a probe that shares 8 tokens
  // (below the unit) with a cached prompt, and after one that shares nothing.
  auto figures = [](bool shares) {
    ManualClock clock;
    auto kv = make_unit_manager(12, &clock);
    const auto cached = iota_tokens(41, 100);
    prefill(*kv, 1, "a", cached);
    PAGODA_EXPECT_OK(kv->free_sequence(1));
    const NamespaceKvUsage before = kv->namespace_usage("a");
    auto probe = concat(shares ? std::vector<TokenId>(cached.begin(), cached.begin() + 8) : iota_tokens(8, 5000),
                        iota_tokens(9, 9000));
    const PrefixMatch m = prefill(*kv, 2, "a", probe);
    EXPECT_EQ(m.cached_tokens, 0);
    NamespaceKvUsage after = kv->namespace_usage("a");
    std::array<int64_t, kNumMissReasons> delta{};
    for (int r = 0; r < kNumMissReasons; ++r) delta[r] = after.miss_tokens_by_reason[r] - before.miss_tokens_by_reason[r];
    return std::make_pair(delta, after.hit_tokens - before.hit_tokens);
  };
  const auto cut = figures(true);
  const auto never = figures(false);
  EXPECT_EQ(cut.first, never.first);
  EXPECT_EQ(cut.second, 0);
  EXPECT_EQ(never.second, 0);
}

TEST(PrefixShareUnit, HostTierHitsAreCutToWholeUnitsToo) {
  ManualClock clock;
  auto kv = make_unit_manager(8, &clock, /*host_blocks=*/32);
  const auto cached = iota_tokens(25, 100);  // 6 full blocks
  prefill(*kv, 1, "a", cached);
  PAGODA_ASSERT_OK(kv->free_sequence(1));
  // Demote every cached device block to the host tier.
  EXPECT_GT(kv->evict(64), 0);
  (void)kv->take_transfers();
  // A 20-token share is 5 blocks in the host tier; the unit of 8 uses 16 tokens.
  auto probe = concat(std::vector<TokenId>(cached.begin(), cached.begin() + 20), iota_tokens(5, 9000));
  const PrefixMatch q = kv->match_prefix("a", probe);
  EXPECT_EQ(q.cached_tokens, 16);
  EXPECT_EQ(q.host_blocks, 4);
  const PrefixMatch m = prefill(*kv, 2, "a", probe);
  EXPECT_EQ(m.cached_tokens, 16);
  int32_t host_to_device = 0;
  for (const BlockTransfer& t : kv->take_transfers())
    host_to_device += t.direction == TransferDirection::kHostToDevice ? 1 : 0;
  EXPECT_EQ(host_to_device, 4) << "only the blocks of whole units come back from the host tier";
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

}  // namespace
}  // namespace pagoda::kv
