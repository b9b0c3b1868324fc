// Quantized KV through the pool, the model and the runner: pool sizes match
// kv_sizing, zeroing and copy-on-write handle data and scale records, the
// forward runs with every KV dtype (K and V apart too), its logits stay near
// the f32-KV logits, do not depend on the block size, and a copied block
// reads back the same as its source. Also the start-up line of kv_sizing.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "model/testing/tiny_checkpoint.h"
#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"
#include "pagoda/runtime/kv_sizing.h"
#include "pagoda/backend/cpu/cpu_model.h"

namespace pagoda {
namespace {

using ::testing::HasSubstr;

constexpr DType kAllKvDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4};

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

ForwardBatch one_sequence(const std::vector<int32_t>& tokens, int32_t begin, int32_t end,
                          const std::vector<int32_t>& table) {
  ForwardBatch batch;
  batch.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
  for (int32_t i = begin; i < end; ++i) batch.positions.push_back(i);
  SequenceSlice s;
  s.num_new_tokens = end - begin;
  s.num_cached_tokens = begin;
  s.block_table = table;
  s.logits_for_all_new_tokens = true;
  batch.sequences.push_back(s);
  return batch;
}

// All-position logits of `tokens`, prefilled in chunks of `chunk`.
std::vector<float> run(CpuModel& model, CpuKvPool& pool, const std::vector<int32_t>& tokens, int32_t chunk,
                       const std::vector<int32_t>& table) {
  std::vector<float> all, logits;
  for (int32_t begin = 0; begin < static_cast<int32_t>(tokens.size()); begin += chunk) {
    const int32_t end = std::min<int32_t>(begin + chunk, static_cast<int32_t>(tokens.size()));
    const Status st = model.forward(one_sequence(tokens, begin, end, table), pool, logits);
    EXPECT_TRUE(st.ok()) << st.to_string();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

std::vector<int32_t> table_of(int32_t tokens, int32_t block_size, int32_t pool_blocks, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  ids.resize(static_cast<size_t>((tokens + block_size - 1) / block_size));
  return ids;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

// ------------------------------------------------------------ the pool

TEST(CpuKvPoolDtypeTest, EveryKvDtypeAllocatesWhatKvSizingCounts) {
  for (DType k : kAllKvDtypes) {
    for (DType v : {DType::kF32, DType::kInt4, DType::kInt8}) {
      KvPoolShape shape{3, 5, 16, 2, 40, k, v};
      auto pool = CpuKvPool::create(shape);
      ASSERT_TRUE(pool.ok()) << dtype_name(k) << "/" << dtype_name(v) << " " << pool.status().to_string();
      EXPECT_EQ(pool->total_bytes(), shape.bytes_per_token() * 16 * 5) << dtype_name(k) << "/" << dtype_name(v);
      const auto layer = pool->layer(2);
      EXPECT_EQ(layer.key_dtype, k);
      EXPECT_EQ(layer.value_dtype, v);
      EXPECT_EQ(layer.key_scales == nullptr, kernels::kv_quant_of(k) == kernels::KvQuant::kNone);
      EXPECT_EQ(layer.value_scales == nullptr, kernels::kv_quant_of(v) == kernels::KvQuant::kNone);
    }
  }
  // Llama-3-8B's layer geometry: int8 is 132 / 256 of bf16 per vector, int4 80 / 256.
  KvPoolShape llama{32, 1, 16, 8, 128, DType::kInt8, DType::kInt8};
  EXPECT_EQ(llama.bytes_per_token(), 32u * 8 * 2 * 132);
}

TEST(CpuKvPoolDtypeTest, RejectsBadShapesAndNonKvDtypes) {
  EXPECT_EQ(CpuKvPool::create(KvPoolShape{2, 0, 16, 2, 8}).status().code(), StatusCode::kInvalidArgument);
  KvPoolShape bad{2, 4, 16, 2, 8, DType::kF32, static_cast<DType>(99)};
  EXPECT_EQ(CpuKvPool::create(bad).status().code(), StatusCode::kInvalidArgument);
}

// Writes random K/V for every slot of `block` in every layer.
void fill_block(CpuKvPool& pool, int32_t block, uint64_t seed) {
  const KvPoolShape& s = pool.shape();
  const size_t row = size_t(s.num_kv_heads) * s.head_dim;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> k(s.block_size * row), v(k.size());
  std::vector<int64_t> slots(s.block_size);
  for (int32_t i = 0; i < s.block_size; ++i) slots[i] = int64_t(block) * s.block_size + i;
  for (int32_t l = 0; l < s.num_layers; ++l) {
    for (auto& x : k) x = dist(rng);
    for (auto& x : v) x = dist(rng);
    kernels::kv_write(k.data(), v.data(), slots, pool.layer(l));
  }
}

// The bytes (data and scales) of one block of one layer, K then V.
std::vector<uint8_t> block_bytes(CpuKvPool& pool, int32_t layer, int32_t block) {
  const KvPoolShape& s = pool.shape();
  const auto view = pool.layer(layer);
  const size_t vectors = size_t(s.block_size) * s.num_kv_heads;
  std::vector<uint8_t> out;
  auto append = [&](const void* base, size_t per_vector) {
    if (base == nullptr) return;
    const auto* p = static_cast<const uint8_t*>(base) + size_t(block) * vectors * per_vector;
    out.insert(out.end(), p, p + vectors * per_vector);
  };
  append(view.key, kernels::kv_head_bytes(s.head_dim, s.key_dtype));
  append(view.key_scales, kernels::kv_head_scale_bytes(s.head_dim, s.key_dtype));
  append(view.value, kernels::kv_head_bytes(s.head_dim, s.value_dtype));
  append(view.value_scales, kernels::kv_head_scale_bytes(s.head_dim, s.value_dtype));
  return out;
}

TEST(CpuKvPoolDtypeTest, CopyBlockCopiesDataAndScalesOnly) {
  for (auto [k, v] : {std::pair{DType::kInt4, DType::kFP8E4M3}, std::pair{DType::kInt8, DType::kInt8},
                      std::pair{DType::kF32, DType::kInt4}}) {
    for (int32_t block_size : {1, 3, 16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(k) << "/" << dtype_name(v) << " block " << block_size);
      auto pool = CpuKvPool::create(KvPoolShape{2, 6, block_size, 2, 40, k, v});
      ASSERT_TRUE(pool.ok());
      for (int32_t b = 0; b < 6; ++b) fill_block(*pool, b, 50 + b);
      std::vector<std::vector<uint8_t>> before;
      for (int32_t b = 0; b < 6; ++b) before.push_back(block_bytes(*pool, 1, b));
      pool->copy_block(2, 4);
      for (int32_t l = 0; l < 2; ++l) EXPECT_EQ(block_bytes(*pool, l, 4), block_bytes(*pool, l, 2)) << "layer " << l;
      for (int32_t b : {0, 1, 2, 3, 5}) EXPECT_EQ(block_bytes(*pool, 1, b), before[b]) << "block " << b;
      EXPECT_NE(before[4], before[2]);  // the copy changed something

      pool->zero_block(2);
      const auto zeroed = block_bytes(*pool, 0, 2);
      EXPECT_TRUE(std::all_of(zeroed.begin(), zeroed.end(), [](uint8_t b) { return b == 0; }));
      EXPECT_EQ(block_bytes(*pool, 1, 4), before[2]);
    }
  }
}

TEST(CpuKvPoolDtypeTest, ZeroedQuantizedBlockReadsBackAsZeros) {
  for (DType d : {DType::kFP8E4M3, DType::kInt8, DType::kInt4}) {
    auto pool = CpuKvPool::create(KvPoolShape{1, 2, 4, 1, 40, d, d});
    ASSERT_TRUE(pool.ok());
    fill_block(*pool, 1, 3);
    pool->zero_block(1);
    const auto view = pool->layer(0);
    std::vector<float> out(40, 7.0f);
    const size_t vector = 4 + 2;  // block 1, slot 2, head 0
    kernels::dequantize_kv_vector(static_cast<uint8_t*>(view.key) + vector * kernels::kv_head_bytes(40, d),
                                  static_cast<uint8_t*>(view.key_scales) + vector * kernels::kv_head_scale_bytes(40, d),
                                  40, d, out.data());
    EXPECT_EQ(out, std::vector<float>(40, 0.0f)) << dtype_name(d);
  }
}

// ------------------------------------------------------------ the model

class KvDtypeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("kv_dtype_model");
    spec_.num_layers = 2;
    spec_.hidden_size = 64;
    spec_.num_heads = 4;
    spec_.num_kv_heads = 2;  // head dim 16
    testing::write_tiny_model(dir_, spec_);
    auto model = CpuModel::load(dir_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(*model);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<float> logits_with(DType k, DType v, int32_t block_size, int32_t chunk, const std::vector<int32_t>& tokens) {
    const int32_t n = static_cast<int32_t>(tokens.size());
    const int32_t blocks = (n + block_size - 1) / block_size + 3;
    auto pool = CpuKvPool::create(model_->kv_pool_shape(blocks, block_size, k, v));
    EXPECT_TRUE(pool.ok()) << pool.status().to_string();
    if (!pool.ok()) return {};
    return run(*model_, *pool, tokens, chunk, table_of(n, block_size, blocks, 9 + block_size));
  }

  std::filesystem::path dir_;
  testing::TinyModelSpec spec_;
  std::unique_ptr<CpuModel> model_;
};

TEST_F(KvDtypeModelTest, QuantizedLogitsStayNearF32AndIgnoreTheBlockSize) {
  const auto tokens = random_tokens(29, spec_.vocab_size, 4);
  const auto f32 = logits_with(DType::kF32, DType::kF32, 16, 7, tokens);
  ASSERT_EQ(f32.size(), tokens.size() * spec_.vocab_size);
  double scale = 0;
  for (float x : f32) scale = std::max(scale, double(std::abs(x)));
  struct Bound { DType k, v; double rel; };
  // Bounds relative to the largest logit: round-off for bf16 / f16 / fp8 / int8, looser for int4.
  for (const Bound& b : {Bound{DType::kBF16, DType::kBF16, 0.02}, Bound{DType::kF16, DType::kF16, 0.01},
                         Bound{DType::kFP8E4M3, DType::kFP8E4M3, 0.1}, Bound{DType::kInt8, DType::kInt8, 0.05},
                         Bound{DType::kInt4, DType::kInt4, 0.3}, Bound{DType::kInt8, DType::kInt4, 0.3}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(b.k) << "/" << dtype_name(b.v));
    const auto q16 = logits_with(b.k, b.v, 16, 7, tokens);
    ASSERT_EQ(q16.size(), f32.size());
    const double diff = max_abs_diff(q16, f32);
    EXPECT_LT(diff, b.rel * scale);
    EXPECT_GT(diff, 0.0);  // the KV really went through the format
    // Quantization is per (token, head): the block size changes where the bytes sit, not them.
    for (int32_t block_size : {1, 3}) EXPECT_EQ(logits_with(b.k, b.v, block_size, 7, tokens), q16) << block_size;
  }
}

// A checkpoint with calibrated per-tensor fp8 KV scales (self_attn.k_scale /
// v_scale, as vLLM reads them): they are bound per layer, the fp8 KV write
// uses them instead of each vector's amax (a scale far too small saturates
// every code, which changes the logits), and a sensible one stays near f32.
class CheckpointKvScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("kv_scale_model");
    spec_.num_layers = 2;
    spec_.hidden_size = 64;
    spec_.num_heads = 4;
    spec_.num_kv_heads = 2;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes the tiny model plus scalar k_scale / v_scale tensors in every layer.
  StatusOr<std::unique_ptr<CpuModel>> load_with_scales(float k_scale, float v_scale,
                                                       std::vector<int64_t> shape = {}) {
    auto tensors = testing::tiny_model_tensors(spec_);
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      tensors[p + "k_scale"] = testing::TensorToWrite{DType::kF32, shape, std::vector<float>(shape.empty() ? 1 : shape[0], k_scale)};
      tensors[p + "v_scale"] = testing::TensorToWrite{DType::kF32, {}, {v_scale}};
    }
    testing::write_model_dir(dir_, testing::tiny_config_json(spec_), tensors, 1);
    return CpuModel::load(dir_);
  }

  static std::vector<float> fp8_logits(CpuModel& model, DType k, DType v, const std::vector<int32_t>& tokens) {
    const int32_t n = static_cast<int32_t>(tokens.size());
    auto pool = CpuKvPool::create(model.kv_pool_shape(n / 16 + 2, 16, k, v));
    EXPECT_TRUE(pool.ok()) << pool.status().to_string();
    if (!pool.ok()) return {};
    return run(model, *pool, tokens, 5, table_of(n, 16, n / 16 + 2, 3));
  }

  std::filesystem::path dir_;
  testing::TinyModelSpec spec_;
};

TEST_F(CheckpointKvScaleTest, ScalesAreBoundPerLayer) {
  auto model = load_with_scales(0.25f, 0.125f, {1});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (const LayerWeights& w : (*model)->weights().layers) {
    EXPECT_EQ(w.k_scale, 0.25f);
    EXPECT_EQ(w.v_scale, 0.125f);
  }
  testing::write_tiny_model(dir_, spec_);  // no scale tensors: 0, the per-vector scales
  auto plain = CpuModel::load(dir_);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->weights().layers[0].k_scale, 0.0f);
}

TEST_F(CheckpointKvScaleTest, BadScalesAreNamedErrors) {
  auto negative = load_with_scales(-1.0f, 0.5f);
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("'model.layers.0.self_attn.k_scale' is -1"));
  auto vector = load_with_scales(0.5f, 0.5f, {2});
  ASSERT_FALSE(vector.ok());
  EXPECT_THAT(vector.status().message(), HasSubstr("'model.layers.0.self_attn.k_scale' has shape [2]"));
}

