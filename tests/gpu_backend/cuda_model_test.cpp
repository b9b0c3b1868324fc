// The whole model on the GPU against the CPU reference model (CpuModel, f32) on
// the committed fixtures (tests/fixtures/models/*), and greedy tokens against
// transformers' (expected.json). The GPU runs bf16 weights and activations with
// an f32 residual stream, so logits agree to bf16 tolerance, and greedy tokens
// agree wherever transformers' top-1 margin is larger than that tolerance.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/backend/cpu/cpu_model.h"

namespace pagoda::cuda {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 64;
// Logit error bound: |gpu - cpu| <= kAbsTol + kRelTol * max|cpu logit| of the row set.
constexpr double kAbsTol = 0.02;
constexpr double kRelTol = 0.02;
// Greedy tokens must agree where transformers' top-1 margin exceeds this.
constexpr double kMarginTol = 0.05;

std::filesystem::path fixtures_dir() {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/models";
}

struct Expected {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::vector<double> margin;
};

Expected load_expected(const std::filesystem::path& dir) {
  std::ifstream in(dir / "expected.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  return Expected{j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("greedy_tokens").get<std::vector<int32_t>>(),
                  j.at("top1_margin").get<std::vector<double>>()};
}

std::vector<int32_t> iota_blocks(int32_t first, int32_t count) {
  std::vector<int32_t> blocks(static_cast<size_t>(count));
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

// One sequence: `tokens` appended after `cached` tokens, blocks from `table`.
ForwardBatch single(const std::vector<int32_t>& tokens, int32_t cached, std::vector<int32_t> table,
                    bool all_logits) {
  ForwardBatch b;
  b.token_ids = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(cached + static_cast<int32_t>(i));
  SequenceSlice s;
  s.token_offset = 0;
  s.num_new_tokens = static_cast<int32_t>(tokens.size());
  s.num_cached_tokens = cached;
  s.block_table = std::move(table);
  s.logits_for_all_new_tokens = all_logits;
  b.sequences.push_back(std::move(s));
  return b;
}

int32_t argmax(const float* row, int32_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? 1e30 : d;
  }
  return m;
}

CudaModelOptions small_options(bool graphs = true) {
  CudaModelOptions o;
  o.max_num_tokens = 256;
  o.max_num_seqs = 8;
  o.max_model_len = 512;
  o.block_size = kBlockSize;
  o.use_cuda_graphs = graphs;
  o.show_progress = false;
  return o;
}

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    PAGODA_SKIP_WITHOUT_GPU();
    dir_ = fixtures_dir() / GetParam();
    expected_ = load_expected(dir_);
    auto cpu = CpuModel::load(dir_);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    cpu_ = std::move(cpu).value();
    auto cpu_pool = CpuKvPool::create(cpu_->kv_pool_shape(kNumBlocks, kBlockSize));
    ASSERT_TRUE(cpu_pool.ok()) << cpu_pool.status().to_string();
    cpu_pool_ = std::make_unique<CpuKvPool>(std::move(cpu_pool).value());
    auto gpu = CudaModel::load(dir_, small_options());
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    gpu_ = std::move(gpu).value();
    auto pool = CudaKvPool::create(gpu_->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    pool_ = std::move(pool).value();
  }

  std::filesystem::path dir_;
  Expected expected_;
  std::unique_ptr<CpuModel> cpu_;
  std::unique_ptr<CpuKvPool> cpu_pool_;
  std::unique_ptr<CudaModel> gpu_;
  std::unique_ptr<CudaKvPool> pool_;
};

TEST_P(FixtureTest, PrefillLogitsMatchCpuReference) {
  const int32_t vocab = gpu_->config().vocab_size;
  const ForwardBatch batch = single(expected_.prompt, 0, iota_blocks(0, 8), /*all_logits=*/true);
  std::vector<float> want, got;
  ASSERT_TRUE(cpu_->forward(batch, *cpu_pool_, want).ok());
  const Status s = gpu_->forward(batch, *pool_, got);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(got.size(), want.size());
  const double err = max_diff(got, want), scale = max_abs(want);
  std::cout << "[ figure ] " << GetParam() << " prefill logits: max |gpu - cpu| = " << err << " (max |logit| "
            << scale << ", bound " << kAbsTol + kRelTol * scale << ")\n";
  EXPECT_LE(err, kAbsTol + kRelTol * scale);
  // The last row's argmax is transformers' first greedy token (margin permitting).
  if (expected_.margin[0] > kMarginTol) {
    EXPECT_EQ(argmax(got.data() + got.size() - vocab, vocab), expected_.greedy[0]);
  }
}

