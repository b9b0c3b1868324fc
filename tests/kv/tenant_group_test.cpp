// A tenant's KV cap counts every namespace of the tenant (its own and its
// salted users', `<tenant>/<user>`) together, and the namespace table holds live
// namespaces only: a namespace nothing refers to is reclaimed, and one
// re-created in its slot never sees its predecessor's blocks.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "kv_test_util.h"
#include "pagoda/kv/clock.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

using testing::iota_tokens;
using testing::prefill;

std::unique_ptr<KvCacheManager> manager(int32_t num_blocks, const Clock* clock, int32_t host_blocks = 0) {
  KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = 4;
  config.num_host_blocks = host_blocks;
  auto created = KvCacheManager::create(config, clock);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return std::move(created).value();
}

std::string user(const std::string& tenant, int i) { return tenant + "/user:" + std::to_string(i); }

// Tenant "b" caches 6 prompts (12 blocks); then 40 users of tenant "a" each
// send a prompt of 4 blocks (3 cached). Returns how many of b's prompts still
// hit fully; *a_max_held: the most blocks a's namespaces held together.
int b_prompts_surviving_users_of_a(const std::string& a_users_prefix, int32_t* a_max_held) {
  ManualClock clock;
  auto kv = manager(24, &clock);
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("a", 8));
  SequenceId id = 1;
  for (int p = 0; p < 6; ++p) {
    clock.advance(10);
    prefill(*kv, id, "b", iota_tokens(9, 100 * (p + 1)));
    PAGODA_EXPECT_OK(kv->free_sequence(id++));
  }
  *a_max_held = 0;
  for (int u = 0; u < 40; ++u) {
    clock.advance(10);
    const std::string ns = a_users_prefix + std::to_string(u);
    const auto prompt = iota_tokens(13, 5000 + 50 * u);
    if (!kv->can_allocate_sequence(ns, prompt)) {
      ADD_FAILURE() << "a's users must always run by recycling a's own blocks";
      break;
    }
    prefill(*kv, id, ns, prompt);
    PAGODA_EXPECT_OK(kv->free_sequence(id++));
    int32_t held = 0;  // every namespace of a: the tenant's figure, and the sum of what each holds
    for (int v = 0; v <= u; ++v) held += kv->namespace_usage(a_users_prefix + std::to_string(v)).blocks_held;
    *a_max_held = std::max(*a_max_held, held);
    if (a_users_prefix.starts_with("a/")) {
      EXPECT_EQ(kv->namespace_usage(ns).group_blocks_held, held);
    }
    PAGODA_EXPECT_OK(kv->verify_integrity());
  }
  int surviving = 0;
  for (int p = 0; p < 6; ++p) surviving += kv->match_prefix("b", iota_tokens(9, 100 * (p + 1))).cached_tokens == 8;
  return surviving;
}

TEST(TenantKvGroup, ASaltingTenantWithManyUsersStaysWithinItsCapInTotal) {
  int32_t held = 0;
  EXPECT_EQ(b_prompts_surviving_users_of_a("a/user:", &held), 6) << "a's users, capped together, leave b alone";
  EXPECT_LE(held, 8) << "40 users x 4 blocks, all inside a's one cap of 8";
  // The control: namespaces not named under "a/" are not a's, so nothing caps
  // them: they hold far more than 8 blocks together and push b's cache out.
  int32_t uncapped = 0;
  EXPECT_LT(b_prompts_surviving_users_of_a("a-user:", &uncapped), 6);
  EXPECT_GT(uncapped, 8);
}

