// backend/cuda/attention's graph-mode decode plan (attention_plan.h), host only (label
// unit): the descriptor a CUDA graph captures must not change between steps of
// a bucket, while the arena carries each step's lengths, splits and tables.

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cuda/attention/attention_plan.h"

namespace pagoda::kernels::cuda {
namespace {

AttentionConfig llama_shape() {
  AttentionConfig c;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.block_size = 16;
  c.num_blocks = 1 << 16;
  return c;
}

struct Step {
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSequence> sequences;
};

// Decode sequences of the given lengths (cached + 1), each with its own blocks.
Step decode_step(const std::vector<int32_t>& lengths, int32_t block_size, int32_t first_block = 0) {
  Step step;
  step.tables.resize(lengths.size());
  int32_t next = first_block;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int32_t blocks = (lengths[i] + block_size - 1) / block_size;
    for (int32_t b = 0; b < blocks; ++b) step.tables[i].push_back(next++);
  }
  for (size_t i = 0; i < lengths.size(); ++i) step.sequences.push_back({1, lengths[i] - 1, step.tables[i]});
  return step;
}

AttentionPlanOptions graph_options(int32_t sequences, int32_t stride) {
  AttentionPlanOptions o;
  o.graph_sequences = sequences;
  o.graph_block_table_stride = stride;
  return o;
}

bool same_descriptor(const AttentionDescriptor& a, const AttentionDescriptor& b) {
  return a.kernel == b.kernel && a.num_sequences == b.num_sequences && a.num_tokens == b.num_tokens &&
         a.query_start == b.query_start && a.kv_length == b.kv_length &&
         a.block_table_start == b.block_table_start && a.block_tables == b.block_tables &&
         a.work_items == b.work_items && a.num_work_items == b.num_work_items && a.split_start == b.split_start &&
         a.max_splits == b.max_splits && a.q_heads_per_cta == b.q_heads_per_cta && a.scale == b.scale;
}

TEST(AttentionGraphPlan, DescriptorIsTheSameForEveryStepOfABucket) {
  const AttentionConfig c = llama_shape();
  const int32_t bucket = 64, stride = 256;
  const auto* arena = reinterpret_cast<const int32_t*>(uintptr_t{0x10000});
  std::vector<AttentionDescriptor> seen;
  for (const std::vector<int32_t>& lengths :
       {std::vector<int32_t>{1}, std::vector<int32_t>(49, 4096), std::vector<int32_t>(64, 17),
        std::vector<int32_t>{4000, 3, 2049, 1000, 256, 257}}) {
    const Step step = decode_step(lengths, c.block_size);
    auto plan = PagedAttentionPlan::create(c, step.sequences, {}, graph_options(bucket, stride));
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_TRUE(plan->graph_mode());
    EXPECT_EQ(plan->kernel(), AttentionKernel::kDecode);
    EXPECT_EQ(plan->num_tokens(), bucket);
    EXPECT_EQ(plan->num_work_items(), PagedAttentionPlan::graph_work_item_capacity(c, bucket));
    EXPECT_EQ(plan->workspace_bytes(), PagedAttentionPlan::graph_workspace_bytes(c, bucket));
    EXPECT_GT(plan->max_splits(), 1) << "the merge pass must be in the graph";
    seen.push_back(plan->descriptor(arena, {}, nullptr));
  }
  for (const AttentionDescriptor& d : seen) EXPECT_TRUE(same_descriptor(d, seen.front()));
}

TEST(AttentionGraphPlan, ArenaHoldsRealItemsThenPaddingThenUnusedItems) {
  const AttentionConfig c = llama_shape();
  const int32_t bucket = 8, stride = 8;
  const Step step = decode_step({100, 33, 1}, c.block_size, 5);
  AttentionPlanOptions options = graph_options(bucket, stride);
  options.split_tokens = 64;  // sequence 0 splits in 2, sequence 1 in 1
  auto plan = PagedAttentionPlan::create(c, step.sequences, {}, options);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const auto* base = reinterpret_cast<const int32_t*>(uintptr_t{0x1000});
  const AttentionDescriptor d = plan->descriptor(base, {}, nullptr);
  const std::span<const int32_t> a = plan->arena();
  auto at = [&](const int32_t* p, int32_t i) { return a[static_cast<size_t>(p - base) + static_cast<size_t>(i)]; };
  for (int32_t i = 0; i <= bucket; ++i) EXPECT_EQ(at(d.query_start, i), i);
  EXPECT_EQ(at(d.kv_length, 0), 100);
  EXPECT_EQ(at(d.kv_length, 1), 33);
  EXPECT_EQ(at(d.kv_length, 2), 1);
  for (int32_t i = 3; i < bucket; ++i) EXPECT_EQ(at(d.kv_length, i), 0);
  for (int32_t i = 0; i <= bucket; ++i) EXPECT_EQ(at(d.block_table_start, i), i * stride);
  // Work items (sequence, begin, end): 0 split at 64, then 1, 2, padding 3..7, then unused.
  const std::vector<std::vector<int32_t>> want = {{0, 0, 64}, {0, 64, 100}, {1, 0, 33}, {2, 0, 1}, {3, 0, 0},
                                                  {4, 0, 0},  {5, 0, 0},    {6, 0, 0},  {7, 0, 0}};
  for (size_t i = 0; i < want.size(); ++i)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(at(d.work_items, static_cast<int32_t>(3 * i) + k), want[i][k]) << i;
  for (int32_t i = static_cast<int32_t>(want.size()); i < d.num_work_items; ++i)
    EXPECT_EQ(at(d.work_items, 3 * i), -1) << "unused item " << i;
  const std::vector<int32_t> split_start = {0, 2, 3, 4, 5, 6, 7, 8, 9};
  for (int32_t i = 0; i <= bucket; ++i) EXPECT_EQ(at(d.split_start, i), split_start[static_cast<size_t>(i)]);
  // Block tables last, one stride per sequence (only the step's sequences are copied).
  EXPECT_EQ(static_cast<size_t>(d.block_tables - base) + 3u * stride, a.size());
  EXPECT_EQ(plan->arena_capacity_bytes(), (static_cast<size_t>(d.block_tables - base) + bucket * stride) * 4);
  for (size_t s = 0; s < step.tables.size(); ++s)
    for (size_t b = 0; b < step.tables[s].size(); ++b)
      EXPECT_EQ(at(d.block_tables, static_cast<int32_t>(s * stride + b)), step.tables[s][b]);
}

// Tables in the runner's device memory (graph_block_tables): the arena stops
// before them, everything else in it is the embedded plan's, and the kernels
// read the tables at the runner's pointer with the same per-sequence starts.
TEST(AttentionGraphPlan, ExternalBlockTablesLeaveTheArenaAndKeepEverythingElse) {
  const AttentionConfig c = llama_shape();
  const int32_t bucket = 64, stride = 8192;  // a 131,072-token context in blocks of 16
  const auto* tables = reinterpret_cast<const int32_t*>(uintptr_t{0x400000});
  const auto* base = reinterpret_cast<const int32_t*>(uintptr_t{0x1000});
  std::vector<AttentionDescriptor> seen;
  for (const std::vector<int32_t>& lengths :
       {std::vector<int32_t>{100, 33, 1}, std::vector<int32_t>(64, 1500), std::vector<int32_t>{131072, 7}}) {
    const Step step = decode_step(lengths, c.block_size);
    auto embedded = PagedAttentionPlan::create(c, step.sequences, {}, graph_options(bucket, stride));
    AttentionPlanOptions options = graph_options(bucket, stride);
    options.graph_block_tables = tables;
    auto external = PagedAttentionPlan::create(c, step.sequences, {}, options);
    ASSERT_TRUE(embedded.ok() && external.ok()) << external.status().to_string();
    const AttentionDescriptor de = embedded->descriptor(base, {}, nullptr);
    const AttentionDescriptor dx = external->descriptor(base, {}, nullptr);
    EXPECT_EQ(dx.block_tables, tables);
    const size_t tables_at = static_cast<size_t>(de.block_tables - base);
    ASSERT_EQ(external->arena().size(), tables_at) << "the arena ends where embedded tables would start";
    EXPECT_EQ(external->arena_capacity_bytes(), tables_at * sizeof(int32_t));
    for (size_t i = 0; i < tables_at; ++i) ASSERT_EQ(external->arena()[i], embedded->arena()[i]) << "entry " << i;
    for (int32_t i = 0; i <= bucket; ++i) EXPECT_EQ(external->arena()[size_t(dx.block_table_start - base) + i], i * stride);
    EXPECT_EQ(dx.query_start, de.query_start);
    EXPECT_EQ(dx.work_items, de.work_items);
    EXPECT_EQ(dx.split_start, de.split_start);
    EXPECT_EQ(dx.num_work_items, de.num_work_items);
    seen.push_back(dx);
  }
  for (const AttentionDescriptor& d : seen) EXPECT_TRUE(same_descriptor(d, seen.front()));

  // Only graph plans take them.
  const Step step = decode_step({10}, c.block_size);
  AttentionPlanOptions eager;
  eager.graph_block_tables = tables;
  auto refused = PagedAttentionPlan::create(c, step.sequences, {}, eager);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("graph_block_tables"), std::string::npos) << refused.status().to_string();
}