TEST_P(FixtureTest, TeacherForcedDecodeAgreesWithCpuAndTransformers) {
  const int32_t vocab = gpu_->config().vocab_size;
  const std::vector<int32_t> table = iota_blocks(0, 8);
  std::vector<float> want, got;
  ASSERT_TRUE(cpu_->forward(single(expected_.prompt, 0, table, false), *cpu_pool_, want).ok());
  ASSERT_TRUE(gpu_->forward(single(expected_.prompt, 0, table, false), *pool_, got).ok());
  int32_t length = static_cast<int32_t>(expected_.prompt.size());
  double worst = 0;
  int disagreements = 0;
  for (size_t step = 0; step < expected_.greedy.size(); ++step) {
    worst = std::max(worst, max_diff(got, want) / (kAbsTol + kRelTol * max_abs(want)));
    const int32_t gpu_token = argmax(got.data(), vocab);
    if (expected_.margin[step] > kMarginTol) {
      EXPECT_EQ(gpu_token, expected_.greedy[step]) << "step " << step << " margin " << expected_.margin[step];
    } else if (gpu_token != expected_.greedy[step]) {
      ++disagreements;  // a near tie: either token is right within tolerance
    }
    if (step + 1 == expected_.greedy.size()) break;
    const ForwardBatch next = single({expected_.greedy[step]}, length, table, false);
    ASSERT_TRUE(cpu_->forward(next, *cpu_pool_, want).ok());
    const Status s = gpu_->forward(next, *pool_, got);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ++length;
  }
  std::cout << "[ figure ] " << GetParam() << " decode: worst error / bound = " << worst
            << ", near-tie disagreements " << disagreements << ", graph replays " << gpu_->graph_replays() << "\n";
  EXPECT_LE(worst, 1.0);
  EXPECT_GT(gpu_->graph_replays(), 0) << "decode steps of batch 1 should replay a CUDA graph";
}

TEST_P(FixtureTest, FreeRunningGreedyOnGpuMatchesTransformers) {
  const std::vector<int32_t> table = iota_blocks(0, 8);
  std::vector<int32_t> tokens;
  ASSERT_TRUE(gpu_->forward_greedy(single(expected_.prompt, 0, table, false), *pool_, tokens).ok());
  int32_t length = static_cast<int32_t>(expected_.prompt.size());
  size_t agreed = 0;
  for (size_t step = 0; step < expected_.greedy.size(); ++step) {
    ASSERT_EQ(tokens.size(), 1u);
    if (tokens[0] != expected_.greedy[step]) {
      // Only a near tie may diverge; after it the continuations differ legitimately.
      EXPECT_LE(expected_.margin[step], kMarginTol) << "step " << step << ": got " << tokens[0] << ", want "
                                                    << expected_.greedy[step];
      break;
    }
    ++agreed;
    const ForwardBatch next = single({tokens[0]}, length++, table, false);
    ASSERT_TRUE(gpu_->forward_greedy(next, *pool_, tokens).ok());
  }
  std::cout << "[ figure ] " << GetParam() << " free-running greedy: " << agreed << "/" << expected_.greedy.size()
            << " tokens equal to transformers\n";
}

TEST_P(FixtureTest, ChunkedPrefillAfterCachedPrefixMatchesOneShot) {
  const int32_t n = static_cast<int32_t>(expected_.prompt.size());
  const int32_t split = n / 2 + 3;  // not on a block boundary
  const std::vector<int32_t> first(expected_.prompt.begin(), expected_.prompt.begin() + split);
  const std::vector<int32_t> rest(expected_.prompt.begin() + split, expected_.prompt.end());
  std::vector<float> whole, part, unused;
  ASSERT_TRUE(gpu_->forward(single(expected_.prompt, 0, iota_blocks(0, 8), true), *pool_, whole).ok());
  ASSERT_TRUE(gpu_->forward(single(first, 0, iota_blocks(20, 8), false), *pool_, unused).ok());
  ASSERT_TRUE(gpu_->forward(single(rest, split, iota_blocks(20, 8), true), *pool_, part).ok());
  const size_t vocab = static_cast<size_t>(gpu_->config().vocab_size);
  const std::vector<float> tail(whole.end() - static_cast<std::ptrdiff_t>(rest.size() * vocab), whole.end());
  ASSERT_EQ(part.size(), tail.size());
  EXPECT_LE(max_diff(part, tail), kAbsTol + kRelTol * max_abs(tail));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         ::testing::Values("llama_f32", "llama3_rope_bf16", "llama_mqa_f16", "mistral_bf16",
                                           "qwen2_tied_bf16", "qwen3_sharded_f32"));

