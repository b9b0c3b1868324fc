// Stable block keys (kv/stable_key.h) and the manager's hooks for the tiers
// below the host: keys are the same in a fresh manager (a restarted server),
// differ by namespace, fingerprint and parent; write-through gives every new
// cached block a host twin whose stable key is the block's; blocks adopted
// from a lower tier are promoted by a match and counted under their origin.

#include <set>

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kv/stable_key.h"

namespace pagoda::kv {
namespace {

using testing::iota_tokens;
using testing::prefill;

std::unique_ptr<KvCacheManager> make_stable(int32_t device_blocks, int32_t host_blocks, std::string fingerprint,
                                            bool write_through = true) {
  KvCacheConfig config;
  config.num_blocks = device_blocks;
  config.num_host_blocks = host_blocks;
  config.block_size = 4;
  config.stable_key_fingerprint = std::move(fingerprint);
  config.host_write_through = write_through;
  auto created = KvCacheManager::create(config);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return std::move(created).value();
}

TEST(StableKeyTest, SameInputsSameKeyAcrossManagers) {
  const std::vector<TokenId> prompt = iota_tokens(17);
  auto a = make_stable(16, 16, "model-1");
  auto b = make_stable(16, 16, "model-1");
  const auto ka = a->stable_keys("tenant", prompt, 4);
  ASSERT_EQ(ka.size(), 4u);
  EXPECT_EQ(ka, b->stable_keys("tenant", prompt, 4));
  // Only whole blocks: asking for more than the prompt holds stops at 4.
  EXPECT_EQ(a->stable_keys("tenant", prompt, 9).size(), 4u);
  // A known value pins the format: a change to it must be deliberate (it orphans stored blocks).
  const StableKey root = stable_namespace_root("fp", "ns");
  const TokenId tokens[2] = {1, 2};
  EXPECT_EQ(stable_key_hex(stable_block_key(root, tokens, 2)).size(), 64u);
  EXPECT_EQ(stable_block_key(root, tokens, 2), stable_block_key(stable_namespace_root("fp", "ns"), tokens, 2));
}

TEST(StableKeyTest, NamespaceFingerprintAndParentChangeTheKey) {
  const std::vector<TokenId> prompt = iota_tokens(8);
  auto m = make_stable(16, 16, "model-1");
  auto other_model = make_stable(16, 16, "model-2");
  const auto a = m->stable_keys("alice", prompt, 2);
  const auto b = m->stable_keys("bob", prompt, 2);
  const auto c = other_model->stable_keys("alice", prompt, 2);
  std::set<StableKey> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  all.insert(c.begin(), c.end());
  EXPECT_EQ(all.size(), 6u);
  // Length-prefixed names: ("ab", "c...") never meets ("a", "bc...").
  EXPECT_NE(stable_namespace_root("ab", "c"), stable_namespace_root("a", "bc"));
  // The same block tokens under another parent: another key.
  std::vector<TokenId> shifted = prompt;
  shifted[0] = 99;
  EXPECT_NE(m->stable_keys("alice", shifted, 2)[1], a[1]);
}

TEST(StableKeyTest, WriteThroughTwinsCarryTheBlocksKeys) {
  auto kv = make_stable(16, 16, "fp");
  const std::vector<TokenId> prompt = iota_tokens(13);  // 3 full blocks
  prefill(*kv, 1, "t", prompt);
  const std::vector<BlockTransfer> moves = kv->take_transfers();
  ASSERT_EQ(moves.size(), 3u);  // one device->host copy per cached block
  const auto keys = kv->stable_keys("t", prompt, 3);
  for (size_t j = 0; j < moves.size(); ++j) {
    EXPECT_EQ(moves[j].direction, TransferDirection::kDeviceToHost);
    const auto key = kv->host_block_stable_key(moves[j].host_block);
    ASSERT_TRUE(key.has_value());
    EXPECT_EQ(*key, keys[j]);
  }
  EXPECT_FALSE(kv->host_block_stable_key(-1).has_value());
  EXPECT_FALSE(kv->host_block_stable_key(1000).has_value());
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(StableKeyTest, AdoptedBlocksArePromotedAndCountedByOrigin) {
  auto kv = make_stable(16, 16, "fp", /*write_through=*/false);
  const std::vector<TokenId> prompt = iota_tokens(13);
  // A fresh manager (a restarted server) adopts blocks 0-1 from "disk" and 2 from "redis".
  const std::vector<int32_t> disk = kv->adopt_host_blocks("t", prompt, 0, 2, 1);
  ASSERT_EQ(disk.size(), 2u);
  const std::vector<int32_t> redis = kv->adopt_host_blocks("t", prompt, 2, 1, 2);
  ASSERT_EQ(redis.size(), 1u);
  PAGODA_EXPECT_OK(kv->verify_integrity());
  // Adopted host nodes carry the keys a fresh computation would give.
  const auto keys = kv->stable_keys("t", prompt, 3);
  EXPECT_EQ(*kv->host_block_stable_key(disk[0]), keys[0]);
  EXPECT_EQ(*kv->host_block_stable_key(redis[0]), keys[2]);
  // Already cached: nothing more is adopted; a broken chain neither.
  EXPECT_TRUE(kv->adopt_host_blocks("t", prompt, 0, 1, 1).empty());
  EXPECT_TRUE(kv->adopt_host_blocks("other", prompt, 1, 1, 1).empty());
  // Another tenant never matches them.
  EXPECT_EQ(kv->match_prefix("other", prompt).cached_tokens, 0);

  auto match = kv->allocate_sequence(1, "t", prompt);
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->cached_tokens, 12);
  EXPECT_EQ(match->host_blocks, 3);
  const KvStats s = kv->stats();
  EXPECT_EQ(s.hit_tokens_by_tier[1], 12);
  EXPECT_EQ(s.hit_tokens_by_lower_tier[0], 8);
  EXPECT_EQ(s.hit_tokens_by_lower_tier[1], 4);
  PAGODA_EXPECT_OK(kv->verify_integrity());
  PAGODA_EXPECT_OK(kv->mark_computed(1, 1));
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  // A second hit is an ordinary device hit: the origin was counted once.
  auto again = kv->allocate_sequence(2, "t", prompt);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(kv->stats().hit_tokens_by_lower_tier[0], 8);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(StableKeyTest, AdoptStopsWhenTheHostTierIsFull) {
  auto kv = make_stable(16, 2, "fp", /*write_through=*/false);
  const std::vector<TokenId> prompt = iota_tokens(21);  // 5 full blocks
  // Two host blocks: the second adoption reclaims... nothing it may (the first is its parent).
  const std::vector<int32_t> got = kv->adopt_host_blocks("t", prompt, 0, 5, 1);
  EXPECT_EQ(got.size(), 2u);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(StableKeyTest, WriteThroughNeedsAHostTier) {
  KvCacheConfig config;
  config.num_blocks = 4;
  config.host_write_through = true;
  EXPECT_EQ(KvCacheManager::create(config).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagoda::kv
