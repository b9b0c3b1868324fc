#include "pagoda/kv/prefix_hash_table.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace pagoda::kv {
namespace {

TEST(PrefixHashTable, InsertFindErase) {
  PrefixHashTable table(16);
  EXPECT_TRUE(table.insert(5, 1));
  EXPECT_FALSE(table.insert(5, 2));  // present already
  EXPECT_EQ(table.find(5), 1);
  EXPECT_EQ(table.find(6), kNoBlock);
  EXPECT_TRUE(table.erase(5));
  EXPECT_FALSE(table.erase(5));
  EXPECT_EQ(table.find(5), kNoBlock);
}

TEST(PrefixHashTable, MatchesStdMapUnderRandomChurnWithCollidingSlots) {
  // Keys share their low bits on purpose so probe runs are long and
  // backward-shift deletion is exercised.
  PrefixHashTable table(256);
  std::unordered_map<uint64_t, BlockId> model;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 200000; ++step) {
    const uint64_t key = ((rng() % 600) << 9) | (rng() % 4) | 1;  // never 0
    if (rng() % 2 == 0 && model.size() < 256) {
      const bool inserted = table.insert(key, static_cast<BlockId>(step));
      EXPECT_EQ(inserted, model.emplace(key, static_cast<BlockId>(step)).second);
    } else {
      EXPECT_EQ(table.erase(key), model.erase(key) == 1);
    }
    const uint64_t probe = ((rng() % 600) << 9) | (rng() % 4) | 1;
    const auto it = model.find(probe);
    ASSERT_EQ(table.find(probe), it == model.end() ? kNoBlock : it->second) << "step " << step;
  }
  EXPECT_EQ(table.size(), static_cast<int32_t>(model.size()));
}

}  // namespace
}  // namespace pagoda::kv
