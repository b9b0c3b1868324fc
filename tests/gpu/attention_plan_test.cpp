// PagedAttentionPlan on the host: validation messages, the arena layout, the
// decode split choice and the prefill tile order. Needs no GPU (label unit).

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "pagoda/backend/cuda/attention/attention_batch.h"
#include "pagoda/backend/cuda/attention/attention_plan.h"

namespace pagoda::kernels::cuda {
namespace {

AttentionConfig gqa_config(int32_t num_blocks = 100000) {
  return AttentionConfig{32, 8, 128, 16, num_blocks, 0.0f, KvElement::kBF16};
}

// Sequences with tables [0, 1, 2, ...) long enough for their lengths.
struct Batch {
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSequence> sequences;
  Batch(const std::vector<std::pair<int32_t, int32_t>>& new_and_cached, int32_t block_size = 16) {
    tables.reserve(new_and_cached.size());
    int32_t next = 0;
    for (auto [n, c] : new_and_cached) {
      const int32_t blocks = (n + c + block_size - 1) / block_size;
      tables.emplace_back(blocks);
      std::iota(tables.back().begin(), tables.back().end(), next);
      next += blocks;
    }
    for (size_t i = 0; i < tables.size(); ++i)
      sequences.push_back({new_and_cached[i].first, new_and_cached[i].second, tables[i]});
  }
};

void expect_error(const StatusOr<PagedAttentionPlan>& plan, StatusCode code,
                  const std::string& needle) {
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), code) << plan.status().to_string();
  EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().message();
}

TEST(AttentionPlanTest, RejectsBadShapesWithTheValueNamed) {
  Batch b({{1, 10}});
  auto c = gqa_config();
  c.num_kv_heads = 7;
  expect_error(PagedAttentionPlan::create(c, b.sequences), StatusCode::kInvalidArgument, "(7)");
  c = gqa_config();
  c.head_dim = 96;
  expect_error(PagedAttentionPlan::create(c, b.sequences), StatusCode::kUnimplemented, "96");
  c = gqa_config();
  c.block_size = 12;
  expect_error(PagedAttentionPlan::create(c, b.sequences), StatusCode::kInvalidArgument, "12");
  c = gqa_config();
  c.key_element = KvElement::kFP8E4M3;  // V stays bf16: no kernel mixes the two
  expect_error(PagedAttentionPlan::create(c, b.sequences), StatusCode::kUnimplemented, "V bf16");
  expect_error(PagedAttentionPlan::create(gqa_config(), {}), StatusCode::kInvalidArgument,
               "no sequences");
}

TEST(AttentionPlanTest, QuantizedKvPlansDecodeAndRefusesPrefill) {
  Batch decode({{1, 10}, {1, 300}});
  for (auto [k, v] : {std::pair{KvElement::kFP8E4M3, KvElement::kFP8E4M3}, {KvElement::kInt8, KvElement::kInt8},
                      {KvElement::kInt4, KvElement::kInt4}, {KvElement::kInt8, KvElement::kInt4}}) {
    auto c = gqa_config();
    c.key_element = k;
    c.value_element = v;
    auto plan = PagedAttentionPlan::create(c, decode.sequences);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->kernel(), AttentionKernel::kDecode);
    int32_t scales[2] = {0, 0};
    const AttentionDescriptor d = plan->descriptor(nullptr, PagedKvPointers{nullptr, nullptr, &scales[0], &scales[1]},
                                                   nullptr);
    EXPECT_EQ(d.key_element, k);
    EXPECT_EQ(d.value_element, v);
    EXPECT_EQ(d.key_scale, &scales[0]);
    EXPECT_EQ(d.value_scale, &scales[1]);
    c.head_dim = 64;
    EXPECT_TRUE(PagedAttentionPlan::create(c, decode.sequences).ok());
    c.head_dim = 256;
    expect_error(PagedAttentionPlan::create(c, decode.sequences), StatusCode::kUnimplemented, "head_dim 256");
  }
  auto c = gqa_config();
  c.key_element = c.value_element = KvElement::kInt8;
  Batch prefill({{5, 10}, {1, 300}});
  expect_error(PagedAttentionPlan::create(c, prefill.sequences), StatusCode::kUnimplemented, "only in decode");
  AttentionPlanOptions force;
  force.force_prefill = true;
  expect_error(PagedAttentionPlan::create(c, decode.sequences, {}, force), StatusCode::kUnimplemented,
               "only in decode");
  c.key_element = KvElement::kInt4;  // K int4 with V int8 has no kernel
  expect_error(PagedAttentionPlan::create(c, decode.sequences), StatusCode::kUnimplemented, "K int4 / V int8");
}

