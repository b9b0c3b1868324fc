// Cross-layer KV sharing (--kv-cross-layer-share, runtime/cross_layer_share.h) on the CPU backend:
//  - the grouping of the upper half and the checks of K (errors name the flag);
//  - the pool's bytes: what it allocates equals kv_sizing's count (kvcalc, the start-up report);
//  - the merge written at KV-write time: each member reads its own norm x the normalized mean of
//    the members' directions, in every KV dtype;
//  - through the runner and the engine with the bundled model: K = 1 is identical to off, every
//    KV dtype runs, and a prefix-cache hit gives the output of a cold run split alike.

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bundled_model.h"
#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/backend/startup_report.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/cross_layer_share.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda {
namespace {

using runtime::CrossLayerShare;

const DType kKvDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4};

TEST(CrossLayerShareTest, GroupsTheUpperHalfOfTheStack) {
  const CrossLayerShare two{8, 2};
  EXPECT_EQ(two.first_shared(), 4);
  EXPECT_EQ(two.num_slots(), 6);
  EXPECT_EQ(two.num_shared_slots(), 2);
  EXPECT_EQ(two.slot_of(3), 3);
  EXPECT_EQ(two.member_of(3), -1);
  EXPECT_EQ(two.slot_of(4), 4);
  EXPECT_EQ(two.slot_of(5), 4);
  EXPECT_EQ(two.member_of(5), 1);
  EXPECT_EQ(two.slot_of(7), 5);
  EXPECT_EQ(two.norm_record(), 3);
  const CrossLayerShare three{8, 3};  // layers 4-6, then 7 alone
  EXPECT_EQ(three.num_slots(), 6);
  EXPECT_EQ(three.slot_of(6), 4);
  EXPECT_EQ(three.slot_of(7), 5);
  EXPECT_EQ(three.member_of(7), 0);
  const CrossLayerShare four{8, 4};
  EXPECT_EQ(four.num_slots(), 5);
  const CrossLayerShare odd{7, 3};  // upper half: layers 4-6
  EXPECT_EQ(odd.first_shared(), 4);
  EXPECT_EQ(odd.num_slots(), 5);
  const CrossLayerShare off{8, 1};
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.num_slots(), 8);
  EXPECT_EQ(off.num_shared_slots(), 0);
  EXPECT_EQ(off.slot_of(7), 7);

  EXPECT_TRUE(runtime::validate_cross_layer_share(1, 8, "--kv-cross-layer-share").ok());
  EXPECT_TRUE(runtime::validate_cross_layer_share(4, 8, "--kv-cross-layer-share").ok());
  for (int32_t bad : {0, -2, 5}) {
    const Status s = runtime::validate_cross_layer_share(bad, 8, "--kv-cross-layer-share");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("--kv-cross-layer-share " + std::to_string(bad), 0), 0u) << s.message();
  }
}

KvPoolShape small_shape(int32_t share, DType k, DType v) {
  KvPoolShape s;
  s.num_layers = 8;
  s.num_blocks = 5;
  s.block_size = 4;
  s.num_kv_heads = 2;
  s.head_dim = 32;
  s.key_dtype = k;
  s.value_dtype = v;
  s.cross_layer_share = share;
  return s;
}

TEST(CrossLayerShareTest, ThePoolHoldsExactlyWhatKvSizingCounts) {
  // f32, 8 layers, 2 heads of 32: 4,096 B/token unshared; K = 2 stores 6 slots (3,072 B) plus two
  // shared slots x 2 heads x (K and V) x 3 f32 norms (96 B).
  EXPECT_EQ(small_shape(1, DType::kF32, DType::kF32).bytes_per_token(), 4096u);
  EXPECT_EQ(small_shape(2, DType::kF32, DType::kF32).bytes_per_token(), 3072u + 96u);
  for (int32_t share : {1, 2, 3, 4}) {
    for (DType k : kKvDtypes) {
      const DType v = k == DType::kInt4 ? DType::kInt8 : k;
      SCOPED_TRACE(std::to_string(share) + " " + std::string(dtype_name(k)));
      const KvPoolShape shape = small_shape(share, k, v);
      auto pool = CpuKvPool::create(shape);
      ASSERT_TRUE(pool.ok()) << pool.status().to_string();
      EXPECT_EQ(pool->total_bytes(), shape.bytes_per_token() * shape.block_size * shape.num_blocks);
      KvShape sizing;
      sizing.layers = 8;
      sizing.query_heads = 8;
      sizing.kv_heads = 2;
      sizing.head_dim = 32;
      sizing.cross_layer_share = share;
      EXPECT_EQ(kv_bytes_per_token(sizing, k, v), static_cast<int64_t>(shape.bytes_per_token()));
      if (share > 1) {
        EXPECT_LT(shape.bytes_per_token(), small_shape(1, k, v).bytes_per_token());
      }
    }
  }
  // The start-up line names the sharing and the unshared size.
  KvShape llama;
  llama.layers = 32;
  llama.query_heads = 32;
  llama.kv_heads = 8;
  llama.head_dim = 128;
  llama.cross_layer_share = 2;
  const std::string line = format_kv_cache_line(llama, DType::kBF16, DType::kBF16, int64_t{1} << 30);
  EXPECT_NE(line.find("cross-layer share 2 (layers 16-31 in groups, 24 of 32 layers' K/V stored; unshared: 131,072 "
                      "B/token)"), std::string::npos) << line;
  EXPECT_NE(line.find("99,840 B/token"), std::string::npos) << line;  // 24 x 4,096 + 8 x 8 x 2 x 3 x 4
}

