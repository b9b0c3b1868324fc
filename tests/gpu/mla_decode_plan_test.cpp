// MlaDecodePlan (backend/cuda/attention/mla_decode.h) without a GPU: every bad
// parameter is refused with the field named, and the schedule covers every
// row's positions exactly once, in tile-aligned segments, over about one wave.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <numeric>
#include <string>
#include <cstdlib>
#include <vector>

#include "pagoda/backend/cuda/attention/mla_decode.h"
#include "pagoda/backend/cuda/attention/mla_decode_tma_fp8_ring.h"

namespace pagoda::kernels::cuda {
namespace {

MlaDecodeConfig config(int32_t heads = 16, int32_t block_size = 16, int32_t num_blocks = 1000) {
  return MlaDecodeConfig{heads, block_size, num_blocks, 0.1f, KvElement::kBF16};
}

std::vector<int32_t> table(int32_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  return t;
}

void expect_error(const MlaDecodeConfig& c, const std::vector<MlaDecodeRow>& rows, const std::string& needle,
                  MlaDecodeOptions options = {}) {
  auto plan = MlaDecodePlan::create(c, rows, {}, options);
  ASSERT_FALSE(plan.ok()) << needle;
  EXPECT_NE(std::string(plan.status().message()).find(needle), std::string::npos) << plan.status().message();
}

TEST(MlaDecodePlanTest, RefusesBadParameters) {
  const auto t = table(10);
  const std::vector<MlaDecodeRow> one{{100, t}};
  auto c = config();
  c.num_heads = 0;
  expect_error(c, one, "num_heads 0");
  c = config();
  c.block_size = 0;
  expect_error(c, one, "block_size 0");
  c = config();
  c.num_blocks = 0;
  expect_error(c, one, "num_blocks 0");
  c = config();
  c.scale = 0.0f;
  expect_error(c, one, "scale");
  c = config();
  c.latent_element = KvElement::kInt8;
  expect_error(c, one, "latent_element");
  expect_error(config(), {{0, t}}, "rows[0].context_len 0");
  expect_error(config(), {{100, t}, {161, t}}, "rows[1].block_table has 10 ids");
  std::vector<int32_t> bad = t;
  bad[3] = 1000;
  expect_error(config(), {{100, bad}}, "rows[0].block_table[3] = 1000");
  bad[3] = -1;
  expect_error(config(), {{100, bad}}, "rows[0].block_table[3] = -1");
  expect_error(config(), one, "split_tokens -1", MlaDecodeOptions{-1});
  c = config();
  c.latent_layout = MlaLatentLayout::kFlashMla656;
  expect_error(c, one, "latent_layout flashmla_656 needs latent_element fp8");
  c.latent_element = KvElement::kFP8E4M3;
  c.num_heads = 128;  // the wide kernel reads the records too
  EXPECT_TRUE(MlaDecodePlan::create(c, one, AttentionDeviceInfo{4}).ok());
  c.num_heads = 16;
  EXPECT_TRUE(MlaDecodePlan::create(c, one, AttentionDeviceInfo{4}).ok());
  EXPECT_EQ(MlaDecodePlan::create(c, one, AttentionDeviceInfo{4})->descriptor(nullptr, nullptr, nullptr, nullptr)
                .latent_layout,
            MlaLatentLayout::kFlashMla656);
  // Swizzled pages: bf16 only, pages of whole 8-row swizzle atoms.
  c = config();
  c.latent_layout = MlaLatentLayout::kBf16SwizzledPages;
  c.latent_element = KvElement::kFP8E4M3;
  expect_error(c, one, "latent_layout bf16_swizzled_pages needs latent_element bf16");
  c.latent_element = KvElement::kBF16;
  c.block_size = 12;
  expect_error(c, {{100, table(9)}}, "bf16_swizzled_pages needs block_size % 8 == 0, got 12");
  c.latent_layout = static_cast<MlaLatentLayout>(7);
  c.block_size = 16;
  expect_error(c, one, "latent_layout 7 unknown");
}

TEST(MlaDecodePlanTest, EmptyBatchPlansNothing) {
  auto plan = MlaDecodePlan::create(config(), {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_ctas(), 0);
  EXPECT_EQ(plan->workspace_bytes(), 0u);
}

// Every row's [0, context_len) is covered once by its segments, in order, cut at
// multiples of 64; CTAs list consecutive segments.
void check_cover(const MlaDecodePlan& plan, const std::vector<MlaDecodeRow>& rows) {
  const auto a = plan.arena();
  const int32_t segs = plan.num_segments();
  const int32_t* row_start = a.data() + 3 * segs;
  const int32_t* cta_start = row_start + rows.size() + 1;
  EXPECT_EQ(cta_start[0], 0);
  EXPECT_EQ(cta_start[plan.num_ctas()], segs);
  for (int32_t c = 0; c < plan.num_ctas(); ++c) EXPECT_LT(cta_start[c], cta_start[c + 1]);
  for (size_t r = 0; r < rows.size(); ++r) {
    int32_t pos = 0;
    for (int32_t s = row_start[r]; s < row_start[r + 1]; ++s) {
      EXPECT_EQ(a[3 * s], int32_t(r));
      EXPECT_EQ(a[3 * s + 1], pos);
      EXPECT_EQ(pos % 64, 0);
      EXPECT_GT(a[3 * s + 2], pos);
      pos = a[3 * s + 2];
    }
    EXPECT_EQ(pos, rows[r].context_len);
  }
}

TEST(MlaDecodePlanTest, AutomaticScheduleFillsOneWave) {
  const auto t = table(256);
  std::vector<MlaDecodeRow> rows(64, MlaDecodeRow{4096, t});
  auto plan = MlaDecodePlan::create(config(16, 16, 1000), rows, AttentionDeviceInfo{132});
  ASSERT_TRUE(plan.ok());
  check_cover(*plan, rows);
  EXPECT_LE(plan->num_ctas(), 133);
  EXPECT_GE(plan->num_ctas(), 120);
  EXPECT_GT(plan->workspace_bytes(), 0u);
  // 128 heads: two head tiles, so half the CTAs per tile.
  auto wide = MlaDecodePlan::create(config(128, 16, 1000), rows, AttentionDeviceInfo{132});
  ASSERT_TRUE(wide.ok());
  check_cover(*wide, rows);
  EXPECT_LE(wide->num_ctas(), 67);
  // Ragged short rows.
  std::vector<MlaDecodeRow> ragged;
  for (int32_t i = 1; i < 300; i += 7) ragged.push_back({i, t});
  auto r = MlaDecodePlan::create(config(16, 16, 1000), ragged, AttentionDeviceInfo{13});
  ASSERT_TRUE(r.ok());
  check_cover(*r, ragged);
  EXPECT_LE(r->num_ctas(), 14);
}

// The most tiles and segments any CTA of an automatic plan runs.
std::pair<int32_t, int32_t> heaviest_cta(const MlaDecodePlan& plan) {
  const auto a = plan.arena();
  const int32_t* cta_start = a.data() + 3 * plan.num_segments() + plan.num_rows() + 1;
  int32_t tiles = 0, segments = 0;
  for (int32_t c = 0; c < plan.num_ctas(); ++c) {
    int32_t t = 0;
    for (int32_t s = cta_start[c]; s < cta_start[c + 1]; ++s) t += (a[3 * s + 2] - a[3 * s + 1] + 63) / 64;
    tiles = std::max(tiles, t);
    segments = std::max(segments, cta_start[c + 1] - cta_start[c]);
  }
  return {tiles, segments};
}

TEST(MlaDecodePlanTest, SpreadBudgetUsesEverySm) {
  const auto t = table(600);
  MlaDecodeOptions spread;
  spread.spread_budget = true;
  for (const auto& [n, len] : {std::pair{64, 4096}, std::pair{8, 32768}}) {
    std::vector<MlaDecodeRow> rows(size_t(n), MlaDecodeRow{len, t});
    auto whole = MlaDecodePlan::create(config(16, 64, 1000), rows, AttentionDeviceInfo{132});
    auto even = MlaDecodePlan::create(config(16, 64, 1000), rows, AttentionDeviceInfo{132}, spread);
    ASSERT_TRUE(whole.ok() && even.ok());
    check_cover(*whole, rows);
    check_cover(*even, rows);
    // Whole budgets of 33 tiles (32 + a segment) fill 128 CTAs; spread, all 132
    // run, none more than 32 tiles.
    EXPECT_EQ(whole->num_ctas(), 128) << n << " x " << len;
    EXPECT_EQ(even->num_ctas(), 132) << n << " x " << len;
    EXPECT_EQ(heaviest_cta(*whole).first, 32) << n << " x " << len;
    EXPECT_LE(heaviest_cta(*even).first, 32) << n << " x " << len;
    EXPECT_LE(heaviest_cta(*even).second, 2) << n << " x " << len;
  }
  // Ragged rows on few SMs, a graph plan: covered, within the wave.
  std::vector<MlaDecodeRow> ragged;
  for (int32_t i = 1; i < 3000; i += 77) ragged.push_back({i, t});
  auto r = MlaDecodePlan::create(config(16, 16, 1000), ragged, AttentionDeviceInfo{13}, spread);
  ASSERT_TRUE(r.ok());
  check_cover(*r, ragged);
  EXPECT_LE(r->num_ctas(), 13);
  MlaDecodeOptions fixed = spread;
  fixed.fixed_rows = 64;
  fixed.fixed_block_table_stride = 600;
  auto g = MlaDecodePlan::create(config(16, 16, 1000), ragged, AttentionDeviceInfo{132}, fixed);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->descriptor(nullptr, nullptr, nullptr, nullptr).num_ctas, 132);
}

TEST(MlaDecodePlanTest, PairKernelsScheduleTwoCtasPerSm) {
  // kTmaPair / kTmaPairTile run two CTAs an SM: the wave is 2 x num_sms; a plan
  // that falls back to cp.async (fp8) keeps one an SM.
  const auto t = table(600);
  std::vector<MlaDecodeRow> rows(64, MlaDecodeRow{4096, t});
  for (MlaDecodeKernel k : {MlaDecodeKernel::kTmaPair, MlaDecodeKernel::kTmaPairTile}) {
    MlaDecodeOptions o;
    o.kernel = k;
    auto plan = MlaDecodePlan::create(config(16, 64, 1000), rows, AttentionDeviceInfo{132}, o);
    ASSERT_TRUE(plan.ok());
    check_cover(*plan, rows);
    EXPECT_GT(plan->num_ctas(), 132);
    EXPECT_LE(plan->num_ctas(), 264);
    EXPECT_LE(heaviest_cta(*plan).first, 16);
    auto fp8 = config(16, 64, 1000);
    fp8.latent_element = KvElement::kFP8E4M3;
    auto fallback = MlaDecodePlan::create(fp8, rows, AttentionDeviceInfo{132}, o);
    ASSERT_TRUE(fallback.ok());
    EXPECT_EQ(fallback->kernel(), MlaDecodeKernel::kCpAsync);
    EXPECT_LE(fallback->num_ctas(), 132);
    o.fixed_rows = 8;
    o.fixed_block_table_stride = 100;
    const std::vector<MlaDecodeRow> few{{4000, t}, {1, t}, {77, t}};
    auto g = MlaDecodePlan::create(config(16, 64, 1000), few, AttentionDeviceInfo{132}, o);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->descriptor(nullptr, nullptr, nullptr, nullptr).num_ctas, 264);
  }
}

TEST(MlaDecodePlanTest, PingPongSplitHasTwoRecordsASegmentAndAlwaysMerges) {
  // kTmaPingPongSplit: each compute warpgroup writes its own record, so the
  // workspace holds 2 x num_segments records and the merge pass runs even when
  // no row is split; the other kernels keep one record a segment.
  const auto t = table(100);
  const std::vector<MlaDecodeRow> rows{{100, t}, {700, t}};  // one segment each (one SM)
  const size_t record = 16 * (512 + 1) * sizeof(float);
  MlaDecodeOptions o;
  o.kernel = MlaDecodeKernel::kTmaPingPong;
  auto one = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{1}, o);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->num_segments(), 2);
  EXPECT_EQ(one->max_splits(), 1);
  EXPECT_EQ(one->workspace_bytes(), 0u);
  EXPECT_EQ(one->descriptor(nullptr, nullptr, nullptr, nullptr).partials_per_segment, 1);
  o.kernel = MlaDecodeKernel::kTmaPingPongSplit;
  auto two = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{1}, o);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->kernel(), MlaDecodeKernel::kTmaPingPongSplit);
  ASSERT_EQ(two->num_segments(), 2);
  EXPECT_EQ(two->workspace_bytes(), 2 * 2 * record);
  EXPECT_EQ(two->descriptor(nullptr, nullptr, nullptr, nullptr).partials_per_segment, 2);
  // Split rows (splits of 128 tokens: 1 + 6 segments) and a fixed plan (capacity: rows + CTAs).
  MlaDecodeOptions s;
  s.split_tokens = 128;
  s.kernel = o.kernel;
  auto split = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{1}, s);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->workspace_bytes(), size_t(split->num_segments()) * 2 * record);
  o.fixed_rows = 4;
  o.fixed_block_table_stride = 100;
  auto fixed = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{1}, o);
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->workspace_bytes(), size_t(4 + 1) * 2 * record);
  // A fallback to cp.async (fp8) has one record a segment again.
  auto fp8 = config(16, 64);
  fp8.latent_element = KvElement::kFP8E4M3;
  o.fixed_rows = 0;
  auto fallback = MlaDecodePlan::create(fp8, rows, AttentionDeviceInfo{1}, o);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->kernel(), MlaDecodeKernel::kCpAsync);
  EXPECT_EQ(fallback->workspace_bytes(), 0u);
}