// Several sequences decoding together: graph replay (padded to a bucket) and
// the eager path give the same logits.
TEST(CudaModel, GraphDecodeMatchesEagerDecodeForABatch) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto dir = fixtures_dir() / "llama_f32";
  const Expected e = load_expected(dir);
  auto graphs = CudaModel::load(dir, small_options(true));
  auto eager = CudaModel::load(dir, small_options(false));
  ASSERT_TRUE(graphs.ok() && eager.ok());
  auto pool_a = CudaKvPool::create((*graphs)->kv_pool_shape(kNumBlocks));
  auto pool_b = CudaKvPool::create((*eager)->kv_pool_shape(kNumBlocks));
  ASSERT_TRUE(pool_a.ok() && pool_b.ok());

  // Three sequences with prompts of different lengths, blocks 8 apart.
  const std::vector<int32_t> lengths = {12, 7, 3};
  std::vector<int32_t> current(3);
  for (int s = 0; s < 3; ++s) {
    const std::vector<int32_t> prompt(e.prompt.begin(), e.prompt.begin() + lengths[s]);
    std::vector<int32_t> a, b;
    ASSERT_TRUE((*graphs)->forward_greedy(single(prompt, 0, iota_blocks(8 * s, 8), false), **pool_a, a).ok());
    ASSERT_TRUE((*eager)->forward_greedy(single(prompt, 0, iota_blocks(8 * s, 8), false), **pool_b, b).ok());
    ASSERT_EQ(a, b);
    current[s] = a[0];
  }
  std::vector<int32_t> length = lengths;
  for (int step = 0; step < 6; ++step) {
    ForwardBatch batch;
    for (int s = 0; s < 3; ++s) {
      batch.token_ids.push_back(current[s]);
      batch.positions.push_back(length[s]);
      SequenceSlice slice;
      slice.token_offset = s;
      slice.num_new_tokens = 1;
      slice.num_cached_tokens = length[s]++;
      slice.block_table = iota_blocks(8 * s, 8);
      batch.sequences.push_back(slice);
    }
    std::vector<float> la, lb;
    ASSERT_TRUE((*graphs)->forward(batch, **pool_a, la).ok());
    ASSERT_TRUE((*eager)->forward(batch, **pool_b, lb).ok());
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_LE(max_diff(la, lb), 1e-2 + 1e-2 * max_abs(lb)) << "step " << step;
    const int32_t vocab = (*graphs)->config().vocab_size;
    for (int s = 0; s < 3; ++s) current[s] = argmax(la.data() + s * vocab, vocab);
  }
  EXPECT_GE((*graphs)->graph_replays(), 5);
  EXPECT_EQ((*graphs)->graphs_captured(), 1);  // batch 3 -> bucket 4
  EXPECT_EQ((*eager)->graph_replays(), 0);
}

