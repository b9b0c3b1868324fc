// Token eviction (runtime/kv_compression.h) on the CPU backend:
//  - the policy arithmetic: flag/field errors, kept-token selection, per-head budgets;
//  - the attention kernel: holes are skipped exactly (attention over the kept
//    tokens only), scores are the attention distribution;
//  - the runner's compaction moves each head's kept vectors, in order;
//  - through the engine with the bundled model: at full budget every policy's
//    output is identical to none; under a budget the cache is compacted, blocks
//    never leak, a compressed sequence never enters the prefix cache, and a
//    failed compaction fails the request and frees everything; compressed sequences go through
//    preemption by swap without errors or leaks.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bundled_model.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/delegating_model_runner.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda {
namespace {

using runtime::KvCompressionConfig;
using runtime::KvCompressionPolicy;

const KvCompressionPolicy kPolicies[] = {KvCompressionPolicy::kStreaming, KvCompressionPolicy::kH2O,
                                         KvCompressionPolicy::kSnapKV, KvCompressionPolicy::kPyramidKV,
                                         KvCompressionPolicy::kEntropy};

KvCompressionConfig config_of(KvCompressionPolicy p, int32_t budget, int32_t sinks = 4, int32_t window = 8) {
  KvCompressionConfig c;
  c.policy = p;
  c.budget = budget;
  c.sink_tokens = sinks;
  c.window = window;
  return c;
}

// ---- policy arithmetic ----

TEST(KvCompressionPolicyTest, BadSettingsNameTheFlagOrField) {
  auto bad = runtime::parse_kv_compression_policy("lru", "--kv-compression");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--kv-compression 'lru'"), std::string::npos);
  Status small = runtime::validate_kv_compression(config_of(KvCompressionPolicy::kSnapKV, 12, 4, 8), "--kv-");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.message().find("--kv-budget 12 must exceed --kv-sink-tokens + --kv-window"), std::string::npos)
      << small.message();
  Status field = runtime::validate_kv_compression(config_of(KvCompressionPolicy::kH2O, 3), "kv_compression.");
  ASSERT_FALSE(field.ok());
  EXPECT_EQ(field.message().rfind("kv_compression.budget", 0), 0u) << field.message();
  Status orphan = runtime::validate_kv_compression(config_of(KvCompressionPolicy::kNone, 64), "--kv-");
  ASSERT_FALSE(orphan.ok());
  EXPECT_NE(orphan.message().find("--kv-compression is none"), std::string::npos);
  EXPECT_FALSE(runtime::validate_kv_compression(config_of(KvCompressionPolicy::kH2O, 64, -1), "--kv-").ok());
  EXPECT_TRUE(runtime::validate_kv_compression(config_of(KvCompressionPolicy::kH2O, 13), "--kv-").ok());
  for (int32_t span : {-1, runtime::kMaxKvSpan + 1}) {
    KvCompressionConfig c = config_of(KvCompressionPolicy::kSnapKV, 64);
    c.span = span;
    Status s = runtime::validate_kv_compression(c, "--kv-");
    ASSERT_FALSE(s.ok()) << span;
    EXPECT_EQ(s.message().rfind("--kv-span must be in [0, 256]", 0), 0u) << s.message();
  }
}

TEST(KvCompressionPolicyTest, TheSpanCarriesAScoreForwardWithItsDecay) {
  std::vector<float> s = {0.0f, 2.0f, 0.0f, 0.0f, 0.0f, 1.5f, 0.0f};
  runtime::kv_span_scores(s, 2);
  const float d1 = runtime::kKvSpanDecay, d2 = d1 * d1;
  EXPECT_EQ(s, (std::vector<float>{0.0f, 2.0f, d1 * 2.0f, d2 * 2.0f, 0.0f, 1.5f, d1 * 1.5f}));
  // Carried from the unspanned scores, not from scores it raised itself (no compounding chain).
  std::vector<float> chain = {1.0f, 0.0f, 0.0f, 0.0f};
  runtime::kv_span_scores(chain, 1);
  EXPECT_EQ(chain, (std::vector<float>{1.0f, d1, 0.0f, 0.0f}));
  std::vector<float> off = {0.0f, 3.0f, 0.0f};
  runtime::kv_span_scores(off, 0);
  EXPECT_EQ(off, (std::vector<float>{0.0f, 3.0f, 0.0f}));
}