TEST(MlaDecodePlanTest, FixedSplitsAndSharedTables) {
  const auto t = table(100);
  std::vector<MlaDecodeRow> rows{{1, t}, {1000, t}, {1600, t}};
  auto plan = MlaDecodePlan::create(config(), rows, {}, MlaDecodeOptions{100});
  ASSERT_TRUE(plan.ok());
  check_cover(*plan, rows);
  EXPECT_EQ(plan->num_segments(), 1 + 8 + 13);  // splits of 128
  EXPECT_EQ(plan->num_ctas(), plan->num_segments());
  EXPECT_EQ(plan->max_splits(), 13);
  // One table copy serves the three rows (the longest row's length of it).
  EXPECT_EQ(plan->arena().size(), size_t(3 * 22 + 4 + 23 + 3 + 100));
}

TEST(MlaDecodePlanTest, FixedModeDescriptorIsTheSameForEveryStep) {
  const auto t = table(300);
  MlaDecodeOptions o;
  o.fixed_rows = 8;
  o.fixed_block_table_stride = 300;
  const std::vector<MlaDecodeRow> a{{4000, t}, {1, t}, {77, t}};
  const std::vector<MlaDecodeRow> b{{5, t}, {1000, t}, {64, t}, {129, t}, {4800, t}, {2, t}, {3, t}, {4, t}};
  auto pa = MlaDecodePlan::create(config(), a, AttentionDeviceInfo{132}, o);
  auto pb = MlaDecodePlan::create(config(), b, AttentionDeviceInfo{132}, o);
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(pa->arena().size(), pb->arena().size());
  EXPECT_EQ(pa->workspace_bytes(), pb->workspace_bytes());
  int32_t arena = 0;
  float workspace = 0;
  const auto da = pa->descriptor(&arena, &arena, nullptr, &workspace);
  const auto db = pb->descriptor(&arena, &arena, nullptr, &workspace);
  EXPECT_EQ(da.num_rows, db.num_rows);
  EXPECT_EQ(da.num_heads, db.num_heads);
  EXPECT_EQ(da.block_size, db.block_size);
  EXPECT_EQ(da.num_ctas, db.num_ctas);
  EXPECT_EQ(da.num_segments, db.num_segments);
  EXPECT_EQ(da.max_splits, db.max_splits);
  EXPECT_EQ(da.scale_log2, db.scale_log2);
  EXPECT_EQ(da.segments, db.segments);
  EXPECT_EQ(da.row_segment_start, db.row_segment_start);
  EXPECT_EQ(da.cta_segment_start, db.cta_segment_start);
  EXPECT_EQ(da.block_table_start, db.block_table_start);
  EXPECT_EQ(da.block_tables, db.block_tables);
  EXPECT_EQ(da.num_rows, 8);
  EXPECT_EQ(da.num_ctas, 132);
  EXPECT_GE(da.max_splits, 2);
  // Padding rows (3..7 of a) have no segments; every real row is covered once.
  const auto ar = pa->arena();
  const int32_t* row_start = ar.data() + 3 * da.num_segments;
  const int32_t* cta_start = row_start + 9;
  for (int r = 3; r < 8; ++r) EXPECT_EQ(row_start[r], row_start[r + 1]);
  EXPECT_EQ(cta_start[0], 0);
  EXPECT_EQ(cta_start[132], row_start[8]);
  for (size_t r = 0; r < a.size(); ++r) {
    int32_t pos = 0;
    for (int32_t s = row_start[r]; s < row_start[r + 1]; ++s) {
      EXPECT_EQ(ar[3 * s], int32_t(r));
      EXPECT_EQ(ar[3 * s + 1], pos);
      pos = ar[3 * s + 2];
    }
    EXPECT_EQ(pos, a[r].context_len);
  }
  // Refusals name the field.
  expect_error(config(), b, "more than fixed_rows 4", MlaDecodeOptions{0, 4, 300});
  expect_error(config(), a, "more than fixed_block_table_stride 10", MlaDecodeOptions{0, 8, 10});
  expect_error(config(), a, "split_tokens 64 with fixed_rows", MlaDecodeOptions{64, 8, 300});
  expect_error(config(), a, "fixed_block_table_stride 0", MlaDecodeOptions{0, 8, 0});
}