TEST_F(CheckpointKvScaleTest, Fp8WriteUsesTheCheckpointScale) {
  const auto tokens = random_tokens(37, spec_.vocab_size, 11);
  testing::write_tiny_model(dir_, spec_);
  auto plain = CpuModel::load(dir_);
  ASSERT_TRUE(plain.ok());
  const auto f32 = fp8_logits(**plain, DType::kF32, DType::kF32, tokens);
  const auto per_vector = fp8_logits(**plain, DType::kFP8E4M3, DType::kFP8E4M3, tokens);
  double scale = 0;
  for (float x : f32) scale = std::max(scale, double(std::abs(x)));

  // A sensible calibrated scale (|K|, |V| of this model stay well under 448 x 0.05): near f32.
  auto calibrated = load_with_scales(0.05f, 0.05f);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status().to_string();
  const auto with_scale = fp8_logits(**calibrated, DType::kFP8E4M3, DType::kFP8E4M3, tokens);
  ASSERT_EQ(with_scale.size(), f32.size());
  EXPECT_LT(max_abs_diff(with_scale, f32), 0.1 * scale);
  EXPECT_NE(with_scale, per_vector);  // not the per-vector path
  // Scales only matter to fp8: f32 KV ignores them.
  EXPECT_EQ(fp8_logits(**calibrated, DType::kF32, DType::kF32, tokens), f32);

  // A scale far too small saturates every code at +-448 x scale: the logits move.
  auto tiny = load_with_scales(1e-6f, 1e-6f);
  ASSERT_TRUE(tiny.ok());
  const auto saturated = fp8_logits(**tiny, DType::kFP8E4M3, DType::kFP8E4M3, tokens);
  EXPECT_GT(max_abs_diff(saturated, f32), 10 * max_abs_diff(with_scale, f32));
}