TEST(KvCompressionPolicyTest, WithASpanSnapKvKeepsWhatFollowsAnAttendedToken) {
  // One attended token (index 20) among 40; 10 tokens chosen by score.
  std::vector<float> peak(40, 0.0f);
  peak[20] = 7.0f;
  KvCompressionConfig snap = config_of(KvCompressionPolicy::kSnapKV, 15, 2, 3);
  snap.span = 16;
  std::vector<int32_t> want = {0, 1};
  for (int32_t i = 17; i <= 26; ++i) want.push_back(i);  // the pooled 17..23, then 24, 25, 26 by the span
  for (int32_t i = 37; i < 40; ++i) want.push_back(i);
  EXPECT_EQ(runtime::select_kept_tokens(snap, 15, 40, peak), want);
  // span 0: SnapKV's pooling alone; the 3 other choices are zero-score ties, won by the most recent.
  snap.span = 0;
  want = {0, 1};
  for (int32_t i = 17; i <= 23; ++i) want.push_back(i);
  for (int32_t i = 34; i < 40; ++i) want.push_back(i);
  EXPECT_EQ(runtime::select_kept_tokens(snap, 15, 40, peak), want);
  // h2o does not pool, so it has no span either.
  KvCompressionConfig h2o = config_of(KvCompressionPolicy::kH2O, 15, 2, 3);
  h2o.span = 16;
  want = {0, 1, 20};
  for (int32_t i = 28; i < 40; ++i) want.push_back(i);
  EXPECT_EQ(runtime::select_kept_tokens(h2o, 15, 40, peak), want);
}