TEST(AttentionPlanTest, RejectsBadSequences) {
  Batch b({{1, 10}, {3, 40}});
  auto seqs = b.sequences;
  seqs[1].num_new_tokens = 0;
  expect_error(PagedAttentionPlan::create(gqa_config(), seqs), StatusCode::kInvalidArgument,
               "sequence 1 has num_new_tokens 0");
  seqs = b.sequences;
  seqs[1].num_cached_tokens = 50;  // 53 positions need 4 blocks, table has 3
  expect_error(PagedAttentionPlan::create(gqa_config(), seqs), StatusCode::kInvalidArgument,
               "needs 4 blocks");
  std::vector<int32_t> bad_table = {0, 99};
  seqs = b.sequences;
  seqs[0] = {1, 20, bad_table};
  expect_error(PagedAttentionPlan::create(gqa_config(50), seqs), StatusCode::kInvalidArgument,
               "block_table[1] = 99");
}

TEST(AttentionPlanTest, DecodeArenaAndForcedSplits) {
  Batch b({{1, 0}, {1, 700}, {1, 255}});  // lengths 1, 701, 256
  auto plan = PagedAttentionPlan::create(gqa_config(), b.sequences, {}, {256, false, false});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->kernel(), AttentionKernel::kDecode);
  EXPECT_EQ(plan->num_tokens(), 3);
  EXPECT_EQ(plan->num_work_items(), 1 + 3 + 1);
  EXPECT_EQ(plan->max_splits(), 3);
  EXPECT_EQ(plan->workspace_bytes() % 256, 0u);
  EXPECT_GE(plan->workspace_bytes(), 5u * 32 * 129 * sizeof(float));

  // Interpret the arena through a descriptor whose "device" arena is the host copy.
  const auto arena = plan->arena();
  const auto d = plan->descriptor(arena.data(), {}, nullptr);
  EXPECT_EQ(d.q_heads_per_cta, 4);
  EXPECT_EQ(d.block_size, 16);
  EXPECT_EQ(d.log2_block_size, 4);
  EXPECT_EQ(d.token_stride, 8 * 128);
  EXPECT_EQ(d.block_stride, 16 * 8 * 128);
  EXPECT_FLOAT_EQ(d.scale, 1.0f / std::sqrt(128.0f));
  EXPECT_EQ(std::vector<int32_t>(d.query_start, d.query_start + 4), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(d.kv_length, d.kv_length + 3), (std::vector<int32_t>{1, 701, 256}));
  for (int32_t s = 0; s < 3; ++s) {
    const int32_t* table = d.block_tables + d.block_table_start[s];
    for (size_t j = 0; j < b.tables[s].size(); ++j) EXPECT_EQ(table[j], b.tables[s][j]);
    // The splits of sequence s tile [0, length) in order.
    int32_t expect_begin = 0;
    for (int32_t item = d.split_start[s]; item < d.split_start[s + 1]; ++item) {
      EXPECT_EQ(d.work_items[3 * item], s);
      EXPECT_EQ(d.work_items[3 * item + 1], expect_begin);
      EXPECT_GT(d.work_items[3 * item + 2], expect_begin);
      expect_begin = d.work_items[3 * item + 2];
    }
    EXPECT_EQ(expect_begin, d.kv_length[s]);
  }
}

TEST(AttentionPlanTest, AutomaticSplitFillsTheGpuOnlyWhenNeeded) {
  auto uniform = [](int32_t batch, int32_t length) {
    return Batch(std::vector<std::pair<int32_t, int32_t>>(batch, {1, length - 1}));
  };
  Batch few_long = uniform(8, 32768);
  auto plan = PagedAttentionPlan::create(gqa_config(1 << 20), few_long.sequences, {132});
  ASSERT_TRUE(plan.ok());
  EXPECT_GE(plan->max_splits(), 4);  // 64 CTAs unsplit would leave most SMs idle
  Batch many_short = uniform(256, 1024);
  plan = PagedAttentionPlan::create(gqa_config(1 << 20), many_short.sequences, {132});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->max_splits(), 1);
  EXPECT_EQ(plan->workspace_bytes(), 0u);
}

