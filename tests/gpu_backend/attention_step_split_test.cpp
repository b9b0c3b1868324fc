// The host half of FastAttention's step split (attention_step_split.h): which
// sequences go to the decode launch, and the scratch pool that prompt chunks
// over a quantized pool read. No GPU needed (label unit).

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cuda/attention_step_split.h"

namespace pagoda::cuda {
namespace {

SequenceSlice slice(int32_t fresh, int32_t cached, std::vector<int32_t> table) {
  SequenceSlice s;
  s.num_new_tokens = fresh;
  s.num_cached_tokens = cached;
  s.block_table = std::move(table);
  return s;
}

TEST(AttentionStepSplit, CountsOnlyTheLeadingOneTokenSequences) {
  EXPECT_EQ(count_leading_decodes({}), 0u);
  const std::vector<SequenceSlice> mixed = {slice(1, 30, {0, 1}), slice(1, 4, {2}), slice(7, 0, {3}),
                                            slice(1, 9, {4})};  // the last one-token chunk is not leading
  EXPECT_EQ(count_leading_decodes(mixed), 2u);
  const std::vector<SequenceSlice> prompts = {slice(5, 0, {0}), slice(1, 3, {1})};
  EXPECT_EQ(count_leading_decodes(prompts), 0u);
  const std::vector<SequenceSlice> decodes = {slice(1, 0, {0}), slice(1, 15, {1})};
  EXPECT_EQ(count_leading_decodes(decodes), 2u);
}

TEST(AttentionStepSplit, SharedBlocksAreCopiedOnceAndTablesRenumbered) {
  // Block size 4. Two chunks share the prefix blocks 9 and 3; the second
  // table is longer than its 10 positions need (3 blocks), so block 8 is never read.
  const std::vector<SequenceSlice> chunks = {slice(2, 8, {9, 3, 5}), slice(2, 8, {9, 3, 6, 8})};
  const auto remap = remap_blocks_to_scratch(chunks, 4, 10);
  ASSERT_TRUE(remap.has_value());
  EXPECT_EQ(remap->sources, (std::vector<int32_t>{9, 3, 5, 6}));
  ASSERT_EQ(remap->tables.size(), 2u);
  EXPECT_EQ(remap->tables[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(remap->tables[1], (std::vector<int32_t>{0, 1, 3}));
  // Every renumbered entry names the pool block the original table named.
  for (size_t i = 0; i < chunks.size(); ++i)
    for (size_t j = 0; j < remap->tables[i].size(); ++j)
      EXPECT_EQ(remap->sources[static_cast<size_t>(remap->tables[i][j])], chunks[i].block_table[j]);
}

TEST(AttentionStepSplit, PrefixEndingMidBlockKeepsItsLastBlock) {
  // 5 cached + 1 new = 6 positions at block size 4: blocks 0 and 1 of the table.
  const std::vector<SequenceSlice> chunks = {slice(1, 5, {7, 2})};
  const auto remap = remap_blocks_to_scratch(chunks, 4, 8);
  ASSERT_TRUE(remap.has_value());
  EXPECT_EQ(remap->sources, (std::vector<int32_t>{7, 2}));
}

TEST(AttentionStepSplit, RefusesShortTablesAndIdsOutsideThePool) {
  EXPECT_FALSE(remap_blocks_to_scratch(std::vector<SequenceSlice>{slice(3, 6, {0, 1})}, 4, 8).has_value());
  EXPECT_FALSE(remap_blocks_to_scratch(std::vector<SequenceSlice>{slice(3, 0, {8})}, 4, 8).has_value());
  EXPECT_FALSE(remap_blocks_to_scratch(std::vector<SequenceSlice>{slice(3, 0, {-1})}, 4, 8).has_value());
  EXPECT_FALSE(remap_blocks_to_scratch(std::vector<SequenceSlice>{slice(3, 0, {0})}, 0, 8).has_value());
}

}  // namespace
}  // namespace pagoda::cuda