// The same split as an eager plan of the same sequences, so graph replay and
// eager launches compute the same bits.
TEST(AttentionGraphPlan, SplitsLikeTheEagerPlan) {
  const AttentionConfig c = llama_shape();
  for (const std::vector<int32_t>& lengths :
       {std::vector<int32_t>{4096}, std::vector<int32_t>(8, 1500), std::vector<int32_t>{77, 5000, 3, 1024}}) {
    const Step step = decode_step(lengths, c.block_size);
    auto eager = PagedAttentionPlan::create(c, step.sequences);
    auto graph = PagedAttentionPlan::create(c, step.sequences, {}, graph_options(16, 512));
    ASSERT_TRUE(eager.ok() && graph.ok());
    const auto* base = reinterpret_cast<const int32_t*>(uintptr_t{0x1000});
    const AttentionDescriptor de = eager->descriptor(base, {}, nullptr);
    const AttentionDescriptor dg = graph->descriptor(base, {}, nullptr);
    for (int32_t i = 0; i < eager->num_work_items() * 3; ++i)
      EXPECT_EQ(eager->arena()[static_cast<size_t>(de.work_items - base + i)],
                graph->arena()[static_cast<size_t>(dg.work_items - base + i)]);
  }
}

TEST(AttentionGraphPlan, CapacityHoldsTheWorstCaseSplit) {
  // Many long sequences and one short: the automatic split must stay in capacity.
  AttentionConfig c = llama_shape();
  c.num_q_heads = 8;
  c.num_kv_heads = 8;  // MHA: 1 head per CTA, 8 head tiles
  for (int32_t n : {1, 2, 3, 31, 32}) {
    std::vector<int32_t> lengths(static_cast<size_t>(n), 257);
    lengths[0] = 32768;
    const Step step = decode_step(lengths, c.block_size);
    auto plan = PagedAttentionPlan::create(c, step.sequences, {}, graph_options(32, 2048));
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->num_work_items(), PagedAttentionPlan::graph_work_item_capacity(c, 32));
  }
  // A forced tiny split grows until the items fit.
  const Step step = decode_step({32768, 32768}, c.block_size);
  AttentionPlanOptions options = graph_options(2, 2048);
  options.split_tokens = 16;
  auto plan = PagedAttentionPlan::create(c, step.sequences, {}, options);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
}