// Reads back, through attention over a single-token context (softmax of one score is 1), what
// member `member` of the group sees as the value of the token at slot 0 of block 0.
std::vector<float> value_seen(CpuKvPool& pool, int32_t layer, int32_t heads, int32_t head_dim) {
  kernels::PagedKvLayer view = pool.layer(layer);
  std::vector<float> q(static_cast<size_t>(heads) * head_dim, 0.5f), out(q.size());
  const int32_t table[] = {0};
  const kernels::PagedSequence seq{0, 1, 0, table, {}};
  kernels::paged_attention(q.data(), view, std::span(&seq, 1), {heads, 1.0f, 0}, out.data());
  return out;
}

TEST(CrossLayerShareTest, EachMemberReadsItsNormTimesTheMergedDirection) {
  const int32_t heads = 2, D = 32;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_rows = [&](float scale) {
    std::vector<float> x(static_cast<size_t>(heads) * D);
    for (float& e : x) e = normal(rng) * scale;
    return x;
  };
  for (DType dtype : kKvDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    // The dtype's rounding, relative to the largest element of the head's vector (int4: about a step of
    // its 15-level grid, the merged direction having been rounded twice).
    const float tol = dtype == DType::kF32 ? 1e-5f : dtype == DType::kInt4 ? 0.15f : dtype == DType::kFP8E4M3 ? 0.07f
                                                                                                          : 0.01f;
    auto near_rows = [&](const std::vector<float>& got, const std::vector<float>& want) {
      for (int32_t h = 0; h < heads; ++h) {
        float scale = 0.0f;
        for (int32_t i = 0; i < D; ++i) scale = std::max(scale, std::abs(want[h * D + i]));
        for (int32_t i = 0; i < D; ++i) EXPECT_NEAR(got[h * D + i], want[h * D + i], tol * scale) << h << " " << i;
      }
    };
    auto pool = CpuKvPool::create(small_shape(2, dtype, dtype));
    ASSERT_TRUE(pool.ok());
    const std::vector<int64_t> slot = {0};
    // Layers 4 and 5 are one group: member 0 writes, member 1 merges into the same slot.
    const std::vector<float> k4 = random_rows(2.0f), v4 = random_rows(3.0f), k5 = random_rows(0.5f),
                             v5 = random_rows(1.5f);
    kernels::kv_write(k4.data(), v4.data(), slot, pool->layer(4));
    const std::vector<float> after_first = value_seen(*pool, 4, heads, D);
    near_rows(after_first, v4);
    kernels::kv_write(k5.data(), v5.data(), slot, pool->layer(5));
    const std::vector<float> seen4 = value_seen(*pool, 4, heads, D), seen5 = value_seen(*pool, 5, heads, D);
    std::vector<float> want4(v4.size()), want5(v5.size());
    for (int32_t h = 0; h < heads; ++h) {
      const float* a = v4.data() + h * D;
      const float* b = v5.data() + h * D;
      double na = 0, nb = 0;
      for (int32_t i = 0; i < D; ++i) na += a[i] * a[i], nb += b[i] * b[i];
      na = std::sqrt(na), nb = std::sqrt(nb);
      std::vector<double> dir(D);
      double nd = 0;
      for (int32_t i = 0; i < D; ++i) nd += (dir[i] = a[i] / na + b[i] / nb) * dir[i];
      nd = std::sqrt(nd);
      for (int32_t i = 0; i < D; ++i) {
        want4[h * D + i] = static_cast<float>(na * dir[i] / nd);
        want5[h * D + i] = static_cast<float>(nb * dir[i] / nd);
      }
    }
    near_rows(seen4, want4);
    near_rows(seen5, want5);
    // The layers below the shared region keep their own K/V: layer 3 reads what it wrote.
    kernels::kv_write(k4.data(), v4.data(), slot, pool->layer(3));
    const std::vector<float> own = value_seen(*pool, 3, heads, D);
    near_rows(own, v4);
    // Copy-on-write carries the norms: block 1 read through a table of {1} sees the same values.
    pool->copy_block(0, 1);
    pool->zero_block(0);
    kernels::PagedKvLayer view = pool->layer(5);
    std::vector<float> q(static_cast<size_t>(heads) * D, 0.5f), out(q.size());
    const int32_t table[] = {1};
    const kernels::PagedSequence seq{0, 1, 0, table, {}};
    kernels::paged_attention(q.data(), view, std::span(&seq, 1), {heads, 1.0f, 0}, out.data());
    EXPECT_EQ(out, seen5);
  }
}