// Tables in the runner's device memory (fixed_block_tables): the arena stops
// before them, everything before is the embedded plan's, and the descriptor
// points the kernels at the runner's copy with row i at i x stride.
TEST(MlaDecodePlanTest, FixedModeExternalBlockTables) {
  const auto t = table(2600);
  MlaDecodeOptions o;
  o.fixed_rows = 8;
  o.fixed_block_table_stride = 2560;  // a 163,840-token context in blocks of 64
  const std::vector<MlaDecodeRow> rows{{4000, t}, {1, t}, {77, t}, {163840, t}};
  auto embedded = MlaDecodePlan::create(config(16, 64, 4000), rows, AttentionDeviceInfo{132}, o);
  MlaDecodeOptions x = o;
  const auto* tables = reinterpret_cast<const int32_t*>(uintptr_t{0x400000});
  x.fixed_block_tables = tables;
  auto external = MlaDecodePlan::create(config(16, 64, 4000), rows, AttentionDeviceInfo{132}, x);
  ASSERT_TRUE(embedded.ok() && external.ok()) << external.status().to_string();
  auto* base = reinterpret_cast<int32_t*>(uintptr_t{0x1000});
  const auto de = embedded->descriptor(base, nullptr, nullptr, nullptr);
  const auto dx = external->descriptor(base, nullptr, nullptr, nullptr);
  EXPECT_EQ(dx.block_tables, tables);
  const size_t tables_at = size_t(de.block_tables - base);
  ASSERT_EQ(external->arena().size(), tables_at);
  EXPECT_EQ(embedded->arena().size(), tables_at + 8 * 2560);
  for (size_t i = 0; i < tables_at; ++i) ASSERT_EQ(external->arena()[i], embedded->arena()[i]) << "entry " << i;
  for (size_t r = 0; r < rows.size(); ++r) EXPECT_EQ(external->arena()[size_t(dx.block_table_start - base) + r], int32_t(r * 2560));
  EXPECT_EQ(dx.segments, de.segments);
  EXPECT_EQ(dx.row_segment_start, de.row_segment_start);
  EXPECT_EQ(dx.cta_segment_start, de.cta_segment_start);
  EXPECT_EQ(dx.block_table_start, de.block_table_start);
  EXPECT_EQ(external->workspace_bytes(), embedded->workspace_bytes());
  // Only fixed plans take them.
  MlaDecodeOptions eager;
  eager.fixed_block_tables = tables;
  expect_error(config(16, 64, 4000), rows, "fixed_block_tables is for fixed mode", eager);
}