TEST(AttentionGraphPlan, RejectsWhatAGraphCannotReplay) {
  const AttentionConfig c = llama_shape();
  const Step three = decode_step({10, 20, 30}, c.block_size);
  auto too_many = PagedAttentionPlan::create(c, three.sequences, {}, graph_options(2, 8));
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("graph_sequences 2"), std::string::npos) << too_many.status().to_string();

  auto long_table = PagedAttentionPlan::create(c, decode_step({200}, c.block_size).sequences, {}, graph_options(4, 8));
  ASSERT_FALSE(long_table.ok());
  EXPECT_NE(long_table.status().message().find("graph_block_table_stride 8"), std::string::npos)
      << long_table.status().to_string();

  std::vector<int32_t> table = {0, 1};
  const std::vector<AttentionSequence> prefill = {{5, 10, table}};
  auto not_decode = PagedAttentionPlan::create(c, prefill, {}, graph_options(4, 8));
  ASSERT_FALSE(not_decode.ok());
  EXPECT_NE(not_decode.status().message().find("num_new_tokens 5"), std::string::npos)
      << not_decode.status().to_string();

  auto bad_stride = PagedAttentionPlan::create(c, three.sequences, {}, graph_options(4, 0));
  EXPECT_FALSE(bad_stride.ok());
}

}  // namespace
}  // namespace pagoda::kernels::cuda