TEST(CudaModel, RejectsBadBatchesWithClearErrors) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto model = CudaModel::load(fixtures_dir() / "llama_f32", small_options());
  ASSERT_TRUE(model.ok());
  auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
  ASSERT_TRUE(pool.ok());
  std::vector<float> logits;
  Status s = (*model)->forward(single({1, 99999}, 0, {0}, false), **pool, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("99999"), std::string::npos) << s.message();
  s = (*model)->forward(single({1, 2}, 0, {kNumBlocks}, false), **pool, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the pool"), std::string::npos) << s.message();
  s = (*model)->forward(single(std::vector<int32_t>(300, 1), 0, iota_blocks(0, 19), false), **pool, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_num_tokens"), std::string::npos) << s.message();
  s = (*model)->forward(single({1}, 600, iota_blocks(0, 38), false), **pool, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  auto other = CudaKvPool::create(KvPoolShape{1, 4, kBlockSize, 1, 8, DType::kBF16, DType::kBF16});
  ASSERT_TRUE(other.ok());
  s = (*model)->forward(single({1}, 0, {0}, false), **other, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not fit"), std::string::npos) << s.message();
}

ModelConfig small_llama_config() {
  const nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 1000}, {"hidden_size", 256},
      {"intermediate_size", 512}, {"num_hidden_layers", 2}, {"num_attention_heads", 8},
      {"num_key_value_heads", 2}, {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 500000.0}, {"torch_dtype", "bfloat16"}, {"eos_token_id", 2}, {"bos_token_id", 1}};
  auto config = parse_model_config(j, "test config");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return *config;
}

// Every logit of a 5-row prefill (all rows) and `steps` batch-1 decode steps after it (graph replays from the
// second), concatenated into `all`; each decode step's logits finite.
void prefill_then_decode(CudaModel& model, CudaKvPool& pool, int32_t steps, std::vector<float>& all) {
  std::vector<float> logits;
  ASSERT_TRUE(model.forward(single({1, 5, 900, 42, 7}, 0, {0}, true), pool, logits).ok());
  all = logits;
  for (int32_t step = 0; step < steps; ++step) {
    ASSERT_TRUE(model.forward(single({11 + step}, 5 + step, {0}, false), pool, logits).ok());
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    all.insert(all.end(), logits.begin(), logits.end());
  }
}

// CudaModel::create_random with the environment variable `name` set to `value` is refused, naming it.
void expect_refused_naming(const char* name, const char* value, const ModelConfig& config,
                           const CudaModelOptions& options) {
  setenv(name, value, 1);
  auto refused = CudaModel::create_random(config, 7, options);
  unsetenv(name);
  ASSERT_FALSE(refused.ok()) << name << "=" << value << " was accepted";
  EXPECT_NE(refused.status().message().find(name), std::string::npos) << refused.status().to_string();
}

TEST(CudaModel, RandomWeightsAreReproducibleAndFinite) {
  PAGODA_SKIP_WITHOUT_GPU();
  const ModelConfig config = small_llama_config();
  std::vector<std::vector<float>> results;
  for (uint64_t seed : {7u, 7u, 8u}) {
    auto model = CudaModel::create_random(config, seed, small_options());
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_GT((*model)->weight_bytes(), 2u * 1000 * 256 * 2);
    auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool.ok());
    std::vector<float> logits;
    const std::vector<int32_t> prompt = {1, 5, 900, 42, 7};
    ASSERT_TRUE((*model)->forward(single(prompt, 0, {0}, false), **pool, logits).ok());
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    results.push_back(logits);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_NE(results[0], results[2]);
}

// The GEMV dispatch (gemv.h) inside the model: a bad threshold is refused naming the option or the
// environment variable, and with the GEMV on every step (up to 8 rows) a prefill of 5 rows and graph-
// replayed batch-1 decode steps give the cuBLASLt path's logits up to summation order and bf16 rounding.
TEST(CudaModel, GemvDispatchIsValidatedAndMatchesTheGemm) {
  PAGODA_SKIP_WITHOUT_GPU();
  const ModelConfig config = small_llama_config();
  CudaModelOptions bad = small_options();
  bad.gemv_max_rows = 9;
  auto refused = CudaModel::create_random(config, 7, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("gemv_max_rows"), std::string::npos) << refused.status().to_string();
  expect_refused_naming("PAGODA_GEMV_MAX_ROWS", "two", config, small_options());

  std::vector<std::vector<float>> runs;
  for (const int32_t rows : {0, kGemvMaxRows}) {
    CudaModelOptions options = small_options();
    options.gemv_max_rows = rows;
    auto model = CudaModel::create_random(config, 7, options);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool.ok());
    std::vector<float> all;
    prefill_then_decode(**model, **pool, 4, all);
    EXPECT_GT((*model)->graph_replays(), 0);
    runs.push_back(std::move(all));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  double max_diff = 0, max_logit = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(runs[0][i] - runs[1][i])));
    max_logit = std::max(max_logit, static_cast<double>(std::fabs(runs[0][i])));
  }
  std::cout << "[ figure ] GEMV vs cuBLASLt in the model: max |logit diff| " << max_diff << " (max |logit| "
            << max_logit << ")\n";
  EXPECT_LE(max_diff, 0.02 + 0.02 * max_logit);
}