TEST_F(KvDtypeModelTest, RunnerCopyOnWriteKeepsScales) {
  // Prefill into blocks {0, 1}, copy them to {2, 3}; decoding the next token from either pair
  // must give the same logits (the copy carries the codes and their scale records).
  for (auto [k, v] : {std::pair{DType::kInt8, DType::kInt4}, std::pair{DType::kFP8E4M3, DType::kFP8E4M3}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(k) << "/" << dtype_name(v));
    auto model = CpuModel::load(dir_);
    ASSERT_TRUE(model.ok());
    auto runner = CpuModelRunner::create(std::move(*model), 6, 4, k, v);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    const auto tokens = random_tokens(7, spec_.vocab_size, 8);  // 6 cached + 1 decoded: block 1 half full
    ASSERT_TRUE((*runner)->execute(one_sequence(tokens, 0, 6, {0, 1}), {}).ok());
    const runtime::BlockCopy copies[] = {{0, 2}, {1, 3}};
    ASSERT_TRUE((*runner)->copy_blocks(copies).ok());
    auto from_copy = (*runner)->execute(one_sequence(tokens, 6, 7, {2, 3}), {});
    auto from_source = (*runner)->execute(one_sequence(tokens, 6, 7, {0, 1}), {});
    ASSERT_TRUE(from_copy.ok() && from_source.ok());
    EXPECT_EQ(from_copy->host_logits, from_source->host_logits);
    const runtime::BlockCopy outside[] = {{0, 6}};
    EXPECT_EQ((*runner)->copy_blocks(outside).code(), StatusCode::kOutOfRange);
  }
}