TEST(TenantKvGroup, UsersRunningTogetherShareTheCapAndARefusedRequestChangesNothing) {
  ManualClock clock;
  auto kv = manager(64, &clock);
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("a", 8));
  prefill(*kv, 1, user("a", 1), iota_tokens(16, 100));  // 4 blocks, running
  prefill(*kv, 2, user("a", 2), iota_tokens(16, 200));  // 4 more: a is at its cap
  prefill(*kv, 3, "b", iota_tokens(16, 300));           // b has no cap
  EXPECT_EQ(kv->namespace_usage(user("a", 2)).group_blocks_held, 8);
  EXPECT_EQ(kv->namespace_usage("a").group_blocks_held, 8);
  EXPECT_EQ(kv->namespace_usage(user("a", 2)).block_limit, 8) << "a user's limit is its tenant's";
  const auto third = iota_tokens(8, 400);
  EXPECT_EQ(kv->namespace_room(user("a", 3), third), NamespaceRoom::kWaitForOwnBlocks);
  EXPECT_FALSE(kv->can_allocate_sequence(user("a", 3), third));
  EXPECT_TRUE(kv->can_allocate_sequence("b", third)) << "the cap is a's alone";
  // Refused for the quota: no block, no table entry, no counter moves.
  const KvStats before = kv->stats();
  const auto refused = kv->allocate_sequence(4, user("a", 3), third);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const KvStats after = kv->stats();
  EXPECT_EQ(after.blocks_free, before.blocks_free);
  EXPECT_EQ(after.blocks_in_use, before.blocks_in_use);
  EXPECT_EQ(after.blocks_cached, before.blocks_cached);
  EXPECT_EQ(after.namespaces_live, before.namespaces_live);
  EXPECT_EQ(after.sequences_allocated, before.sequences_allocated);
  EXPECT_FALSE(kv->has_sequence(4));
  EXPECT_EQ(kv->append_tokens(1, std::vector<TokenId>{1}).code(), StatusCode::kResourceExhausted)
      << "appending past the shared cap fails too";
  PAGODA_EXPECT_OK(kv->verify_integrity());
  // A user's sequence ends: its cached blocks are recycled for the next user.
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->namespace_room(user("a", 3), third), NamespaceRoom::kFits);
  prefill(*kv, 4, user("a", 3), third);
  EXPECT_LE(kv->namespace_usage("a").group_blocks_held, 8);
  EXPECT_EQ(kv->match_prefix("b", iota_tokens(16, 300)).cached_tokens, 12) << "b's blocks were not taken";
  PAGODA_EXPECT_OK(kv->verify_integrity());
  // A request bigger than the whole cap can never fit, whoever runs.
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  PAGODA_EXPECT_OK(kv->free_sequence(4));
  EXPECT_EQ(kv->namespace_room(user("a", 9), iota_tokens(40, 900)), NamespaceRoom::kNeverFits);
}