// ---- with the bundled model ----

using testing::prompt_of;
using testing::tiny_model;

// Logits of every prompt position, one forward, through a fresh runner.
std::vector<float> prompt_logits(DType dtype, int32_t share, const std::vector<int32_t>& prompt) {
  auto runner = CpuModelRunner::create(tiny_model(), 16, 16, dtype, dtype, 0, share);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return {};
  ForwardBatch batch;
  batch.token_ids = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) batch.positions.push_back(static_cast<int32_t>(i));
  SequenceSlice slice;
  slice.num_new_tokens = static_cast<int32_t>(prompt.size());
  for (int32_t b = 0; b * 16 < slice.num_new_tokens; ++b) slice.block_table.push_back(b);
  slice.logits_for_all_new_tokens = true;
  batch.sequences.push_back(slice);
  auto result = (*runner)->execute(batch, {});
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  return result.ok() ? result->host_logits : std::vector<float>{};
}

double top1_agreement(const std::vector<float>& a, const std::vector<float>& b, int32_t vocab) {
  const size_t rows = a.size() / static_cast<size_t>(vocab);
  size_t same = 0;
  for (size_t r = 0; r < rows; ++r) {
    const auto row_a = a.begin() + static_cast<std::ptrdiff_t>(r * vocab);
    const auto row_b = b.begin() + static_cast<std::ptrdiff_t>(r * vocab);
    same += std::max_element(row_a, row_a + vocab) - row_a == std::max_element(row_b, row_b + vocab) - row_b;
  }
  return static_cast<double>(same) / static_cast<double>(rows);
}

TEST(CrossLayerShareModelTest, KOneIsIdenticalToOffAndSharingChangesTheCache) {
  ASSERT_NE(tiny_model(), nullptr);
  const std::vector<int32_t> prompt = prompt_of(48, 1);
  const std::vector<float> off = prompt_logits(DType::kF32, 1, prompt);
  auto plain = CpuModelRunner::create(tiny_model(), 16, 16);  // the default: no sharing
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->kv_geometry().cross_layer_share, 1);
  ASSERT_FALSE(off.empty());
  const std::vector<float> shared = prompt_logits(DType::kF32, 2, prompt);
  ASSERT_EQ(shared.size(), off.size());
  EXPECT_NE(shared, off);
  // The bundled model still mostly agrees with itself (a loose floor; the measured figures are
  // in docs/BENCHMARKS.md).
  EXPECT_GT(top1_agreement(shared, off, tiny_model()->config().vocab_size), 0.5);
}

TEST(CrossLayerShareModelTest, EveryKvDtypeRunsAndStaysCloseToF32Sharing) {
  ASSERT_NE(tiny_model(), nullptr);
  const std::vector<int32_t> prompt = prompt_of(64, 2);
  const std::vector<float> reference = prompt_logits(DType::kF32, 2, prompt);
  ASSERT_FALSE(reference.empty());
  for (DType dtype : kKvDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<float> logits = prompt_logits(dtype, 2, prompt);
    ASSERT_EQ(logits.size(), reference.size());
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    const double floor = dtype == DType::kInt4 ? 0.6 : 0.85;
    EXPECT_GE(top1_agreement(logits, reference, tiny_model()->config().vocab_size), floor);
  }
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  int32_t cached = -1;
};

GreedyRun ask(engine::Engine& engine, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  engine::GenerationRequest request;
  request.prompt_tokens = prompt;
  request.sampling.max_tokens = max_tokens;
  request.sampling.temperature = 0.0f;
  request.sampling.ignore_eos = true;
  auto stream = engine.submit(request);
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  GreedyRun out;
  if (!stream.ok()) return out;
  while (engine.step()) EXPECT_TRUE(engine.verify_integrity().ok());
  while (auto d = (*stream)->next(std::chrono::milliseconds(0))) {
    for (const auto& ch : d->choices) out.tokens.insert(out.tokens.end(), ch.tokens.begin(), ch.tokens.end());
    if (d->finished) out.cached = d->usage.cached_tokens;
  }
  return out;
}