// The e4m3 lm_head (CudaModelOptions::fp8_lm_head) in a model with fp8 projections: a bad
// PAGODA_FP8_LM_HEAD or PAGODA_FP8_LM_HEAD_GEMM is refused naming it; graph-replayed batch-1 decode steps
// (the fp8 GEMV head) and a 12-row prefill (the fp8 GEMM head, per-token activations, f32 logits; a vocabulary
// of 1,024, as the GEMM needs multiples of 16) differ from the bf16 head's logits, within cuda_model_fp8_test's bound 3 x (0.05 + 0.03 max|logit|); with
// PAGODA_FP8_LM_HEAD_GEMM=0 the prefill takes the bf16 GEMM head again (the same bits as the head off).
TEST(CudaModel, Fp8LmHeadMatchesTheBf16LmHead) {
  PAGODA_SKIP_WITHOUT_GPU();
  ModelConfig config = small_llama_config();
  config.vocab_size = 1024;  // the fp8 GEMM head needs a multiple of 16 (1,000 keeps the bf16 GEMM)
  CudaModelOptions fp8 = small_options();
  fp8.fp8_weights = true;
  fp8.max_num_seqs = 16;  // the head runs max_num_seqs rows at a time: the 12-row prefill's in one GEMM
  auto probe = CudaModel::create_random(config, 7, fp8);
  if (!probe.ok()) GTEST_SKIP() << "no fp8 weights on this device: " << probe.status().to_string();
  probe->reset();
  expect_refused_naming("PAGODA_FP8_LM_HEAD", "yes", config, fp8);
  expect_refused_naming("PAGODA_FP8_LM_HEAD_GEMM", "on", config, fp8);

  // Runs: bf16 head; e4m3 head (GEMV + GEMM); e4m3 head with the GEMM rows on the bf16 head.
  std::vector<std::vector<float>> prefills, decodes;
  for (const int run : {0, 1, 2}) {
    CudaModelOptions options = fp8;
    options.fp8_lm_head = run > 0;
    if (run == 2) setenv("PAGODA_FP8_LM_HEAD_GEMM", "0", 1);
    auto model = CudaModel::create_random(config, 7, options);
    unsetenv("PAGODA_FP8_LM_HEAD_GEMM");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool.ok());
    std::vector<float> logits, decode;
    // 12 rows in one head call: above the tensor-core GEMV's 8 (fp8_mma_gemv.h), so the prefill's head is the GEMM.
    ASSERT_TRUE((*model)->forward(single({1, 5, 900, 42, 7, 3, 8, 13, 21, 34, 55, 89}, 0, {0}, true), **pool, logits)
                    .ok());
    prefills.push_back(logits);
    for (int32_t step = 0; step < 4; ++step) {
      ASSERT_TRUE((*model)->forward(single({11 + step}, 12 + step, {0}, false), **pool, logits).ok());
      for (float x : logits) ASSERT_TRUE(std::isfinite(x));
      decode.insert(decode.end(), logits.begin(), logits.end());
    }
    EXPECT_GT((*model)->graph_replays(), 0);
    decodes.push_back(std::move(decode));
  }
  EXPECT_EQ(prefills[0], prefills[2]);
  EXPECT_EQ(decodes[1], decodes[2]);
  auto compare = [](const std::vector<float>& bf16_head, const std::vector<float>& fp8_head, const char* what) {
    ASSERT_EQ(bf16_head.size(), fp8_head.size());
    double max_diff = 0, max_logit = 0;
    for (size_t i = 0; i < bf16_head.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(bf16_head[i] - fp8_head[i])));
      max_logit = std::max(max_logit, static_cast<double>(std::fabs(bf16_head[i])));
    }
    std::cout << "[ figure ] fp8 vs bf16 lm_head, " << what << ": max |logit diff| " << max_diff
              << " (max |logit| " << max_logit << ")\n";
    EXPECT_GT(max_diff, 0.0) << what;  // the fp8 head ran
    EXPECT_LE(max_diff, 3.0 * (0.05 + 0.03 * max_logit)) << what;
  };
  compare(decodes[0], decodes[1], "batch-1 decode (GEMV)");
  compare(prefills[0], prefills[1], "12-row prefill (GEMM)");
}

// small_options() with bf16 projections + bf16 KV, or fp8 projections + fp8 KV; false where this device
// has no fp8.
bool decode_fusion_options(const ModelConfig& config, bool fp8, CudaModelOptions& options) {
  options = small_options();
  options.fp8_weights = fp8;
  if (!fp8) return true;
  options.kv_key_dtype = DType::kFP8E4M3;
  options.kv_value_dtype = DType::kFP8E4M3;
  return CudaModel::create_random(config, 7, options).ok();
}

struct FusionRun {
  std::vector<float> logits;  // prefill_then_decode's, 6 decode steps
  int64_t silu_launches = -1;
};

// prefill_then_decode on a random model made with the environment variables `env` set (name, value).
FusionRun run_with_env(const ModelConfig& config, const CudaModelOptions& options,
                       const std::vector<std::pair<const char*, const char*>>& env) {
  FusionRun out;
  for (const auto& [name, value] : env) setenv(name, value, 1);
  auto model = CudaModel::create_random(config, 7, options);
  for (const auto& [name, value] : env) unsetenv(name);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return out;
  auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
  EXPECT_TRUE(pool.ok());
  if (!pool.ok()) return out;
  prefill_then_decode(**model, **pool, 6, out.logits);
  EXPECT_GT((*model)->graph_replays(), 0);
  out.silu_launches = (*model)->gemv_silu_launches();
  return out;
}