TEST(MlaDecodePlanTest, KernelChoice) {
  // The TMA kernel where it applies (bf16, <= 16 heads, blocks of 8 / 16 / 32 /
  // multiples of 64), cp.async elsewhere; the descriptor carries the choice.
  const auto t = table(100);
  const std::vector<MlaDecodeRow> one{{100, t}};
  MlaDecodeOptions o;
  o.kernel = MlaDecodeKernel::kTma;
  auto kernel_of = [&](MlaDecodeConfig c) {
    auto plan = MlaDecodePlan::create(c, one, {}, o);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    if (!plan.ok()) return MlaDecodeKernel::kDefault;
    EXPECT_EQ(plan->descriptor(nullptr, nullptr, nullptr, nullptr).kernel, plan->kernel());
    EXPECT_EQ(plan->descriptor(nullptr, nullptr, nullptr, nullptr).num_blocks, c.num_blocks);
    return plan->kernel();
  };
  for (int32_t bs : {8, 16, 32, 64, 128, 192}) EXPECT_EQ(kernel_of(config(16, bs)), MlaDecodeKernel::kTma) << bs;
  EXPECT_EQ(kernel_of(config(1, 64)), MlaDecodeKernel::kTma);
  for (int32_t bs : {1, 3, 4, 48, 100}) EXPECT_EQ(kernel_of(config(16, bs)), MlaDecodeKernel::kCpAsync) << bs;
  EXPECT_EQ(kernel_of(config(17, 64)), MlaDecodeKernel::kCpAsync);
  auto fp8 = config(16, 64);
  fp8.latent_element = KvElement::kFP8E4M3;
  EXPECT_EQ(kernel_of(fp8), MlaDecodeKernel::kCpAsync);
  o.kernel = MlaDecodeKernel::kCpAsync;
  EXPECT_EQ(kernel_of(config(16, 64)), MlaDecodeKernel::kCpAsync);
  // The automatic choice (PAGODA_MLA_DECODE_KERNEL unset): TMA at pages of a
  // multiple of 64, cp.async for smaller pages, fp8 and more than 16 heads.
  const char* env = std::getenv("PAGODA_MLA_DECODE_KERNEL");
  if (env == nullptr || *env == '\0') {
    o.kernel = MlaDecodeKernel::kDefault;
    for (int32_t bs : {64, 128})
      EXPECT_EQ(kernel_of(config(16, bs)), MlaDecodeKernel::kTmaPingPongTwoChains) << bs;
    for (int32_t bs : {8, 16, 32, 48}) EXPECT_EQ(kernel_of(config(16, bs)), MlaDecodeKernel::kCpAsync) << bs;
    EXPECT_EQ(kernel_of(config(17, 64)), MlaDecodeKernel::kCpAsync);
    EXPECT_EQ(kernel_of(fp8), MlaDecodeKernel::kCpAsync);
  }
  // The whole-tile, two-CTA, ping-pong and fast-exp variants: the same domain.
  for (MlaDecodeKernel k : {MlaDecodeKernel::kTmaTile, MlaDecodeKernel::kTmaPair,
                            MlaDecodeKernel::kTmaPairTile, MlaDecodeKernel::kTmaPingPong, MlaDecodeKernel::kTmaFastExp,
                            MlaDecodeKernel::kTmaPingPongFastExp, MlaDecodeKernel::kTmaPingPongTurns,
                            MlaDecodeKernel::kTmaPingPongTwoChains, MlaDecodeKernel::kTmaPingPongAll,
                            MlaDecodeKernel::kTmaPingPongSplit, MlaDecodeKernel::kTmaPingPongSplitTwoChains}) {
    o.kernel = k;
    for (int32_t bs : {8, 16, 64, 128}) EXPECT_EQ(kernel_of(config(16, bs)), k) << bs;
    for (int32_t bs : {1, 48}) EXPECT_EQ(kernel_of(config(16, bs)), MlaDecodeKernel::kCpAsync) << bs;
    EXPECT_EQ(kernel_of(fp8), MlaDecodeKernel::kCpAsync);
  }
  // kTmaFp8: FlashMLA's fp8 records only, at most 16 heads, pages of a
  // multiple of 16 positions or dividing 16; the bf16 variants never take them.
  auto flash = [&](int32_t heads, int32_t bs) {
    auto c = config(heads, bs);
    c.latent_element = KvElement::kFP8E4M3;
    c.latent_layout = MlaLatentLayout::kFlashMla656;
    return c;
  };
  o.kernel = MlaDecodeKernel::kTmaFp8;
  for (int32_t bs : {1, 2, 4, 8, 16, 32, 48, 64, 128})
    EXPECT_EQ(kernel_of(flash(16, bs)), MlaDecodeKernel::kTmaFp8) << bs;
  for (int32_t bs : {3, 24, 100}) EXPECT_EQ(kernel_of(flash(16, bs)), MlaDecodeKernel::kCpAsync) << bs;
  EXPECT_EQ(kernel_of(flash(17, 64)), MlaDecodeKernel::kCpAsync);
  EXPECT_EQ(kernel_of(fp8), MlaDecodeKernel::kCpAsync);  // per-vector scales
  EXPECT_EQ(kernel_of(config(16, 64)), MlaDecodeKernel::kCpAsync);  // bf16
  o.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
  EXPECT_EQ(kernel_of(flash(16, 64)), MlaDecodeKernel::kCpAsync);
  o.kernel = MlaDecodeKernel::kCpAsync;
  EXPECT_EQ(kernel_of(flash(16, 64)), MlaDecodeKernel::kCpAsync);  // the old path stays selectable
  if (env == nullptr || *env == '\0') {
    // Automatic: FlashMLA records take kTmaFp8 at pages of a multiple of 16 (measured faster there),
    // cp.async at smaller or other pages and above 16 heads.
    o.kernel = MlaDecodeKernel::kDefault;
    for (int32_t bs : {16, 32, 48, 64, 128}) EXPECT_EQ(kernel_of(flash(16, bs)), MlaDecodeKernel::kTmaFp8) << bs;
    for (int32_t bs : {1, 8, 24}) EXPECT_EQ(kernel_of(flash(16, bs)), MlaDecodeKernel::kCpAsync) << bs;
    EXPECT_EQ(kernel_of(flash(8, 64)), MlaDecodeKernel::kTmaFp8);
    EXPECT_EQ(kernel_of(flash(17, 64)), MlaDecodeKernel::kCpAsync);
    EXPECT_EQ(kernel_of(fp8), MlaDecodeKernel::kCpAsync);  // per-vector scales
  }
  // Swizzled bf16 pages: the tensor-map kernels' boxes read token-major rows, so every TMA request takes the
  // cp.async kernels, whose loads follow the page layout; the descriptor carries it. The automatic choice takes
  // the bulk-copy kernel at pages of a multiple of 64 (the tensor-map kernel's rule), else cp.async.
  auto swizzled = [&](int32_t heads, int32_t bs) {
    auto c = config(heads, bs);
    c.latent_layout = MlaLatentLayout::kBf16SwizzledPages;
    return c;
  };
  for (MlaDecodeKernel k : {MlaDecodeKernel::kTma, MlaDecodeKernel::kTmaPingPongTwoChains, MlaDecodeKernel::kTmaPair,
                            MlaDecodeKernel::kTmaPingPongSplitTwoChains, MlaDecodeKernel::kTmaFp8,
                            MlaDecodeKernel::kCpAsync, MlaDecodeKernel::kDefault}) {
    if (k == MlaDecodeKernel::kDefault && env != nullptr && *env != '\0') continue;  // the environment's choice
    o.kernel = k;
    for (int32_t bs : {8, 16, 64, 128}) {
      const MlaDecodeKernel expected = k == MlaDecodeKernel::kDefault && bs % 64 == 0
                                           ? MlaDecodeKernel::kBulkPingPongTwoChains
                                           : MlaDecodeKernel::kCpAsync;
      EXPECT_EQ(kernel_of(swizzled(16, bs)), expected) << bs << " " << static_cast<int>(k);
      auto plan = MlaDecodePlan::create(swizzled(16, bs), one, {}, o);
      ASSERT_TRUE(plan.ok());
      EXPECT_EQ(plan->descriptor(nullptr, nullptr, nullptr, nullptr).latent_layout,
                MlaLatentLayout::kBf16SwizzledPages);
    }
    EXPECT_EQ(kernel_of(swizzled(128, 64)), MlaDecodeKernel::kCpAsync);
  }
  // The bulk kernel: swizzled bf16 pages only, at most 16 heads, the tensor-map kernels' block sizes.
  o.kernel = MlaDecodeKernel::kBulkPingPongTwoChains;
  for (int32_t bs : {8, 16, 32, 64, 128, 192}) EXPECT_EQ(kernel_of(swizzled(16, bs)), o.kernel) << bs;
  for (int32_t bs : {24, 48, 40}) EXPECT_EQ(kernel_of(swizzled(16, bs)), MlaDecodeKernel::kCpAsync) << bs;
  EXPECT_EQ(kernel_of(swizzled(17, 64)), MlaDecodeKernel::kCpAsync);
  EXPECT_EQ(kernel_of(config(16, 64)), MlaDecodeKernel::kCpAsync);  // token-major
  EXPECT_EQ(kernel_of(fp8), MlaDecodeKernel::kCpAsync);
  EXPECT_EQ(kernel_of(flash(16, 64)), MlaDecodeKernel::kCpAsync);
  EXPECT_TRUE(is_tma_kernel(o.kernel));
  EXPECT_EQ(mla_decode_partials_per_segment(o.kernel), 1);
  o.kernel = static_cast<MlaDecodeKernel>(99);
  expect_error(config(), one, "kernel 99 unknown", o);
  // The removed 23-slot ring variants' numbers (docs/KERNELS.md v17).
  for (int removed : {3, 5, 9}) {
    o.kernel = static_cast<MlaDecodeKernel>(removed);
    expect_error(config(), one, "kernel " + std::to_string(removed) + " unknown", o);
  }
}

