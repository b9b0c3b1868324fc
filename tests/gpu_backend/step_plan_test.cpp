// The host half of the CUDA forward (step_plan.h): per-token metadata, graph
// buckets and padding. No GPU needed (label unit).

#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cuda/step_plan.h"

namespace pagoda::cuda {
namespace {

SequenceSlice slice(int32_t offset, int32_t fresh, int32_t cached, std::vector<int32_t> table, bool all = false,
                    bool last = true) {
  SequenceSlice s;
  s.token_offset = offset;
  s.num_new_tokens = fresh;
  s.num_cached_tokens = cached;
  s.block_table = std::move(table);
  s.logits_for_all_new_tokens = all;
  s.logits_for_last_token = last;
  return s;
}

ForwardBatch batch_of(std::vector<SequenceSlice> slices) {
  ForwardBatch b;
  for (const SequenceSlice& s : slices)
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      b.token_ids.push_back(100 + b.num_tokens());
      b.positions.push_back(s.num_cached_tokens + i);
    }
  b.sequences = std::move(slices);
  return b;
}

struct HostMetadata {
  explicit HostMetadata(StepLayout layout) : layout(layout), memory(step_metadata_bytes(layout) / 8 + 1) {
    m = bind_step_metadata(memory.data(), layout);
  }
  StepLayout layout;
  std::vector<int64_t> memory;  // 8-byte aligned; the layout only needs relative alignment here
  StepMetadata m;
};

TEST(StepPlan, MixedBatchSlotsRangesRowsAndTables) {
  HostMetadata h({16, 4, 8});
  // seq 0: 5 new after 37 cached (ends mid-block), logits for the last; seq 1: decode after 15
  // cached; seq 2: fresh prefill of 3 with logits for every token.
  const ForwardBatch b = batch_of({slice(0, 5, 37, {9, 3, 7}), slice(5, 1, 15, {4}), slice(6, 3, 0, {11}, true)});
  const int32_t rows = fill_step_metadata(b, 16, 0, 8, b.num_tokens(), h.m);
  EXPECT_EQ(rows, b.num_logit_rows());
  EXPECT_EQ(std::vector<int32_t>(h.m.logit_rows, h.m.logit_rows + rows), (std::vector<int32_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(std::vector<int64_t>(h.m.slots, h.m.slots + 9),
            (std::vector<int64_t>{7 * 16 + 5, 7 * 16 + 6, 7 * 16 + 7, 7 * 16 + 8, 7 * 16 + 9, 4 * 16 + 15, 11 * 16,
                                  11 * 16 + 1, 11 * 16 + 2}));
  EXPECT_EQ(std::vector<int32_t>(h.m.kv_end, h.m.kv_end + 9), (std::vector<int32_t>{38, 39, 40, 41, 42, 16, 1, 2, 3}));
  for (int t = 0; t < 9; ++t) EXPECT_EQ(h.m.kv_begin[t], 0);
  EXPECT_EQ(std::vector<int32_t>(h.m.token_sequence, h.m.token_sequence + 9),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 2, 2, 2}));
  EXPECT_EQ(std::vector<int32_t>(h.m.positions, h.m.positions + 9),
            (std::vector<int32_t>{37, 38, 39, 40, 41, 15, 0, 1, 2}));
  EXPECT_EQ(h.m.token_ids[8], 108);
  EXPECT_EQ(std::vector<int32_t>(h.m.block_tables, h.m.block_tables + 3), (std::vector<int32_t>{9, 3, 7}));
  EXPECT_EQ(h.m.block_tables[8], 4);
  EXPECT_EQ(h.m.block_tables[16], 11);
}

// The columns of block_tables a step uploads: the longest table the step's
// sequences need (cached + new tokens), never 0.
TEST(StepPlan, BlockTableWidthIsTheLongestNeededTable) {
  EXPECT_EQ(step_block_table_width(batch_of({slice(0, 5, 37, {9, 3, 7}), slice(5, 1, 15, {4}), slice(6, 3, 0, {11})}), 16),
            3);
  EXPECT_EQ(step_block_table_width(batch_of({slice(0, 1, 15, {4, 5})}), 16), 1) << "16 tokens: one block";
  EXPECT_EQ(step_block_table_width(batch_of({slice(0, 1, 16, {4, 5})}), 16), 2) << "17 tokens: two";
  EXPECT_EQ(step_block_table_width(batch_of({slice(0, 1, 130000, {})}), 16), 8126);
  EXPECT_EQ(step_block_table_width(ForwardBatch{}, 16), 1);
}

TEST(StepPlan, SlidingWindowLimitsTheFirstVisibleKey) {
  HostMetadata h({16, 1, 4});
  const ForwardBatch b = batch_of({slice(0, 4, 6, {0})});
  fill_step_metadata(b, 16, /*sliding_window=*/8, 4, b.num_tokens(), h.m);
  // Indices 6..9 see [max(0, i - 7), i].
  EXPECT_EQ(std::vector<int32_t>(h.m.kv_begin, h.m.kv_begin + 4), (std::vector<int32_t>{0, 0, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(h.m.kv_end, h.m.kv_end + 4), (std::vector<int32_t>{7, 8, 9, 10}));
}

TEST(StepPlan, GraphPaddingRowsWriteNothingAndSeeNothing) {
  HostMetadata h({8, 8, 2});
  const ForwardBatch b = batch_of({slice(0, 1, 3, {2}), slice(1, 1, 20, {5, 6}), slice(2, 1, 0, {1})});
  const int32_t rows = fill_step_metadata(b, 16, 0, 2, /*padded_tokens=*/4, h.m);
  EXPECT_EQ(rows, 3);
  EXPECT_EQ(h.m.slots[1], 6 * 16 + 4);
  EXPECT_EQ(h.m.slots[3], -1);
  EXPECT_EQ(h.m.kv_begin[3], 0);
  EXPECT_EQ(h.m.kv_end[3], 0);
  EXPECT_EQ(h.m.token_ids[3], 0);
  EXPECT_EQ(h.m.logit_rows[3], 3);
}

TEST(StepPlan, DecodeGraphBuckets) {
  EXPECT_EQ(decode_graph_buckets(8), (std::vector<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(decode_graph_buckets(1), (std::vector<int32_t>{1}));
  const std::vector<int32_t> b = decode_graph_buckets(300);
  EXPECT_EQ(b.front(), 1);
  EXPECT_EQ(b.back(), 300);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(std::count(b.begin(), b.end(), 288), 1);
}

TEST(StepPlan, OnlyPureDecodeStepsGetABucket) {
  const std::vector<int32_t> buckets = decode_graph_buckets(8);
  const ForwardBatch decode3 = batch_of({slice(0, 1, 3, {0}), slice(1, 1, 4, {1}), slice(2, 1, 5, {2})});
  EXPECT_EQ(choose_graph_bucket(decode3, buckets, 0), 4);
  EXPECT_EQ(choose_graph_bucket(decode3, buckets, 2), 0) << "over max_graph_batch";
  EXPECT_EQ(choose_graph_bucket(batch_of({slice(0, 2, 3, {0})}), buckets, 0), 0) << "a prefill chunk";
  EXPECT_EQ(choose_graph_bucket(batch_of({slice(0, 1, 3, {0}, false, false)}), buckets, 0), 0)
      << "no logits wanted";
  std::vector<SequenceSlice> nine;
  for (int32_t s = 0; s < 9; ++s) nine.push_back(slice(s, 1, 1, {s}));
  EXPECT_EQ(choose_graph_bucket(batch_of(nine), buckets, 0), 0) << "more than max_num_seqs";
  EXPECT_EQ(choose_graph_bucket(ForwardBatch{}, buckets, 0), 0);
}

TEST(StepPlan, MetadataArraysAreAlignedAndInsideTheRegion) {
  const StepLayout layout{1000, 33, 17};
  const size_t bytes = step_metadata_bytes(layout);
  alignas(256) static char region[1 << 16];
  ASSERT_LE(bytes, sizeof region);
  const StepMetadata m = bind_step_metadata(region, layout);
  const char* end = region + bytes;
  for (const void* p : {static_cast<const void*>(m.token_ids), static_cast<const void*>(m.positions),
                        static_cast<const void*>(m.slots), static_cast<const void*>(m.token_sequence),
                        static_cast<const void*>(m.kv_begin), static_cast<const void*>(m.kv_end),
                        static_cast<const void*>(m.logit_rows), static_cast<const void*>(m.block_tables)}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    EXPECT_LT(static_cast<const char*>(p), end);
  }
  EXPECT_LE(reinterpret_cast<const char*>(m.block_tables + 33 * 17), end);
  EXPECT_LE(reinterpret_cast<const char*>(m.slots + 1000), reinterpret_cast<const char*>(m.token_sequence));
}

}  // namespace
}  // namespace pagoda::cuda