// The decode fusions PAGODA_FUSE_ROPE_KV (rope_qk_kv_write, off by default) and PAGODA_FUSE_SILU_GEMV (SiLU-mul
// in the gate_up GEMV's epilogue, on by default): a bad value is refused naming the variable; with bf16
// projections + bf16 KV and with fp8 projections + fp8 KV, a 5-row prefill (unfused either way) and
// graph-replayed batch-1 decode steps give the same logits bit for bit with each fusion on, both off, and
// by default; the SiLU epilogue ran exactly where it is on.
TEST(CudaModel, DecodeFusionsMatchTheUnfusedModelBitForBit) {
  PAGODA_SKIP_WITHOUT_GPU();
  const ModelConfig config = small_llama_config();
  expect_refused_naming("PAGODA_FUSE_ROPE_KV", "on", config, small_options());
  expect_refused_naming("PAGODA_FUSE_SILU_GEMV", "yes", config, small_options());
  for (const bool fp8 : {false, true}) {
    CudaModelOptions base;
    if (!decode_fusion_options(config, fp8, base)) continue;  // no fp8 on this device
    const char* what = fp8 ? "fp8" : "bf16";
    auto run = [&](const char* rope_kv, const char* silu) {
      return run_with_env(config, base, {{"PAGODA_FUSE_ROPE_KV", rope_kv}, {"PAGODA_FUSE_SILU_GEMV", silu}});
    };
    const FusionRun unfused = run("0", "0"), rope_kv = run("1", "0"), silu = run("0", "1");
    const FusionRun by_default = run_with_env(config, base, {});
    EXPECT_EQ(rope_kv.logits, unfused.logits) << what;
    EXPECT_EQ(silu.logits, unfused.logits) << what;
    EXPECT_EQ(by_default.logits, unfused.logits) << what;
    EXPECT_EQ(unfused.silu_launches, 0) << what;
    EXPECT_EQ(rope_kv.silu_launches, 0) << what;
    EXPECT_GE(silu.silu_launches, config.num_layers) << what;  // every layer of the decode graph's capture at least
    EXPECT_EQ(by_default.silu_launches, silu.silu_launches) << what;
  }
}

// The tensor-core fp8 GEMV (fp8_mma_gemv.h; PAGODA_FP8_MMA_GEMV_ROWS, 8 by default): a bad row count is
// refused naming the variable; with fp8 projections + fp8 KV, a 5-row prefill and graph-replayed batch-1
// decode steps on it (every projection and the e4m3 lm_head; no weight-only GEMV) give cuBLASLt's logits (rows
// 0: the same quantized operands) within 2 x (0.05 + 0.03 max|logit|): summation order and bf16 rounding, which
// the next layer's e4m3 activations amplify where a value crosses a rounding boundary (measured 0.065 at max
// |logit| 1.23 on an H100, where the bf16 GEMV vs GEMM test sees 4e-7); and it really ran.
TEST(CudaModel, Fp8MmaGemvMatchesTheFp8Gemm) {
  PAGODA_SKIP_WITHOUT_GPU();
  ModelConfig config = small_llama_config();
  config.vocab_size = 1024;  // cuBLASLt's fp8 head needs a multiple of 16: both runs on an e4m3 head
  CudaModelOptions base = small_options();
  base.fp8_weights = true;
  base.kv_key_dtype = DType::kFP8E4M3;
  base.kv_value_dtype = DType::kFP8E4M3;
  if (!CudaModel::create_random(config, 7, base).ok()) GTEST_SKIP() << "no fp8 on this device";
  expect_refused_naming("PAGODA_FP8_MMA_GEMV_ROWS", "9", config, base);
  expect_refused_naming("PAGODA_FP8_MMA_GEMV_ROWS", "all", config, base);
  std::vector<std::vector<float>> runs;
  std::vector<int64_t> launches;
  for (const char* rows : std::vector<const char*>{"0", nullptr}) {  // null: the default
    CudaModelOptions options = base;
    options.gemv_max_rows = 0;
    if (rows != nullptr) setenv("PAGODA_FP8_MMA_GEMV_ROWS", rows, 1);
    auto model = CudaModel::create_random(config, 7, options);
    unsetenv("PAGODA_FP8_MMA_GEMV_ROWS");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool.ok());
    std::vector<float> all;
    prefill_then_decode(**model, **pool, 6, all);
    EXPECT_GT((*model)->graph_replays(), 0);
    runs.push_back(std::move(all));
    launches.push_back((*model)->fp8_mma_gemv_launches());
  }
  EXPECT_EQ(launches[0], 0);
  // The prefill (4 projections a layer + the head) and at least one decode capture.
  EXPECT_GE(launches[1], 2 * (4 * config.num_layers + 1));
  ASSERT_EQ(runs[0].size(), runs[1].size());
  double max_diff = 0, max_logit = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(runs[0][i] - runs[1][i])));
    max_logit = std::max(max_logit, static_cast<double>(std::fabs(runs[0][i])));
  }
  std::cout << "[ figure ] tensor-core fp8 GEMV vs cuBLASLt in the model: max |logit diff| " << max_diff
            << " (max |logit| " << max_logit << ")\n";
  EXPECT_LE(max_diff, 2.0 * (0.05 + 0.03 * max_logit));
}