TEST(MlaDecodePlanTest, AutomaticKernelAtSmallPagesFollowsTheCardsBandwidth) {
  // Pages of 16 and 32 positions: the tensor-map kernel (bulk kernel on swizzled
  // pages) on a card below 4 TB/s peak (measured faster on the H100), cp.async on a
  // faster card (measured faster on the H200) and on a card of unknown bandwidth.
  // Pages of 8, other formats and more than 16 heads are not affected.
  const char* env = std::getenv("PAGODA_MLA_DECODE_KERNEL");
  if (env != nullptr && *env != '\0') GTEST_SKIP() << "PAGODA_MLA_DECODE_KERNEL=" << env;
  const auto t = table(100);
  const std::vector<MlaDecodeRow> one{{100, t}};
  const AttentionDeviceInfo h100{132, 3352.3}, h200{132, 4915.2}, unknown{132, 0.0};
  auto kernel_on = [&](MlaDecodeConfig c, const AttentionDeviceInfo& device) {
    auto plan = MlaDecodePlan::create(c, one, device);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    return plan.ok() ? plan->kernel() : MlaDecodeKernel::kDefault;
  };
  auto swizzled = [](int32_t heads, int32_t bs) {
    auto c = config(heads, bs);
    c.latent_layout = MlaLatentLayout::kBf16SwizzledPages;
    return c;
  };
  for (int32_t bs : {16, 32}) {
    EXPECT_EQ(kernel_on(config(16, bs), h100), MlaDecodeKernel::kTmaPingPongTwoChains) << bs;
    EXPECT_EQ(kernel_on(swizzled(16, bs), h100), MlaDecodeKernel::kBulkPingPongTwoChains) << bs;
    for (const auto& fast_or_unknown : {h200, unknown}) {
      EXPECT_EQ(kernel_on(config(16, bs), fast_or_unknown), MlaDecodeKernel::kCpAsync) << bs;
      EXPECT_EQ(kernel_on(swizzled(16, bs), fast_or_unknown), MlaDecodeKernel::kCpAsync) << bs;
    }
    EXPECT_EQ(kernel_on(config(17, bs), h100), MlaDecodeKernel::kCpAsync) << bs;
    auto fp8 = config(16, bs);
    fp8.latent_element = KvElement::kFP8E4M3;
    EXPECT_EQ(kernel_on(fp8, h100), MlaDecodeKernel::kCpAsync) << bs;
  }
  for (const auto& device : {h100, h200, unknown}) {
    EXPECT_EQ(kernel_on(config(16, 8), device), MlaDecodeKernel::kCpAsync);
    EXPECT_EQ(kernel_on(config(16, 48), device), MlaDecodeKernel::kCpAsync);
    EXPECT_EQ(kernel_on(config(16, 64), device), MlaDecodeKernel::kTmaPingPongTwoChains);
    EXPECT_EQ(kernel_on(swizzled(16, 64), device), MlaDecodeKernel::kBulkPingPongTwoChains);
  }
  // A bandwidth that is not a number is refused with the field named.
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    auto plan = MlaDecodePlan::create(config(16, 16), one, AttentionDeviceInfo{132, bad});
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_NE(std::string(plan.status().message()).find("peak_dram_gbps"), std::string::npos);
  }
}