TEST(CrossLayerShareModelTest, APrefixHitGivesTheOutputOfAColdRunSplitAlike) {
  ASSERT_NE(tiny_model(), nullptr);
  for (DType dtype : {DType::kF32, DType::kInt8}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto runner = CpuModelRunner::create(tiny_model(), 64, 16, dtype, dtype, 0, 2);
    kv::KvCacheConfig kv_config;
    kv_config.num_blocks = 64;
    kv_config.block_size = 16;
    auto kv = kv::KvCacheManager::create(kv_config);
    ASSERT_TRUE(runner.ok() && kv.ok());
    engine::EngineConfig config;
    // Forwards of one block: a cold prompt is split where a hit's boundary falls (the merge of a
    // forward's own tokens is partial, docs/KV_CACHE.md).
    config.scheduler.max_tokens_per_step = 16;
    engine::Engine engine(config, **runner, **kv);
    const std::vector<int32_t> prompt = prompt_of(200, 4);
    const GreedyRun cold = ask(engine, prompt, 24);
    EXPECT_EQ(cold.cached, 0);
    const GreedyRun warm = ask(engine, prompt, 24);
    EXPECT_EQ(warm.cached, 192);
    ASSERT_EQ(cold.tokens.size(), 24u);
    EXPECT_EQ(warm.tokens, cold.tokens);
    EXPECT_EQ((*kv)->stats().blocks_in_use, 0);
  }
}

TEST(CrossLayerShareModelTest, BadSettingsNameTheFlag) {
  ASSERT_NE(tiny_model(), nullptr);
  for (int32_t bad : {0, 5}) {
    auto r = CpuModelRunner::create(tiny_model(), 8, 16, DType::kF32, DType::kF32, 0, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("--kv-cross-layer-share " + std::to_string(bad)), std::string::npos)
        << r.status().message();
  }
  auto tier = CpuModelRunner::create(tiny_model(), 8, 16, DType::kF32, DType::kF32, 4, 2);
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.status().message().find("--kv-offload-memory"), std::string::npos);
  // A shared runner cannot compact: token eviction is refused with it.
  auto shared = CpuModelRunner::create(tiny_model(), 8, 16, DType::kF32, DType::kF32, 0, 2);
  ASSERT_TRUE(shared.ok());
  EXPECT_FALSE((*shared)->capabilities().compacts_kv);

  backend::RunnerSpec spec;
  spec.kv_cross_layer_share = 2;
  ModelConfig config = tiny_model()->config();
  EXPECT_TRUE(backend::check_cross_layer_share(config, spec).ok());
  // On cuda: bf16 and fp8 KV (tests/gpu_backend/cross_layer_share_gpu_test.cpp); other dtypes and
  // tensor parallelism are refused by name.
  spec.device = backend::Device::kCuda;
  const Status cuda = backend::check_cross_layer_share(config, spec);  // the spec's f32 KV
  EXPECT_EQ(cuda.code(), StatusCode::kUnimplemented);
  EXPECT_NE(cuda.message().find("--kv-cross-layer-share 2"), std::string::npos);
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
    spec.key_dtype = spec.value_dtype = dtype;
    EXPECT_TRUE(backend::check_cross_layer_share(config, spec).ok()) << dtype_name(dtype);
  }
  spec.key_dtype = spec.value_dtype = DType::kInt8;
  const Status int8 = backend::check_cross_layer_share(config, spec);
  EXPECT_EQ(int8.code(), StatusCode::kUnimplemented);
  EXPECT_NE(int8.message().find("--kv-cross-layer-share 2"), std::string::npos) << int8.message();
  EXPECT_NE(int8.message().find("int8"), std::string::npos) << int8.message();
  spec.key_dtype = spec.value_dtype = DType::kBF16;
  spec.tensor_parallel_size = 2;
  EXPECT_NE(backend::check_cross_layer_share(config, spec).message().find("--tensor-parallel-size"),
            std::string::npos);
  spec.tensor_parallel_size = 1;
  spec.key_dtype = spec.value_dtype = DType::kF32;
  spec.device = backend::Device::kCpu;
  spec.kv_offload_memory = 1 << 20;
  EXPECT_NE(backend::check_cross_layer_share(config, spec).message().find("--kv-offload-memory"), std::string::npos);
  spec.kv_offload_memory = 0;
  spec.kv_cross_layer_share = 9;
  EXPECT_NE(backend::check_cross_layer_share(config, spec).message().find("at most 4"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