// PAGODA_FUSE_FP8_QUANT (on by default): the fp8 GEMMs' per-token input quantization inside the norms and the
// SiLU (add_rmsnorm_fp8, silu_mul_fp8). A bad value is refused naming the variable; with fp8 projections + fp8
// KV and no GEMV (gemv_max_rows 0, so decode steps quantize too), two prefills and graph-replayed batch-2
// decode steps give the same logits bit for bit fused (=1, the default) and unfused (=0), and the fused run
// really took the fused kernels (3 per layer and step) while the unfused one did not.
TEST(CudaModel, FusedFp8QuantizationMatchesTheUnfusedModelBitForBit) {
  PAGODA_SKIP_WITHOUT_GPU();
  const ModelConfig config = small_llama_config();
  expect_refused_naming("PAGODA_FUSE_FP8_QUANT", "yes", config, small_options());
  CudaModelOptions base = small_options();
  base.fp8_weights = true;
  base.kv_key_dtype = DType::kFP8E4M3;
  base.kv_value_dtype = DType::kFP8E4M3;
  base.gemv_max_rows = 0;
  if (!CudaModel::create_random(config, 7, base).ok()) GTEST_SKIP() << "no fp8 on this device";
  auto run = [&](const char* fuse, std::vector<float>& all, int64_t& fused_launches) {  // fuse null: the default
    if (fuse != nullptr) setenv("PAGODA_FUSE_FP8_QUANT", fuse, 1);
    auto model = CudaModel::create_random(config, 7, base);
    unsetenv("PAGODA_FUSE_FP8_QUANT");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto pool = CudaKvPool::create((*model)->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool.ok());
    std::vector<float> logits;
    ASSERT_TRUE((*model)->forward(single({1, 5, 900, 42, 7}, 0, iota_blocks(0, 8), true), **pool, logits).ok());
    all = logits;
    ASSERT_TRUE((*model)->forward(single({3, 8, 13, 21, 34, 55, 89, 144, 233}, 0, iota_blocks(8, 8), false), **pool,
                                  logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
    std::vector<int32_t> length = {5, 9};
    for (int32_t step = 0; step < 6; ++step) {
      ForwardBatch batch;
      for (int s = 0; s < 2; ++s) {
        batch.token_ids.push_back(11 + step + 100 * s);
        batch.positions.push_back(length[s]);
        SequenceSlice slice;
        slice.token_offset = s;
        slice.num_new_tokens = 1;
        slice.num_cached_tokens = length[s]++;
        slice.block_table = iota_blocks(8 * s, 8);
        batch.sequences.push_back(slice);
      }
      ASSERT_TRUE((*model)->forward(batch, **pool, logits).ok());
      for (float x : logits) ASSERT_TRUE(std::isfinite(x));
      all.insert(all.end(), logits.begin(), logits.end());
    }
    EXPECT_GT((*model)->graph_replays(), 0);
    fused_launches = (*model)->fused_fp8_quant_launches();
  };
  std::vector<float> unfused, fused, by_default;
  int64_t unfused_launches = -1, fused_launches = -1, default_launches = -1;
  run("0", unfused, unfused_launches);
  run("1", fused, fused_launches);
  run(nullptr, by_default, default_launches);
  EXPECT_EQ(fused, unfused);
  EXPECT_EQ(by_default, fused);
  EXPECT_EQ(unfused_launches, 0);
  // Two eager prefills and at least one captured decode step, 3 fused launches per layer each.
  EXPECT_GE(fused_launches, 3 * 3 * config.num_layers);
  EXPECT_EQ(default_launches, fused_launches);
}

// backend/cuda/attention's Hopper attention (eager steps) against the backend's own kernel
// inside the same model, for a head_dim it supports: two prefills in one step,
// a mixed step (decode + chunk after a cached prefix), and a pure decode step.
TEST(CudaModel, FastAttentionMatchesBuiltinAttentionInTheModel) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 512}, {"hidden_size", 512},
      {"intermediate_size", 1024}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 500000.0}, {"torch_dtype", "bfloat16"}};
  auto config = parse_model_config(j, "test config");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  ASSERT_EQ(config->head_dim, 128);
  CudaModelOptions options = small_options(/*graphs=*/false);
  auto fast = CudaModel::create_random(*config, 11, options);
  options.fast_attention = false;
  auto builtin = CudaModel::create_random(*config, 11, options);
  ASSERT_TRUE(fast.ok() && builtin.ok());
  auto pool_a = CudaKvPool::create((*fast)->kv_pool_shape(kNumBlocks));
  auto pool_b = CudaKvPool::create((*builtin)->kv_pool_shape(kNumBlocks));
  ASSERT_TRUE(pool_a.ok() && pool_b.ok());

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, 511);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = token(rng);
    return t;
  };
  const auto append = testing::append_sequence;
  auto compare = [&](const ForwardBatch& b, const char* what) {
    std::vector<float> la, lb;
    const Status sa = (*fast)->forward(b, **pool_a, la);
    const Status sb = (*builtin)->forward(b, **pool_b, lb);
    ASSERT_TRUE(sa.ok()) << sa.to_string();
    ASSERT_TRUE(sb.ok()) << sb.to_string();
    const double err = max_diff(la, lb), scale = max_abs(lb);
    std::cout << "[ figure ] fast vs builtin attention, " << what << ": max diff " << err << " (max |logit| " << scale
              << ")\n";
    EXPECT_LE(err, 1e-3 + 0.03 * scale) << what;
  };
  ForwardBatch prefill;
  append(prefill, tokens(37), 0, iota_blocks(0, 8), true);
  append(prefill, tokens(20), 0, iota_blocks(8, 8), true);
  compare(prefill, "two prefills");
  ForwardBatch mixed;
  append(mixed, tokens(1), 37, iota_blocks(0, 8), false);
  append(mixed, tokens(5), 20, iota_blocks(8, 8), true);
  compare(mixed, "decode + chunk after a cached prefix");
  ForwardBatch decode;
  append(decode, tokens(1), 38, iota_blocks(0, 8), false);
  append(decode, tokens(1), 25, iota_blocks(8, 8), false);
  compare(decode, "pure decode");
  EXPECT_EQ((*fast)->fast_attention_steps(), 3);
  EXPECT_EQ((*builtin)->fast_attention_steps(), 0);
}

