#pragma once
// Helpers shared by the KV tests.

#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv::testing {

#define PAGODA_EXPECT_OK(expr)                              \
  do {                                                      \
    const ::pagoda::Status pagoda_s_ = (expr);              \
    EXPECT_TRUE(pagoda_s_.ok()) << pagoda_s_.to_string();   \
  } while (0)
#define PAGODA_ASSERT_OK(expr)                              \
  do {                                                      \
    const ::pagoda::Status pagoda_s_ = (expr);              \
    ASSERT_TRUE(pagoda_s_.ok()) << pagoda_s_.to_string();   \
  } while (0)

// Tokens first, first+1, ..., first+count-1.
inline std::vector<TokenId> iota_tokens(int32_t count, TokenId first = 1) {
  std::vector<TokenId> t(static_cast<size_t>(count));
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::unique_ptr<KvCacheManager> make_manager(int32_t num_blocks, int32_t block_size, const Clock* clock,
                                                    EvictionPolicyKind policy = EvictionPolicyKind::kLru,
                                                    bool prefix_cache = true) {
  KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.eviction_policy = policy;
  config.enable_prefix_cache = prefix_cache;
  auto created = KvCacheManager::create(config, clock);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return std::move(created).value();
}

inline std::vector<BlockId> table_of(const KvCacheManager& kv, SequenceId seq) {
  auto t = kv.block_table(seq);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::vector<BlockId>(t->begin(), t->end()) : std::vector<BlockId>{};
}

// Allocates `prompt`, marks every prompt token computed, checks integrity.
inline PrefixMatch prefill(KvCacheManager& kv, SequenceId seq, std::string_view ns, const std::vector<TokenId>& prompt) {
  auto match = kv.allocate_sequence(seq, ns, prompt);
  EXPECT_TRUE(match.ok()) << match.status().to_string();
  if (!match.ok()) return {};
  PAGODA_EXPECT_OK(kv.mark_computed(seq, static_cast<int64_t>(prompt.size()) - match->cached_tokens));
  PAGODA_EXPECT_OK(kv.verify_integrity());
  return *match;
}

}  // namespace pagoda::kv::testing
