// The paged CPU forward against a plain dense forward (testing/naive_llama.h),
// for every architecture and weight dtype, through prefill, chunked prefill
// after cached tokens, decode, several sequences per batch, and scattered
// block tables of several block sizes.

#include "pagoda/backend/cpu/cpu_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/testing/naive_llama.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"
#include "model/testing/tiny_checkpoint.h"

namespace pagoda {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// A block table of distinct, shuffled block ids so no test passes by accident of contiguity.
std::vector<int32_t> scattered_blocks(int32_t count, int32_t pool_blocks, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  ids.resize(static_cast<size_t>(count));
  return ids;
}

// Max |a - b| over a row, relative to the row's scale.
double max_abs_diff(const float* a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < b.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// Runs `tokens` through the model in chunks (chunk sizes cycle), returning the logits of every position.
std::vector<std::vector<float>> run_chunked(CpuModel& model, CpuKvPool& pool, const std::vector<int32_t>& tokens,
                                            const std::vector<int32_t>& chunks, const std::vector<int32_t>& blocks) {
  const int32_t vocab = model.config().vocab_size;
  std::vector<std::vector<float>> out;
  int32_t done = 0;
  size_t c = 0;
  while (done < static_cast<int32_t>(tokens.size())) {
    const int32_t n = std::min<int32_t>(chunks[c++ % chunks.size()], static_cast<int32_t>(tokens.size()) - done);
    ForwardBatch batch;
    batch.token_ids.assign(tokens.begin() + done, tokens.begin() + done + n);
    for (int32_t i = 0; i < n; ++i) batch.positions.push_back(done + i);
    SequenceSlice s;
    s.num_new_tokens = n;
    s.num_cached_tokens = done;
    s.block_table = blocks;
    s.logits_for_all_new_tokens = true;
    batch.sequences.push_back(s);
    std::vector<float> logits;
    Status st = model.forward(batch, pool, logits);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return out;
    for (int32_t i = 0; i < n; ++i) out.emplace_back(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    done += n;
  }
  return out;
}

struct Variant {
  std::string name;
  testing::TinyModelSpec spec;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> variants() {
  std::vector<Variant> v;
  auto add = [&](std::string name, auto tweak) {
    testing::TinyModelSpec s;
    tweak(s);
    v.push_back({std::move(name), s});
  };
  add("llama_gqa_f32", [](auto&) {});
  add("llama_mha_bf16", [](auto& s) { s.dtype = DType::kBF16; s.num_kv_heads = 4; });
  add("llama_mqa_f16", [](auto& s) { s.dtype = DType::kF16; s.num_kv_heads = 1; });
  add("llama3_rope", [](auto& s) { s.llama3_rope = true; s.rope_theta = 500000.0f; });
  add("llama3_rope_parameters", [](auto& s) { s.llama3_rope = true; s.rope_parameters_style = true; });
  add("mistral_bf16", [](auto& s) { s.architecture = "MistralForCausalLM"; s.dtype = DType::kBF16; });
  add("qwen2_tied_bias", [](auto& s) { s.architecture = "Qwen2ForCausalLM"; s.tie_word_embeddings = true; });
  add("qwen3_head_dim_sharded", [](auto& s) {
    s.architecture = "Qwen3ForCausalLM"; s.head_dim = 16; s.num_shards = 2; s.rope_theta = 1e6f;
  });
  return v;
}

class CpuModelVsNaiveTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("cpu_model"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_P(CpuModelVsNaiveTest, PagedForwardMatchesDenseReference) {
  const testing::TinyModelSpec& spec = GetParam().spec;
  const auto tensors = testing::write_tiny_model(dir_, spec);
  WeightLoadOptions zero_copy;  // exercise the tile-converting GEMM for f16/bf16 weights
  zero_copy.f32_cache_bytes = 0;
  // The dense reference is f32 throughout: pinned to the exact path (the bf16 prefill GEMM, the default
  // where the CPU has it, rounds activations to bf16; bf16_prefill_tests bound it).
  const kernels::ScopedBf16Gemm exact(false);
  auto model = CpuModel::load(dir_, zero_copy);
  ASSERT_TRUE(model.ok()) << model.status().to_string();

  const auto tokens = random_tokens(23, spec.vocab_size, spec.seed + 7);
  const auto expected = testing::naive_llama_logits(testing::tiny_config_json(spec), tensors, tokens);

  // Block size 3 with a prefill of 5 (ends mid-block), chunks of 4 and 2, then decodes of 1.
  for (int32_t block_size : {16, 3, 1}) {
    const int32_t blocks = (static_cast<int32_t>(tokens.size()) + block_size - 1) / block_size;
    auto pool = CpuKvPool::create((*model)->kv_pool_shape(blocks + 5, block_size));
    ASSERT_TRUE(pool.ok());
    const auto table = scattered_blocks(blocks, blocks + 5, 100 + block_size);
    const auto got = run_chunked(**model, *pool, tokens, {5, 4, 2, 1, 1, 1}, table);
    ASSERT_EQ(got.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      double scale = 0;
      for (float x : expected[i]) scale = std::max(scale, std::abs(static_cast<double>(x)));
      EXPECT_LT(max_abs_diff(got[i].data(), expected[i]), 2e-4 * std::max(1.0, scale))
          << GetParam().name << " block_size " << block_size << " position " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuModelVsNaiveTest, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

class CpuModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("cpu_model");
    spec_.dtype = DType::kBF16;
    testing::write_tiny_model(dir_, spec_);
    auto model = CpuModel::load(dir_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(*model);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  testing::TinyModelSpec spec_;
  std::unique_ptr<CpuModel> model_;
};

// Two sequences in one batch (a prefill chunk after cached tokens and a decode)
// give the same logits as each run alone.
TEST_F(CpuModelTest, MixedBatchEqualsSeparateRuns) {
  const int32_t block_size = 4, vocab = spec_.vocab_size;
  const auto a = random_tokens(13, vocab, 1), b = random_tokens(9, vocab, 2);
  const std::vector<int32_t> table_a = {7, 2, 11, 5}, table_b = {0, 9, 3};

  auto alone = CpuKvPool::create(model_->kv_pool_shape(12, block_size));
  ASSERT_TRUE(alone.ok());
  const auto ref_a = run_chunked(*model_, *alone, a, {13}, table_a);
  const auto ref_b = run_chunked(*model_, *alone, b, {9}, table_b);

  auto pool = CpuKvPool::create(model_->kv_pool_shape(12, block_size));
  ASSERT_TRUE(pool.ok());
  // Cache a[0:6] and b[0:8] first.
  run_chunked(*model_, *pool, {a.begin(), a.begin() + 6}, {6}, table_a);
  run_chunked(*model_, *pool, {b.begin(), b.begin() + 8}, {8}, table_b);

  ForwardBatch batch;
  SequenceSlice sa, sb;
  sa.token_offset = 0, sa.num_new_tokens = 7, sa.num_cached_tokens = 6, sa.block_table = table_a;
  sa.logits_for_all_new_tokens = true;
  sb.token_offset = 7, sb.num_new_tokens = 1, sb.num_cached_tokens = 8, sb.block_table = table_b;
  for (int32_t i = 6; i < 13; ++i) batch.token_ids.push_back(a[i]), batch.positions.push_back(i);
  batch.token_ids.push_back(b[8]), batch.positions.push_back(8);
  batch.sequences = {sa, sb};
  ASSERT_EQ(batch.num_logit_rows(), 8);
  std::vector<float> logits;
  ASSERT_TRUE(model_->forward(batch, *pool, logits).ok());
  ASSERT_EQ(logits.size(), 8u * vocab);
  for (int32_t i = 0; i < 7; ++i)
    EXPECT_LT(max_abs_diff(logits.data() + i * vocab, ref_a[6 + i]), 1e-4) << "a row " << i;
  EXPECT_LT(max_abs_diff(logits.data() + 7 * vocab, ref_b[8]), 1e-4);
}

TEST_F(CpuModelTest, LogitsOnlyForRequestedRows) {
  // lm_head over all 6 rows (prefill GEMM) against the last row alone (decode dot path): equal to 1e-5 on
  // the exact path only (the bf16 GEMM rounds activations), so pinned to it.
  const kernels::ScopedBf16Gemm exact(false);
  auto pool = CpuKvPool::create(model_->kv_pool_shape(4, 16));
  ASSERT_TRUE(pool.ok());
  const auto tokens = random_tokens(6, spec_.vocab_size, 3);
  const auto all = run_chunked(*model_, *pool, tokens, {6}, {1});
  ForwardBatch batch;
  batch.token_ids = tokens;
  for (int32_t i = 0; i < 6; ++i) batch.positions.push_back(i);
  SequenceSlice s;
  s.num_new_tokens = 6;
  s.block_table = {2};
  batch.sequences = {s};  // default: last token only
  std::vector<float> logits;
  ASSERT_TRUE(model_->forward(batch, *pool, logits).ok());
  ASSERT_EQ(logits.size(), static_cast<size_t>(spec_.vocab_size));
  EXPECT_LT(max_abs_diff(logits.data(), all[5]), 1e-5);
  batch.sequences[0].logits_for_last_token = false;
  ASSERT_TRUE(model_->forward(batch, *pool, logits).ok());
  EXPECT_TRUE(logits.empty());
}

TEST_F(CpuModelTest, RejectsInconsistentBatches) {
  auto pool = CpuKvPool::create(model_->kv_pool_shape(4, 4));
  ASSERT_TRUE(pool.ok());
  auto good = [] {
    ForwardBatch b;
    b.token_ids = {1, 2, 3, 4, 5};
    b.positions = {0, 1, 2, 3, 4};
    SequenceSlice s;
    s.num_new_tokens = 5;
    s.block_table = {0, 1};
    b.sequences = {s};
    return b;
  };
  std::vector<float> logits;
  ASSERT_TRUE(model_->forward(good(), *pool, logits).ok());

  struct Case {
    const char* expect;
    std::function<void(ForwardBatch&)> breakit;
  };
  const std::vector<Case> cases = {
      {"outside the vocabulary", [](ForwardBatch& b) { b.token_ids[2] = 96; }},
      {"token ids but", [](ForwardBatch& b) { b.positions.pop_back(); }},
      {"needs 2 blocks", [](ForwardBatch& b) { b.sequences[0].block_table = {0}; }},
      {"outside the pool", [](ForwardBatch& b) { b.sequences[0].block_table = {0, 4}; }},
      {"sequences cover 4 tokens", [](ForwardBatch& b) { b.sequences[0].num_new_tokens = 4; }},
      {"num_new_tokens 0", [](ForwardBatch& b) { b.sequences[0].num_new_tokens = 0; }},
      {"negative position", [](ForwardBatch& b) { b.positions[0] = -1; }},
  };
  for (const auto& c : cases) {
    ForwardBatch b = good();
    c.breakit(b);
    Status s = model_->forward(b, *pool, logits);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.expect;
    EXPECT_THAT(s.message(), HasSubstr(c.expect));
  }
  auto wrong_pool = CpuKvPool::create(KvPoolShape{1, 4, 4, 2, 8});
  ASSERT_TRUE(wrong_pool.ok());
  EXPECT_THAT(model_->forward(good(), *wrong_pool, logits).message(), HasSubstr("does not fit the model"));
}

TEST(CpuKvPoolTest, F32PoolLayoutAndZeroBlock) {
  KvPoolShape shape{2, 4, 16, 2, 8};
  EXPECT_EQ(shape.bytes_per_token(), 2u * 2 * 2 * 8 * 4);
  auto pool = CpuKvPool::create(shape);
  ASSERT_TRUE(pool.ok());
  auto layer = pool->layer(1);
  layer.key_f32()[3 * 16 * 2 * 8] = 5.0f;  // block 3
  pool->zero_block(3);
  EXPECT_EQ(layer.key_f32()[3 * 16 * 2 * 8], 0.0f);
}

}  // namespace
}  // namespace pagoda