TEST(AttentionPlanTest, AutomaticSplitSizesUnitsByBytesNotPositions) {
  // B=8 L=32K, GQA 32/8 on 132 SMs: bf16 fills two waves of 2 CTAs per SM
  // (split 4096: 8 x 8 x 8 = 512 units); codes of a byte or less (fp8, int8,
  // int4) read half the bytes per position or less, so their units are twice
  // as long (one wave, 256); the mixed K int8 / V int4 pair keeps two.
  Batch few_long(std::vector<std::pair<int32_t, int32_t>>(8, {1, 32767}));
  AttentionConfig c = gqa_config(1 << 20);
  auto bf16 = PagedAttentionPlan::create(c, few_long.sequences, {132});
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->max_splits(), 8);
  for (KvElement e : {KvElement::kFP8E4M3, KvElement::kInt8, KvElement::kInt4}) {
    c.key_element = c.value_element = e;
    auto one_byte = PagedAttentionPlan::create(c, few_long.sequences, {132});
    ASSERT_TRUE(one_byte.ok());
    EXPECT_EQ(one_byte->max_splits(), 4);
    EXPECT_EQ(one_byte->num_work_items(), 8 * 4);
  }
  c.key_element = KvElement::kInt8;  // V stays int4: the CUDA-core loop, at about bf16's time
  auto mixed = PagedAttentionPlan::create(c, few_long.sequences, {132});
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->max_splits(), 8);
}

TEST(AttentionPlanTest, PrefillTilesCoverEveryTokenOnceHeaviestFirst) {
  Batch b({{37, 0}, {1, 20}, {200, 45}, {129, 300}});
  auto plan = PagedAttentionPlan::create(gqa_config(), b.sequences);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->kernel(), AttentionKernel::kPrefillSm90);  // head_dim 128: wgmma
  auto portable = PagedAttentionPlan::create(gqa_config(), b.sequences, {}, {0, false, true});
  ASSERT_TRUE(portable.ok());
  EXPECT_EQ(portable->kernel(), AttentionKernel::kPrefill);
  const auto d = plan->descriptor(plan->arena().data(), {}, nullptr);
  EXPECT_EQ(d.tokens_per_tile, 32);  // 128 rows / 4 query heads per KV head
  std::set<std::pair<int32_t, int32_t>> covered;
  int64_t previous_cost = INT64_MAX;
  for (int32_t i = 0; i < d.num_work_items; ++i) {
    const int32_t s = d.work_items[2 * i], first = d.work_items[2 * i + 1];
    const int32_t num_new = b.sequences[s].num_new_tokens;
    const int64_t cost = b.sequences[s].num_cached_tokens + std::min(num_new, first + 32);
    EXPECT_LE(cost, previous_cost);
    previous_cost = cost;
    for (int32_t t = first; t < std::min(num_new, first + 32); ++t)
      EXPECT_TRUE(covered.insert({s, t}).second);
  }
  EXPECT_EQ(covered.size(), 37u + 1 + 200 + 129);
}

TEST(AttentionPlanTest, PrefillRejectsHeadDim256) {
  Batch b({{5, 0}});
  auto c = gqa_config();
  c.head_dim = 256;
  expect_error(PagedAttentionPlan::create(c, b.sequences), StatusCode::kUnimplemented, "256");
  // ... but decode runs it.
  Batch decode({{1, 5}});
  EXPECT_TRUE(PagedAttentionPlan::create(c, decode.sequences).ok());
}

TEST(AttentionPlanTest, ForwardBatchRowsAreThePlansQueryRows) {
  ForwardBatch batch;
  batch.token_ids = {5, 6, 7, 8};
  batch.positions = {30, 31, 32, 9};
  batch.sequences.push_back({0, 3, 30, {4, 1, 2}, false, true});  // 3 new after 30 cached (mid-block)
  batch.sequences.push_back({3, 1, 9, {7}, false, true});      // a decode
  const auto sequences = attention_sequences(batch);
  ASSERT_EQ(sequences.size(), 2u);
  EXPECT_EQ(sequences[0].num_new_tokens, 3);
  EXPECT_EQ(sequences[0].num_cached_tokens, 30);
  EXPECT_EQ(sequences[1].block_table[0], 7);
  auto plan = PagedAttentionPlan::create(gqa_config(8), sequences);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->num_tokens(), batch.num_tokens());
  EXPECT_EQ(plan->kernel(), AttentionKernel::kPrefillSm90);  // mixed batch: prefill kernel
}

}  // namespace
}  // namespace pagoda::kernels::cuda