TEST(KvCompressionPolicyTest, SelectionKeepsSinksWindowAndTheHighestScores) {
  const KvCompressionConfig h2o = config_of(KvCompressionPolicy::kH2O, 8, 2, 3);
  std::vector<float> scores(20, 0.0f);
  scores[5] = 3.0f;
  scores[9] = 2.0f;
  scores[10] = 1.0f;
  scores[18] = 9.0f;  // inside the window anyway
  EXPECT_EQ(runtime::select_kept_tokens(h2o, 8, 20, scores), (std::vector<int32_t>{0, 1, 5, 9, 10, 17, 18, 19}));
  // Streaming ignores scores: sinks + the most recent.
  const KvCompressionConfig stream = config_of(KvCompressionPolicy::kStreaming, 8, 2, 3);
  EXPECT_EQ(runtime::select_kept_tokens(stream, 8, 20, scores),
            (std::vector<int32_t>{0, 1, 14, 15, 16, 17, 18, 19}));
  // Within budget: everything, in order.
  EXPECT_EQ(runtime::select_kept_tokens(h2o, 8, 6, {}), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  // SnapKV pools neighbours: a lone peak pulls in its neighbourhood.
  const KvCompressionConfig snap = config_of(KvCompressionPolicy::kSnapKV, 8, 2, 3);
  std::vector<float> peak(40, 0.0f);
  peak[20] = 7.0f;
  const std::vector<int32_t> kept = runtime::select_kept_tokens(snap, 8, 40, peak);
  ASSERT_EQ(kept.size(), 8u);
  for (size_t i = 2; i < 5; ++i) EXPECT_LE(std::abs(kept[i] - 20), 3) << kept[i];
  // Without pooling (h2o) the peak alone is kept, the rest by recency of ties.
  EXPECT_EQ(runtime::select_kept_tokens(h2o, 8, 40, peak), (std::vector<int32_t>{0, 1, 20, 35, 36, 37, 38, 39}));
}

TEST(KvCompressionPolicyTest, PyramidBudgetsFallWithDepthAroundTheBudget) {
  const KvCompressionConfig c = config_of(KvCompressionPolicy::kPyramidKV, 100, 4, 8);
  const std::vector<int32_t> b = runtime::kv_head_budgets(c, 8, 2);
  ASSERT_EQ(b.size(), 16u);
  for (int32_t l = 1; l < 8; ++l) EXPECT_LE(b[l * 2], b[(l - 1) * 2]);
  EXPECT_EQ(b[0], 150);
  EXPECT_EQ(b[14], 50);
  EXPECT_NEAR(std::accumulate(b.begin(), b.end(), 0.0) / 16.0, 100.0, 1.0);
  EXPECT_EQ(runtime::kv_compaction_capacity(c, 8), 150);
}

TEST(KvCompressionPolicyTest, EntropyGivesFocusedHeadsFewerTokens) {
  const KvCompressionConfig c = config_of(KvCompressionPolicy::kEntropy, 100, 4, 8);
  const std::vector<float> entropy = {0.1f, 0.9f, 0.5f, 0.5f};
  const std::vector<int32_t> b = runtime::kv_head_budgets(c, 2, 2, entropy);
  EXPECT_LT(b[0], b[2]);
  EXPECT_LT(b[2], b[1]);
  EXPECT_EQ(b[2], b[3]);
  for (int32_t x : b) {
    EXPECT_GE(x, 12 + 44);  // sinks + window + half the mean's scored tokens (100 - 12)
    EXPECT_LE(x, 200);
  }
  EXPECT_LE(std::accumulate(b.begin(), b.end(), 0), 400);
}

// ---- the attention kernel ----

// Attention of one query row over `indices` of a contiguous K/V ([len, heads, D]).
std::vector<float> naive_attention(const float* q, const std::vector<float>& k, const std::vector<float>& v,
                                   const std::vector<int32_t>& indices, int32_t kv_heads, int32_t head, int32_t D,
                                   float scale, std::vector<float>* probs) {
  std::vector<float> s;
  for (int32_t i : indices) {
    float dot = 0.0f;
    for (int32_t d = 0; d < D; ++d) dot += q[d] * k[(static_cast<size_t>(i) * kv_heads + head) * D + d];
    s.push_back(dot * scale);
  }
  const float m = *std::max_element(s.begin(), s.end());
  float sum = 0.0f;
  for (float& x : s) sum += (x = std::exp(x - m));
  std::vector<float> out(D, 0.0f);
  for (size_t j = 0; j < indices.size(); ++j) {
    s[j] /= sum;
    for (int32_t d = 0; d < D; ++d) out[d] += s[j] * v[(static_cast<size_t>(indices[j]) * kv_heads + head) * D + d];
  }
  if (probs) *probs = s;
  return out;
}

TEST(KvEvictionKernelTest, HolesAreSkippedAndScoresAreTheAttentionDistribution) {
  const int32_t bs = 4, kv_heads = 2, q_heads = 4, D = 8, len = 23, blocks = 8;
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(len) * kv_heads * D), v(k.size()), q(3 * q_heads * D);
  for (float& x : k) x = n(rng);
  for (float& x : v) x = n(rng);
  for (float& x : q) x = n(rng);
  // NaN everywhere, then the written slots: a hole that were read would poison the output.
  std::vector<float> key_pool(static_cast<size_t>(blocks) * bs * kv_heads * D, std::nanf(""));
  std::vector<float> value_pool(key_pool.size(), std::nanf(""));
  const std::vector<int32_t> table = {5, 2, 7, 0, 3, 6};
  // Head 0 kept 6 of the 10-slot compacted region, head 1 kept 9; indices 10..22 are newer tokens.
  const int32_t compacted = 10;
  const int32_t kept[2] = {6, 9};
  for (int32_t i = 0; i < len; ++i)
    for (int32_t h = 0; h < kv_heads; ++h) {
      if (i >= kept[h] && i < compacted) continue;  // a hole: never written
      const size_t slot = static_cast<size_t>(table[i / bs]) * bs + i % bs;
      std::memcpy(&key_pool[(slot * kv_heads + h) * D], &k[(static_cast<size_t>(i) * kv_heads + h) * D], D * 4);
      std::memcpy(&value_pool[(slot * kv_heads + h) * D], &v[(static_cast<size_t>(i) * kv_heads + h) * D], D * 4);
    }
  kernels::PagedKvLayer layer{key_pool.data(), value_pool.data(), blocks, bs, kv_heads, D};
  std::vector<float> mass(2 * 32, 0.0f);
  std::vector<double> entropy_sum(2, 0.0);
  std::vector<int64_t> entropy_count(2, 0);
  kernels::PagedSequence seq{0, 3, len - 3, table, {}};
  seq.eviction.head_kept = kept;
  seq.eviction.compacted_length = compacted;
  seq.eviction.mass = mass.data();
  seq.eviction.mass_stride = 32;
  seq.eviction.entropy_sum = entropy_sum.data();
  seq.eviction.entropy_count = entropy_count.data();
  seq.eviction.score_from_index = len - 2;  // the last two queries score
  std::vector<float> out(q.size(), 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  kernels::paged_attention(q.data(), layer, std::span(&seq, 1), {q_heads, scale, 0}, out.data());

  std::vector<float> expected_mass(2 * 32, 0.0f);
  for (int32_t t = 0; t < 3; ++t) {
    const int32_t index = len - 3 + t;
    for (int32_t qh = 0; qh < q_heads; ++qh) {
      const int32_t h = qh / (q_heads / kv_heads);
      std::vector<int32_t> visible;
      for (int32_t i = 0; i <= index; ++i)
        if (i < kept[h] || i >= compacted) visible.push_back(i);
      std::vector<float> probs;
      const std::vector<float> ref =
          naive_attention(&q[(static_cast<size_t>(t) * q_heads + qh) * D], k, v, visible, kv_heads, h, D, scale, &probs);
      for (int32_t d = 0; d < D; ++d)
        EXPECT_NEAR(out[(static_cast<size_t>(t) * q_heads + qh) * D + d], ref[d], 1e-5f) << t << " " << qh;
      if (index >= len - 2)
        for (size_t j = 0; j < visible.size(); ++j) expected_mass[h * 32 + visible[j]] += probs[j];
    }
  }
  for (size_t i = 0; i < mass.size(); ++i) EXPECT_NEAR(mass[i], expected_mass[i], 1e-5f) << i;
  EXPECT_EQ(entropy_count[0], 4);  // 2 scoring queries x 2 query heads
  EXPECT_GT(entropy_sum[0], 0.0);
  EXPECT_LE(entropy_sum[0], 4.0 + 1e-9);
}

// ---- with the bundled model ----

using testing::prompt_of;
using testing::tiny_model;

TEST(KvEvictionRunnerTest, CompactionMovesEachHeadsKeptVectorsInOrder) {
  ASSERT_NE(tiny_model(), nullptr);
  for (DType dtype : {DType::kF32, DType::kInt8}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto made = CpuModelRunner::create(tiny_model(), 16, 4, dtype, dtype);
    ASSERT_TRUE(made.ok());
    CpuModelRunner& r = **made;
    ForwardBatch batch;
    batch.token_ids = prompt_of(22, 3);
    for (int32_t i = 0; i < 22; ++i) batch.positions.push_back(i);
    SequenceSlice slice;
    slice.num_new_tokens = 22;
    slice.block_table = {9, 1, 4, 12, 6, 3};
    slice.kv_state = 5;
    slice.kv_state_reset = true;
    slice.score_from_index = 0;
    batch.sequences.push_back(slice);
    ASSERT_TRUE(r.execute(batch, {}).ok());
    const CpuSequenceEviction* state = r.eviction().find(5);
    ASSERT_NE(state, nullptr);
    runtime::KvCompaction job;
    job.kv_state = 5;
    job.config = config_of(KvCompressionPolicy::kH2O, 13, 2, 3);
    job.old_block_table = slice.block_table;
    job.old_length = 22;
    job.new_block_table = {0, 2, 5, 7};
    job.new_length = 13;
    // What each head should keep, from the scores before compaction.
    const int32_t layers = r.kv_geometry().num_layers, heads = r.kv_geometry().num_kv_heads;
    std::vector<std::vector<int32_t>> expected;
    for (int32_t lh = 0; lh < layers * heads; ++lh) {
      std::vector<float> s(state->mass.begin() + lh * state->capacity, state->mass.begin() + lh * state->capacity + 22);
      expected.push_back(runtime::select_kept_tokens(job.config, 13, 22, s));
    }
    CpuKvPool& pool = const_cast<CpuKvPool&>(r.pool());
    auto vector_bytes = [&](int32_t l, const std::vector<int32_t>& table, int32_t index, int32_t h) {
      kernels::PagedKvLayer lay = pool.layer(l);
      const size_t bytes = kernels::kv_head_bytes(lay.head_dim, lay.key_dtype);
      const size_t slot = static_cast<size_t>(table[index / 4]) * 4 + index % 4;
      const auto* p = static_cast<const std::byte*>(lay.key) + (slot * heads + h) * bytes;
      return std::vector<std::byte>(p, p + bytes);
    };
    std::vector<std::vector<std::byte>> before;
    for (int32_t l = 0; l < layers; ++l)
      for (int32_t h = 0; h < heads; ++h)
        for (int32_t i : expected[l * heads + h]) before.push_back(vector_bytes(l, job.old_block_table, i, h));
    ASSERT_TRUE(r.compact_kv(job).ok());
    size_t next = 0;
    for (int32_t l = 0; l < layers; ++l)
      for (int32_t h = 0; h < heads; ++h)
        for (size_t k = 0; k < expected[l * heads + h].size(); ++k)
          EXPECT_EQ(vector_bytes(l, job.new_block_table, static_cast<int32_t>(k), h), before[next++]) << l << h << k;
    // Bad jobs are refused before anything moves.
    runtime::KvCompaction overlap = job;
    overlap.new_block_table = {0, 9, 5, 7};
    EXPECT_EQ(r.compact_kv(overlap).code(), StatusCode::kInvalidArgument);
    runtime::KvCompaction outside = job;
    outside.new_block_table = {0, 2, 5, 99};
    EXPECT_EQ(r.compact_kv(outside).code(), StatusCode::kOutOfRange);
    r.release_kv_state(5);
    EXPECT_EQ(r.eviction().num_states(), 0u);
  }
}

StatusOr<std::unique_ptr<kv::KvCacheManager>> make_kv(int32_t num_blocks) {
  kv::KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = 16;
  return kv::KvCacheManager::create(config);
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  engine::EngineStats stats;
  int32_t max_blocks_after_compaction = 0;  // blocks in use once the first compaction ran
};

// One greedy request through an engine over a fresh runner; KV invariants after every step.
GreedyRun run_greedy(const std::vector<int32_t>& prompt, int32_t max_tokens, const KvCompressionConfig& compression,
               int32_t num_blocks = 128) {
  GreedyRun out;
  auto runner = CpuModelRunner::create(tiny_model(), num_blocks, 16);
  EXPECT_TRUE(runner.ok());
  auto kv = make_kv(num_blocks);
  EXPECT_TRUE(kv.ok());
  engine::EngineConfig config;
  config.scheduler.max_tokens_per_step = 128;
  config.kv_compression = compression;
  engine::Engine engine(config, **runner, **kv);
  engine::GenerationRequest request;
  request.prompt_tokens = prompt;
  request.sampling.max_tokens = max_tokens;
  request.sampling.temperature = 0.0f;
  request.sampling.ignore_eos = true;
  auto stream = engine.submit(request);
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  if (!stream.ok()) return out;
  while (engine.step()) {
    EXPECT_TRUE(engine.verify_integrity().ok());
    if (engine.stats().kv_compactions > 0)
      out.max_blocks_after_compaction = std::max(out.max_blocks_after_compaction, (*kv)->stats().blocks_in_use);
  }
  while (auto d = (*stream)->next(std::chrono::milliseconds(0)))
    for (const auto& c : d->choices) out.tokens.insert(out.tokens.end(), c.tokens.begin(), c.tokens.end());
  out.stats = engine.stats();
  EXPECT_EQ((*kv)->num_available_blocks(), num_blocks) << "blocks leaked";
  EXPECT_EQ((*runner)->eviction().num_states(), 0u) << "runner state leaked";
  return out;
}

TEST(KvEvictionEngineTest, AtFullBudgetEveryPolicyGivesTheOutputOfNone) {
  ASSERT_NE(tiny_model(), nullptr);
  const std::vector<int32_t> prompt = prompt_of(150, 1);
  const GreedyRun none = run_greedy(prompt, 40, {});
  ASSERT_EQ(none.tokens.size(), 40u);
  for (KvCompressionPolicy p : kPolicies) {
    SCOPED_TRACE(runtime::kv_compression_policy_name(p));
    const GreedyRun full = run_greedy(prompt, 40, config_of(p, 200, 4, 32));
    EXPECT_EQ(full.tokens, none.tokens);
    EXPECT_EQ(full.stats.kv_compactions, 0);
  }
}

TEST(KvEvictionEngineTest, UnderABudgetTheCacheIsCompactedAndNothingLeaks) {
  ASSERT_NE(tiny_model(), nullptr);
  const std::vector<int32_t> prompt = prompt_of(300, 2);
  for (KvCompressionPolicy p : kPolicies) {
    SCOPED_TRACE(runtime::kv_compression_policy_name(p));
    const KvCompressionConfig c = config_of(p, 64, 4, 16);
    const GreedyRun r = run_greedy(prompt, 60, c);
    EXPECT_EQ(r.tokens.size(), 60u);
    // One compaction after the prompt, then one per block of decode past the trigger.
    EXPECT_GE(r.stats.kv_compactions, 2);
    EXPECT_GT(r.stats.kv_evicted_slots, 300 - runtime::kv_compaction_capacity(c, 8));
    EXPECT_EQ(r.stats.kv.blocks_in_use, 0);
    // Once compacted, a sequence holds its largest head budget plus at most the block it grows by.
    const int32_t trigger = runtime::kv_compaction_trigger(c, 8, 16);
    EXPECT_GT(r.max_blocks_after_compaction, 0);
    EXPECT_LE(r.max_blocks_after_compaction, (trigger + 15) / 16 + 1);
  }
}

TEST(KvEvictionEngineTest, ACompressedSequenceNeverServesAPrefixHit) {
  ASSERT_NE(tiny_model(), nullptr);
  auto runner = CpuModelRunner::create(tiny_model(), 128, 16);
  auto kv = make_kv(128);
  ASSERT_TRUE(runner.ok() && kv.ok());
  engine::Engine engine({}, **runner, **kv);
  const std::vector<int32_t> prompt = prompt_of(200, 4);
  auto ask = [&](std::optional<KvCompressionConfig> c, int32_t max_tokens) {
    engine::GenerationRequest request;
    request.prompt_tokens = prompt;
    request.sampling.max_tokens = max_tokens;
    request.sampling.temperature = 0.0f;
    request.sampling.ignore_eos = true;
    request.kv_compression = c;
    auto stream = engine.submit(request);
    EXPECT_TRUE(stream.ok());
    std::vector<int32_t> tokens;
    int32_t cached = -1;
    while (engine.step()) EXPECT_TRUE(engine.verify_integrity().ok());
    while (auto d = (*stream)->next(std::chrono::milliseconds(0))) {
      for (const auto& ch : d->choices) tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());
      if (d->finished) cached = d->usage.cached_tokens;
    }
    return std::pair{tokens, cached};
  };
  // Compressed first: its prompt blocks were cached before compaction (full
  // K/V), its compacted blocks never are; the uncompressed request then hits
  // the prompt's blocks only, and gives exactly the output of a cold run.
  const auto compressed = ask(config_of(KvCompressionPolicy::kSnapKV, 64, 4, 16), 40);
  EXPECT_EQ(compressed.second, 0);
  const auto warm = ask(std::nullopt, 40);
  EXPECT_EQ(warm.second, 192) << "the prompt's 12 full blocks, nothing of the compressed sequence";
  ASSERT_TRUE((*kv)->drop_namespace("") >= 0);
  const auto cold = ask(std::nullopt, 40);
  EXPECT_EQ(cold.second, 0);
  EXPECT_EQ(warm.first, cold.first);
  EXPECT_EQ(engine.stats().kv.blocks_cached, (*kv)->stats().blocks_cached);
}