TEST_F(KvDtypeModelTest, BlocksForMemoryCountsScales) {
  // Tiny model: 2 layers x 2 KV heads x head dim 16.
  const int64_t budget = 1 << 20;
  EXPECT_EQ(CpuModelRunner::blocks_for_memory(*model_, budget, 16, DType::kInt8, DType::kInt8),
            budget / (2 * 2 * 2 * (16 + 4) * 16));
  EXPECT_EQ(CpuModelRunner::blocks_for_memory(*model_, budget, 16, DType::kInt8, DType::kInt4),
            budget / (2 * 2 * ((16 + 4) + (8 + 4)) * 16));
}

// ------------------------------------------------------------ the start-up line

TEST(KvSizingLineTest, Llama3ShapeInt8AndMixed) {
  KvShape llama;
  llama.layers = 32, llama.query_heads = 32, llama.kv_heads = 8, llama.head_dim = 128;
  const int64_t gib = int64_t{1} << 30;
  // int8: 32 x 8 x 2 x (128 + 4) = 67,584 B/token; bf16 131,072. 1 GiB / (67,584 x 16) = 992 blocks.
  EXPECT_EQ(format_kv_cache_line(llama, DType::kInt8, DType::kInt8, gib),
            "KV cache: int8 (K) / int8 (V), 67,584 B/token (bf16: 131,072 B), 15,872 tokens fit in 1.00 GiB");
  auto capacity = kv_capacity(llama, DType::kInt8, DType::kInt4, gib, 16, 2048);
  ASSERT_TRUE(capacity.ok());
  EXPECT_EQ(capacity->bytes_per_token, 32 * 8 * ((128 + 4) + (64 + 16)));
  EXPECT_EQ(capacity->tokens, capacity->blocks * 16);
  EXPECT_EQ(capacity->requests, capacity->blocks / 128);
  EXPECT_THAT(format_kv_cache_line(llama, DType::kInt8, DType::kInt4, gib), HasSubstr("int8 (K) / int4 (V), 54,272 B/token"));
  EXPECT_EQ(kv_capacity(llama, DType::kBF16, DType::kBF16, 0, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(format_with_commas(-1234567), "-1,234,567");
  EXPECT_EQ(format_with_commas(999), "999");
}

}  // namespace
}  // namespace pagoda