TEST(TenantKvGroup, UsersThatExistedBeforeTheCapJoinItAndACapCannotBeSetOnAMember) {
  ManualClock clock;
  auto kv = manager(64, &clock);
  prefill(*kv, 1, user("a", 1), iota_tokens(16, 100));  // 4 blocks, before "a" is a group
  PAGODA_EXPECT_OK(kv->set_namespace_block_limit("a", 6));
  EXPECT_EQ(kv->namespace_usage("a").group_blocks_held, 4);
  EXPECT_FALSE(kv->can_allocate_sequence(user("a", 2), iota_tokens(12, 200)));
  EXPECT_EQ(kv->set_namespace_block_limit(user("a", 1), 3).code(), StatusCode::kInvalidArgument);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(NamespaceTable, StaysBoundedOverAHundredThousandSaltedUsers) {
  for (const int32_t cap : {16, 0}) {  // capped: recycled within the tenant; uncapped: evicted by the pool
    ManualClock clock;
    auto kv = manager(64, &clock);
    PAGODA_EXPECT_OK(kv->set_namespace_block_limit("t", cap));
    int32_t most_live = 0;
    constexpr int kUsers = 100000;
    for (int u = 0; u < kUsers; ++u) {
      clock.advance(1);
      const std::string ns = user("t", u);
      const auto prompt = iota_tokens(9, u % 1000);  // 2 cached blocks per user
      auto match = kv->allocate_sequence(u + 1, ns, prompt);
      ASSERT_TRUE(match.ok()) << match.status().to_string() << " at user " << u;
      PAGODA_ASSERT_OK(kv->mark_computed(u + 1, 9));
      PAGODA_ASSERT_OK(kv->free_sequence(u + 1));
      most_live = std::max(most_live, kv->stats().namespaces_live);
      if (u % 20000 == 0) PAGODA_ASSERT_OK(kv->verify_integrity());
    }
    // At most every block in a different user's namespace, plus the tenant.
    EXPECT_LE(most_live, 64 / 2 + 2) << "cap " << cap;
    EXPECT_GE(kv->stats().namespaces_reclaimed, kUsers - (64 / 2 + 2));
    if (cap > 0) {
      EXPECT_LE(kv->namespace_usage("t").group_blocks_held, cap);
    }
    PAGODA_EXPECT_OK(kv->verify_integrity());
  }
}

TEST(NamespaceTable, AReclaimedSlotsNextNamespaceGetsItsBlocksZeroedAndNoneOfItsPrefixes) {
  ManualClock clock;
  auto kv = manager(8, &clock);
  const auto secret = iota_tokens(9, 700);
  prefill(*kv, 1, "first", secret);  // 3 blocks, 2 cached
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  (void)kv->take_blocks_to_zero();
  EXPECT_EQ(kv->stats().namespaces_live, 1);
  EXPECT_EQ(kv->drop_namespace("first"), 2);
  EXPECT_EQ(kv->stats().namespaces_live, 0) << "nothing refers to 'first' any more";
  // "second" takes the reclaimed slot (the only one) and the blocks "first"
  // freed last: every one must be listed for zeroing although the slot is the
  // same (tags differ), and "first"'s prompt is no hit for it.
  const PrefixMatch m = prefill(*kv, 2, "second", secret);
  EXPECT_EQ(m.cached_tokens, 0);
  EXPECT_EQ(m.reason, MissReason::kNeverSeen);
  const std::vector<BlockId> table = testing::table_of(*kv, 2);
  std::vector<BlockId> zeroed = kv->take_blocks_to_zero();
  std::sort(zeroed.begin(), zeroed.end());
  for (BlockId b : table) EXPECT_TRUE(std::binary_search(zeroed.begin(), zeroed.end(), b)) << "block " << b;
  EXPECT_EQ(kv->namespace_usage("second").sequences_allocated, 1) << "fresh counters, not first's";
  // "first" re-created: a new incarnation, with no memory of its old prefixes.
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  const PrefixMatch again = prefill(*kv, 3, "first", secret);
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(kv->namespace_usage("first").sequences_allocated, 1);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

TEST(NamespaceTable, SequencesAndHostNodesKeepANamespaceAlive) {
  ManualClock clock;
  auto kv = manager(8, &clock, /*host_blocks=*/8);
  // A swapped-out sequence holds only host blocks, which have no holder: its
  // namespace lives on through the sequence.
  ASSERT_TRUE(kv->allocate_sequence(1, "u", iota_tokens(3, 10)).ok());
  PAGODA_EXPECT_OK(kv->mark_computed(1, 3));
  PAGODA_EXPECT_OK(kv->swap_out(1));
  EXPECT_EQ(kv->namespace_usage("u").blocks_held, 0);
  EXPECT_EQ(kv->stats().namespaces_live, 1);
  PAGODA_EXPECT_OK(kv->verify_integrity());
  PAGODA_EXPECT_OK(kv->swap_in(1));
  PAGODA_EXPECT_OK(kv->free_sequence(1));
  EXPECT_EQ(kv->stats().namespaces_live, 0) << "a partial block is not cached: nothing is left";
  // Cached blocks demoted to the host tier keep their namespace, which hits them.
  const auto prompt = iota_tokens(9, 20);
  prefill(*kv, 2, "v", prompt);
  PAGODA_EXPECT_OK(kv->free_sequence(2));
  EXPECT_EQ(kv->evict(8), 2);
  EXPECT_EQ(kv->namespace_usage("v").blocks_held, 0);
  EXPECT_EQ(kv->stats().namespaces_live, 1);
  EXPECT_EQ(kv->match_prefix("v", prompt).cached_tokens, 8);
  EXPECT_EQ(kv->match_prefix("v", prompt).host_blocks, 2);
  PAGODA_EXPECT_OK(kv->verify_integrity());
}

}  // namespace
}  // namespace pagoda::kv