// A runner whose compaction fails: the request fails and everything is freed.
class FailingCompaction final : public runtime::DelegatingModelRunner {
 public:
  using DelegatingModelRunner::DelegatingModelRunner;
  Status compact_kv(const runtime::KvCompaction&) override { return internal_error("injected compaction failure"); }
};

TEST(KvEvictionEngineTest, AFailedCompactionFailsTheRequestAndFreesEverything) {
  ASSERT_NE(tiny_model(), nullptr);
  auto inner = CpuModelRunner::create(tiny_model(), 64, 16);
  ASSERT_TRUE(inner.ok());
  FailingCompaction runner(**inner);
  auto kv = make_kv(64);
  engine::EngineConfig config;
  config.kv_compression = config_of(KvCompressionPolicy::kStreaming, 64, 4, 16);
  engine::Engine engine(config, runner, **kv);
  engine::GenerationRequest request;
  request.prompt_tokens = prompt_of(200, 5);
  request.sampling.max_tokens = 10;
  auto stream = engine.submit(request);
  ASSERT_TRUE(stream.ok());
  while (engine.step()) EXPECT_TRUE(engine.verify_integrity().ok());
  bool failed = false;
  while (auto d = (*stream)->next(std::chrono::milliseconds(0))) failed |= d->failed();
  EXPECT_TRUE(failed);
  EXPECT_EQ((*kv)->num_available_blocks(), 64);
  EXPECT_EQ((*kv)->stats().blocks_in_use, 0);
  EXPECT_EQ((*inner)->eviction().num_states(), 0u);
}