// kTmaFp8's staging ring (mla_decode_tma_fp8_ring.h): mbarrier waits name a
// phase by parity, so each barrier's phases must be waited for in order by
// readers that see every one of them. Over a CTA's use sequence: every use of
// a barrier is read by the same compute group (the reader never skips a
// phase), the producer's empty wait before reusing a slot names the barrier of
// that slot's previous use and reaches each barrier's uses in order, and one
// barrier per (group, slot) is enough. A barrier a slot (the scheme before)
// fails the first property.
TEST(MlaDecodePlanTest, TmaFp8RingBarriersAreWaitedPhaseByPhase) {
  using namespace tma_fp8_ring;
  constexpr int kUses = 40 * kRingSlots * kSlotsPerTile;
  auto readers_fixed = [&](auto barrier_of) {
    std::vector<int> reader(64, -1);
    for (int idx = 0; idx < kUses; ++idx) {
      int& r = reader[size_t(barrier_of(idx))];
      if (r >= 0 && r != ring_group(idx)) return false;
      r = ring_group(idx);
    }
    return true;
  };
  EXPECT_TRUE(readers_fixed([](int idx) { return ring_barrier(idx); }));
  EXPECT_FALSE(readers_fixed([](int idx) { return ring_slot(idx); }));  // one pair a slot: phases skipped

  std::vector<int> released(kBarriers, 0), waited(kBarriers, 0);  // per barrier: uses released / waited by the producer
  std::vector<std::vector<int>> uses(kBarriers);
  for (int idx = 0; idx < kUses; ++idx) {
    const int b = ring_barrier(idx);
    ASSERT_GE(b, 0);
    ASSERT_LT(b, kBarriers);
    EXPECT_EQ(b % kRingSlots, ring_slot(idx));
    if (idx >= kRingSlots) {
      // The producer waits for the slot's previous use, which must be that barrier's next unwaited phase.
      const int prev = ring_barrier(idx - kRingSlots);
      EXPECT_EQ(ring_slot(idx - kRingSlots), ring_slot(idx));
      EXPECT_EQ(uses[size_t(prev)][size_t(waited[size_t(prev)])], idx - kRingSlots) << idx;
      ++waited[size_t(prev)];
    }
    uses[size_t(b)].push_back(idx);
    ++released[size_t(b)];
  }
  // Every barrier is used, and all but each slot's last kRingSlots uses were waited for.
  int pending = 0;
  for (int b = 0; b < kBarriers; ++b) {
    EXPECT_GT(released[size_t(b)], 0) << b;
    pending += released[size_t(b)] - waited[size_t(b)];
  }
  EXPECT_EQ(pending, kRingSlots);
}