TEST(CudaModelRunner, CopiedBlocksDecodeLikeTheOriginals) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto dir = fixtures_dir() / "mistral_bf16";
  const Expected e = load_expected(dir);
  auto model = CudaModel::load(dir, small_options());
  ASSERT_TRUE(model.ok());
  CudaRunnerOptions options;
  options.num_blocks = kNumBlocks;
  options.print_report = false;
  auto runner = CudaModelRunner::create(std::move(model).value(), options);
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  EXPECT_EQ((*runner)->num_blocks(), kNumBlocks);
  EXPECT_EQ((*runner)->vocab_size(), 256);
  const int32_t n = static_cast<int32_t>(e.prompt.size());
  const int32_t blocks = (n + 1 + kBlockSize - 1) / kBlockSize;
  ASSERT_TRUE((*runner)->execute(single(e.prompt, 0, iota_blocks(0, blocks), false), {}).ok());
  std::vector<runtime::BlockCopy> copies;
  for (int32_t b = 0; b < blocks; ++b) copies.push_back({b, 30 + b});
  ASSERT_TRUE((*runner)->copy_blocks(copies).ok());
  auto original = (*runner)->execute(single({e.greedy[0]}, n, iota_blocks(0, blocks), false), {});
  auto copied = (*runner)->execute(single({e.greedy[0]}, n, iota_blocks(30, blocks), false), {});
  ASSERT_TRUE(original.ok() && copied.ok());
  EXPECT_EQ(original->host_logits, copied->host_logits);
  auto greedy = (*runner)->execute_greedy(single({e.greedy[0]}, n, iota_blocks(30, blocks), false));
  ASSERT_TRUE(greedy.ok());
  EXPECT_EQ((*greedy)[0], argmax(original->host_logits.data(), 256));
  EXPECT_FALSE((*runner)->copy_blocks(std::vector<runtime::BlockCopy>{{0, kNumBlocks}}).ok());
}

TEST(CudaModelRunner, SizesThePoolFromFreeMemory) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto model = CudaModel::load(fixtures_dir() / "llama_f32", small_options());
  ASSERT_TRUE(model.ok());
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  CudaRunnerOptions options;
  // Leave all but ~1 GiB of what is free now, so the test stays small.
  options.gpu_memory_utilization = std::min(1.0, (double(total_bytes - free_bytes) + (1u << 30)) / total_bytes);
  options.print_report = false;
  auto runner = CudaModelRunner::create(std::move(model).value(), options);
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  const KvPoolShape& shape = (*runner)->pool().shape();
  const double pool_gib = double((*runner)->pool().total_bytes()) / (1u << 30);
  std::cout << "[ figure ] " << (*runner)->kv_pool_report() << "\n";
  EXPECT_GT(shape.num_blocks, 0);
  EXPECT_LE(pool_gib, 1.01);
  EXPECT_GT(pool_gib, 0.5);
  EXPECT_NE((*runner)->kv_pool_report().find("KV pool:"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::cuda