TEST(KvEvictionEngineTest, BadRequestsNameTheField) {
  ASSERT_NE(tiny_model(), nullptr);
  auto runner = CpuModelRunner::create(tiny_model(), 64, 16);
  auto kv = make_kv(64);
  engine::Engine engine({}, **runner, **kv);
  engine::GenerationRequest request;
  request.prompt_tokens = prompt_of(20, 6);
  request.sampling.max_tokens = 4;
  request.kv_compression = config_of(KvCompressionPolicy::kSnapKV, 10, 4, 16);
  auto small = engine.submit(request);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("kv_compression.budget"), std::string::npos);
  request.kv_compression = config_of(KvCompressionPolicy::kSnapKV, 64, 4, 16);
  request.sampling.n = 2;
  auto forks = engine.submit(request);
  ASSERT_FALSE(forks.ok());
  EXPECT_NE(forks.status().message().find("n is 2"), std::string::npos);
  // A runner that cannot compact (the cuda backend for now) refuses by name.
  class NoCompaction final : public runtime::DelegatingModelRunner {
   public:
    using DelegatingModelRunner::DelegatingModelRunner;
    runtime::RunnerCapabilities capabilities() const override { return {}; }
  } plain(**runner);
  engine::Engine other({}, plain, **kv);
  request.sampling.n = 1;
  auto refused = other.submit(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("kv_compression.policy"), std::string::npos);
  // A runner with scores but no per-head budgets (a cuda runner with CudaRunnerOptions::kv_head_budgets off)
  // runs snapkv and refuses pyramidkv / entropy by name.
  class NoHeadBudgets final : public runtime::DelegatingModelRunner {
   public:
    using DelegatingModelRunner::DelegatingModelRunner;
    runtime::RunnerCapabilities capabilities() const override {
      runtime::RunnerCapabilities c = DelegatingModelRunner::capabilities();
      c.kv_head_budgets = false;
      return c;
    }
  } uniform(**runner);
  engine::Engine third({}, uniform, **kv);
  EXPECT_TRUE(third.submit(request).ok());
  for (KvCompressionPolicy policy : {KvCompressionPolicy::kPyramidKV, KvCompressionPolicy::kEntropy}) {
    request.kv_compression = config_of(policy, 64, 4, 16);
    auto per_head = third.submit(request);
    ASSERT_FALSE(per_head.ok());
    EXPECT_EQ(per_head.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(per_head.status().message().find("kv_compression.policy " +
                                               std::string(runtime::kv_compression_policy_name(policy))),
              std::string::npos) << per_head.status().message();
  }
}