TEST(MlaDecodePlanTest, FusedMergeWhereTheGridIsResidentAndRowsSplit) {
  // The folded merge (MlaMergeMode::kFused): the ping-pong kernels with a hand-over, a grid of at most one CTA
  // per SM, and some row split (or a fixed plan, whose merge always runs); two zeroed counters a row in the
  // arena, which the descriptor points at. Elsewhere the plan keeps the merge pass.
  const auto t = table(200);
  const std::vector<MlaDecodeRow> rows{{4000, t}, {3000, t}, {70, t}};
  MlaDecodeOptions o;
  o.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
  o.merge = MlaMergeMode::kPass;
  auto pass = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{132}, o);
  o.merge = MlaMergeMode::kFused;
  auto fused = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{132}, o);
  ASSERT_TRUE(pass.ok() && fused.ok());
  ASSERT_GT(fused->max_splits(), 1);
  EXPECT_FALSE(pass->fused_merge());
  EXPECT_TRUE(fused->fused_merge());
  EXPECT_EQ(fused->workspace_bytes(), pass->workspace_bytes());  // the records are still written
  ASSERT_EQ(fused->arena().size(), pass->arena().size() + 2 * rows.size());
  std::vector<int32_t> arena(fused->arena().begin(), fused->arena().end());
  float workspace = 0;
  const auto d = fused->descriptor(arena.data(), nullptr, nullptr, &workspace);
  EXPECT_TRUE(d.fused_merge);
  ASSERT_NE(d.merge_counters, nullptr);
  for (size_t i = 0; i < 2 * rows.size(); ++i) EXPECT_EQ(d.merge_counters[i], 0) << i;
  EXPECT_EQ(d.merge_counters, d.cta_segment_start + d.num_ctas + 1);  // after the CTA starts
  EXPECT_FALSE(pass->descriptor(arena.data(), nullptr, nullptr, &workspace).fused_merge);
  // The bulk kernel folds it in too; the split-record kernels, cp.async and the pair kernels (two CTAs an SM)
  // do not.
  MlaDecodeConfig swizzled = config(16, 64);
  swizzled.latent_layout = MlaLatentLayout::kBf16SwizzledPages;
  o.kernel = MlaDecodeKernel::kBulkPingPongTwoChains;
  EXPECT_TRUE(MlaDecodePlan::create(swizzled, rows, AttentionDeviceInfo{132}, o)->fused_merge());
  for (MlaDecodeKernel k : {MlaDecodeKernel::kTmaPingPongSplit, MlaDecodeKernel::kCpAsync, MlaDecodeKernel::kTma,
                            MlaDecodeKernel::kTmaPair}) {
    o.kernel = k;
    auto p = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{132}, o);
    ASSERT_TRUE(p.ok());
    EXPECT_FALSE(p->fused_merge()) << static_cast<int>(k);
    EXPECT_FALSE(p->descriptor(nullptr, nullptr, nullptr, nullptr).fused_merge) << static_cast<int>(k);
  }
  o.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
  // No row split (one SM's worth of work on many SMs): nothing to merge.
  const std::vector<MlaDecodeRow> short_rows{{64, t}, {128, t}};
  EXPECT_FALSE(MlaDecodePlan::create(config(16, 64), short_rows, AttentionDeviceInfo{132}, o)->fused_merge());
  // More CTAs than SMs (forced splits of 64 tokens: 63 + 47 + 2 segments on 100 SMs): a CTA could wait for one
  // that is not resident, so the merge pass stays.
  MlaDecodeOptions many = o;
  many.split_tokens = 64;
  auto over = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{100}, many);
  ASSERT_TRUE(over.ok());
  EXPECT_GT(over->num_ctas(), 100);
  EXPECT_FALSE(over->fused_merge());
  EXPECT_TRUE(MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{132}, many)->fused_merge());
  // A fixed plan folds it in whatever this step's splits (padding rows get their zeros there), its counters
  // sized by fixed_rows, so every plan of the same fixed shape has the same arena size.
  MlaDecodeOptions f = o;
  f.fixed_rows = 8;
  f.fixed_block_table_stride = 100;
  auto fixed_short = MlaDecodePlan::create(config(16, 64), short_rows, AttentionDeviceInfo{132}, f);
  auto fixed_long = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{132}, f);
  ASSERT_TRUE(fixed_short.ok() && fixed_long.ok());
  EXPECT_TRUE(fixed_short->fused_merge() && fixed_long->fused_merge());
  EXPECT_EQ(fixed_short->arena().size(), fixed_long->arena().size());
  f.merge = MlaMergeMode::kPass;
  EXPECT_EQ(MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{132}, f)->arena().size() + 16,
            fixed_long->arena().size());
  // An unknown mode is refused.
  o.merge = static_cast<MlaMergeMode>(7);
  expect_error(config(16, 64), rows, "merge mode 7", o);
}