// Several compressed sequences in a pool too small for all: preemption by swap moves their
// compacted blocks to the host tier and back, and the runner keeps their state meanwhile.
std::vector<std::vector<int32_t>> run_batch(const std::vector<std::vector<int32_t>>& prompts, int32_t num_blocks,
                                            int32_t host_blocks, int32_t max_running, engine::EngineStats* stats) {
  auto runner = CpuModelRunner::create(tiny_model(), num_blocks, 4, DType::kF32, DType::kF32, host_blocks);
  EXPECT_TRUE(runner.ok());
  kv::KvCacheConfig kc;
  kc.num_blocks = num_blocks;
  kc.block_size = 4;
  kc.num_host_blocks = host_blocks;
  auto kv = kv::KvCacheManager::create(kc);
  EXPECT_TRUE(kv.ok());
  engine::EngineConfig ec;
  ec.scheduler.preemption_mode = host_blocks > 0 ? engine::PreemptionMode::kSwap : engine::PreemptionMode::kRecompute;
  ec.scheduler.max_running_sequences = max_running;
  ec.scheduler.max_tokens_per_step = 64;
  ec.kv_compression = config_of(KvCompressionPolicy::kH2O, 16, 2, 4);
  engine::Engine eng(ec, **runner, **kv);
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : prompts) {
    engine::GenerationRequest r;
    r.prompt_tokens = p;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 24;
    r.sampling.ignore_eos = true;
    auto s = eng.submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  while (eng.step()) EXPECT_TRUE(eng.verify_integrity().ok());
  std::vector<std::vector<int32_t>> outputs;
  for (auto& s : streams) {
    std::vector<int32_t> tokens;
    while (auto out = s->next(std::chrono::milliseconds(0))) {
      for (const auto& c : out->choices) tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
      EXPECT_TRUE(out->error.empty()) << out->error;
    }
    outputs.push_back(std::move(tokens));
  }
  *stats = eng.stats();
  EXPECT_EQ((*kv)->num_available_blocks(), num_blocks) << "blocks leaked";
  EXPECT_EQ((*runner)->eviction().num_states(), 0u);
  return outputs;
}

TEST(KvEvictionEngineTest, PreemptionBySwapKeepsACompressedSequencesCacheAndState) {
  ASSERT_NE(tiny_model(), nullptr);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(prompt_of(36 + 3 * i, 20 + i));
  engine::EngineStats roomy_stats, tight_stats;
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) alone.push_back(run_batch({p}, 128, 0, 1, &roomy_stats)[0]);
  const auto together = run_batch(prompts, 24, 96, 4, &tight_stats);
  EXPECT_GT(tight_stats.swap_preemptions, 0) << "the test must exercise swapping";
  EXPECT_GT(tight_stats.kv_compactions, 4);
  for (const auto& t : together) EXPECT_EQ(t.size(), 24u);
  // Under this pressure compactions are also put off for want of fresh blocks (a sequence then
  // keeps more tokens for a while), so the outputs need not equal each sequence's alone.
  EXPECT_GT(tight_stats.kv_compactions_deferred, 0);
  for (const auto& a : alone) EXPECT_EQ(a.size(), 24u);
}

}  // namespace
}  // namespace pagoda