TEST(MlaDecodePlanTest, PairedMergeWhereSplitRowsPairOnNeighbouringCtas) {
  // The folded merge by cluster pairs (MlaDecodePlan::paired_merge): every split row is two segments, the only
  // ones of CTAs 2i and 2i + 1; then the arena has no counters and the plan no workspace, and the descriptor
  // says paired_merge (not fused_merge, which would launch the counters' merge).
  const auto t = table(200);
  auto rows_of = [&](int n, int32_t len) { return std::vector<MlaDecodeRow>(size_t(n), MlaDecodeRow{len, t}); };
  struct Case {
    const char* name;
    std::vector<MlaDecodeRow> rows;
    int32_t block_size, heads, sms;
  };
  // The goal shape (64 x 4K on 132 SMs: 128 CTAs) and the GPU test's pairing cases.
  const Case paired[] = {{"64 x 4K", rows_of(64, 4096), 64, 16, 132},
                         {"8 x 4K", rows_of(8, 4096), 64, 16, 16},
                         {"bs16 ragged", rows_of(3, 2900), 16, 16, 6},
                         {"h8", rows_of(2, 2048), 64, 8, 4}};
  for (const Case& c : paired) {
    MlaDecodeOptions o;
    o.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
    o.merge = MlaMergeMode::kFused;
    auto p = MlaDecodePlan::create(config(c.heads, c.block_size), c.rows, AttentionDeviceInfo{c.sms}, o);
    o.merge = MlaMergeMode::kPass;
    auto pass = MlaDecodePlan::create(config(c.heads, c.block_size), c.rows, AttentionDeviceInfo{c.sms}, o);
    o.merge = MlaMergeMode::kFusedGlobal;
    auto global = MlaDecodePlan::create(config(c.heads, c.block_size), c.rows, AttentionDeviceInfo{c.sms}, o);
    ASSERT_TRUE(p.ok() && pass.ok() && global.ok()) << c.name;
    EXPECT_TRUE(p->fused_merge() && p->paired_merge()) << c.name;
    EXPECT_EQ(p->num_ctas(), 2 * int32_t(c.rows.size())) << c.name;
    EXPECT_EQ(p->workspace_bytes(), 0u) << c.name;
    EXPECT_EQ(p->arena().size(), pass->arena().size()) << c.name << ": no counters";
    const auto d = p->descriptor(nullptr, nullptr, nullptr, nullptr);
    EXPECT_TRUE(d.paired_merge && !d.fused_merge && d.merge_counters == nullptr) << c.name;
    // kFusedGlobal folds the same rows through the counters.
    EXPECT_TRUE(global->fused_merge() && !global->paired_merge()) << c.name;
    EXPECT_GT(global->workspace_bytes(), 0u) << c.name;
    EXPECT_FALSE(global->descriptor(nullptr, nullptr, nullptr, nullptr).paired_merge) << c.name;
    EXPECT_FALSE(pass->paired_merge()) << c.name;
    // The bulk kernel pairs too.
    MlaDecodeConfig swizzled = config(c.heads, c.block_size);
    swizzled.latent_layout = MlaLatentLayout::kBf16SwizzledPages;
    o.merge = MlaMergeMode::kFused;
    o.kernel = MlaDecodeKernel::kBulkPingPongTwoChains;
    EXPECT_TRUE(MlaDecodePlan::create(swizzled, c.rows, AttentionDeviceInfo{c.sms}, o)->paired_merge()) << c.name;
  }
  MlaDecodeOptions o;
  o.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
  o.merge = MlaMergeMode::kFused;
  // Not pairs: an odd number of CTAs (3 rows on 7 SMs), rows in 3 segments, a row ending mid-CTA, a fixed plan.
  const std::pair<const char*, std::vector<MlaDecodeRow>> unpaired[] = {
      {"rows of 3 segments", rows_of(2, 6000)}, {"ragged", {{4096, t}, {70, t}, {4096, t}}}};
  for (const auto& [name, rows] : unpaired) {
    auto p = MlaDecodePlan::create(config(16, 64), rows, AttentionDeviceInfo{6}, o);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_TRUE(p->fused_merge()) << name;
    EXPECT_FALSE(p->paired_merge()) << name;
    EXPECT_FALSE(p->descriptor(nullptr, nullptr, nullptr, nullptr).paired_merge) << name;
  }
  auto odd = MlaDecodePlan::create(config(16, 64), rows_of(3, 4096), AttentionDeviceInfo{7}, o);
  ASSERT_TRUE(odd.ok());
  EXPECT_FALSE(odd->paired_merge()) << odd->num_ctas() << " CTAs";
  MlaDecodeOptions f = o;
  f.fixed_rows = 64;
  f.fixed_block_table_stride = 100;
  auto fixed = MlaDecodePlan::create(config(16, 64), rows_of(64, 4096), AttentionDeviceInfo{132}, f);
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->fused_merge());
  EXPECT_FALSE(fixed->paired_merge());
  // tma_fp8 pairs too (its staging slots lent as the receive area).
  MlaDecodeConfig fp8 = config(16, 64);
  fp8.latent_element = KvElement::kFP8E4M3;
  fp8.latent_layout = MlaLatentLayout::kFlashMla656;
  o.kernel = MlaDecodeKernel::kTmaFp8;
  auto p8 = MlaDecodePlan::create(fp8, rows_of(64, 4096), AttentionDeviceInfo{132}, o);
  ASSERT_TRUE(p8.ok()) << p8.status().message();
  EXPECT_EQ(p8->kernel(), MlaDecodeKernel::kTmaFp8);
  EXPECT_TRUE(p8->fused_merge());
  EXPECT_TRUE(p8->paired_merge());
  // The split-record kernels, cp.async and the two-CTAs-an-SM kernels never pair (nor fold).
  for (MlaDecodeKernel k : {MlaDecodeKernel::kTmaPingPongSplit, MlaDecodeKernel::kCpAsync, MlaDecodeKernel::kTma,
                            MlaDecodeKernel::kTmaPair}) {
    o.kernel = k;
    auto p = MlaDecodePlan::create(config(16, 64), rows_of(64, 4096), AttentionDeviceInfo{132}, o);
    ASSERT_TRUE(p.ok());
    EXPECT_FALSE(p->paired_merge()) << static_cast<int>(k);
  }
  // PAGODA_MLA_MERGE's names: an unknown one is refused naming the three.
  o.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
  o.merge = static_cast<MlaMergeMode>(4);
  expect_error(config(16, 64), rows_of(2, 4096), "merge mode 4", o);
}

}  // namespace
}  // namespace pagoda::kernels::cuda
