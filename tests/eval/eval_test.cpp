// The quality harness against an independent dense reference (tests/model/testing/naive_llama):
// the paged runner's logits, the perplexity protocol, greedy decoding, and agreement, on tiny
// random checkpoints written by the test.

#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/testing/naive_llama.h"
#include "model/testing/tiny_checkpoint.h"
#include "pagoda/eval/agreement.h"
#include "pagoda/eval/log_probs.h"
#include "cpu_paged_runner.h"
#include "pagoda/eval/paged_runner.h"
#include "pagoda/eval/perplexity.h"
#include "pagoda/eval/text_windows.h"

namespace pagoda::eval {
namespace {

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = pick(rng);
  return tokens;
}

// ---------------------------------------------------------------- pure math

TEST(LogProbsTest, LogSumExpIsStableAndExact) {
  const std::vector<float> two_zeros = {0.f, 0.f};
  EXPECT_NEAR(log_sum_exp(two_zeros), std::log(2.0), 1e-12);
  const std::vector<float> large = {1000.f, 1000.f, -1000.f};
  EXPECT_NEAR(log_sum_exp(large), 1000.0 + std::log(2.0), 1e-9);
}

TEST(LogProbsTest, LogSoftmaxNormalises) {
  const std::vector<float> logits = {1.f, 2.f, 3.f, -4.f};
  std::vector<double> logp;
  log_softmax(logits, logp);
  double total = 0;
  for (double x : logp) total += std::exp(x);
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_NEAR(logp[2] - logp[1], 1.0, 1e-12);
}

TEST(LogProbsTest, ArgmaxTakesLowestIndexOnTies) {
  const std::vector<float> logits = {0.f, 3.f, 1.f, 3.f};
  EXPECT_EQ(argmax(logits), 1);
}

TEST(LogProbsTest, KlDivergenceKnownValue) {
  const std::vector<double> p = {std::log(0.5), std::log(0.5)};
  const std::vector<double> q = {std::log(0.9), std::log(0.1)};
  EXPECT_NEAR(kl_divergence(p, q), 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1), 1e-12);
  EXPECT_NEAR(kl_divergence(p, p), 0.0, 1e-15);
  const std::vector<double> with_zero = {0.0, -INFINITY};  // p = (1, 0)
  const std::vector<double> r = {std::log(0.25), std::log(0.75)};
  EXPECT_NEAR(kl_divergence(with_zero, r), std::log(4.0), 1e-12);
}

TEST(TextWindowsTest, ConsecutiveWindowsWithoutOverlap) {
  auto windows = make_windows(10, 4);
  ASSERT_TRUE(windows.ok());
  ASSERT_EQ(windows->size(), 3u);
  EXPECT_EQ((*windows)[2].begin, 8);
  EXPECT_EQ((*windows)[2].length, 2);
  EXPECT_EQ(predicted_tokens(*windows), 3 + 3 + 1);
}

TEST(TextWindowsTest, SingleTokenTailIsDroppedAndBadWindowRejected) {
  auto windows = make_windows(9, 4);
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(windows->size(), 2u);
  EXPECT_EQ(make_windows(9, 1).status().code(), StatusCode::kInvalidArgument);
  auto none = make_windows(1, 4);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// ---------------------------------------------------------------- against the dense reference

class EvalHarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("eval_harness");
    spec_.vocab_size = 96;
    tensors_ = testing::write_tiny_model(dir_, spec_);
    auto model = CpuModel::load(dir_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(*model);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<PagedRunner> make_runner(int32_t block_size, int32_t chunk, int64_t max_tokens) {
    PagedRunnerOptions options;
    options.block_size = block_size;
    options.prefill_chunk = chunk;
    options.max_sequence_tokens = max_tokens;
    auto runner = make_cpu_paged_runner(model_, options);
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
    return runner.ok() ? std::move(*runner) : nullptr;
  }

  std::vector<std::vector<float>> reference_logits(const std::vector<int32_t>& tokens) const {
    return testing::naive_llama_logits(testing::tiny_config_json(spec_), tensors_, tokens);
  }

  std::filesystem::path dir_;
  testing::TinyModelSpec spec_;
  testing::TensorMap tensors_;
  std::shared_ptr<CpuModel> model_;
};

TEST_F(EvalHarnessTest, ScoreMatchesDenseReferenceForAnyChunkAndBlockSize) {
  const auto tokens = random_tokens(29, spec_.vocab_size, 3);
  const auto expected = reference_logits(tokens);
  const size_t vocab = spec_.vocab_size;
  for (int32_t block_size : {1, 4, 16}) {
    for (int32_t chunk : {1, 5, 256}) {
      auto runner = make_runner(block_size, chunk, 64);
      ASSERT_NE(runner, nullptr);
      std::vector<float> logits;
      ASSERT_TRUE(runner->score(tokens, logits).ok());
      ASSERT_EQ(logits.size(), tokens.size() * vocab);
      double worst = 0;
      for (size_t i = 0; i < tokens.size(); ++i)
        for (size_t v = 0; v < vocab; ++v)
          worst = std::max(worst, std::abs(double(logits[i * vocab + v]) - expected[i][v]));
      EXPECT_LT(worst, 2e-4) << "block " << block_size << " chunk " << chunk;
      EXPECT_TRUE(runner->verify_integrity().ok());
    }
  }
}

TEST_F(EvalHarnessTest, PerplexityFollowsTheWindowProtocol) {
  const auto tokens = random_tokens(30, spec_.vocab_size, 5);
  const int32_t window = 7;  // windows of 7,7,7,7,2 tokens -> 6*4 + 1 = 25 predictions
  double nll = 0;
  int64_t count = 0;
  for (size_t begin = 0; begin < tokens.size(); begin += window) {
    const size_t end = std::min(tokens.size(), begin + window);
    if (end - begin < 2) continue;
    const std::vector<int32_t> piece(tokens.begin() + begin, tokens.begin() + end);
    const auto logits = reference_logits(piece);  // each window from an empty cache
    for (size_t i = 0; i + 1 < piece.size(); ++i) {
      nll += log_sum_exp(logits[i]) - logits[i][piece[i + 1]];
      ++count;
    }
  }
  auto runner = make_runner(4, 3, 64);
  ASSERT_NE(runner, nullptr);
  int32_t progress_calls = 0;
  auto result = compute_perplexity(*runner, tokens, window,
                                   [&](int32_t done, int32_t total) {
                                     EXPECT_EQ(total, 5);
                                     EXPECT_EQ(done, ++progress_calls);
                                   });
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->tokens, 25);
  EXPECT_EQ(count, 25);
  EXPECT_EQ(result->windows, 5);
  EXPECT_NEAR(result->mean_nll, nll / count, 1e-5);
  EXPECT_NEAR(result->perplexity, std::exp(nll / count), 1e-4 * std::exp(nll / count));
  EXPECT_GT(result->perplexity, 1.0);
}

TEST_F(EvalHarnessTest, GreedyMatchesRecomputedArgmax) {
  const std::vector<int32_t> prompt = {5, 17, 42, 8, 90, 3, 3};
  auto runner = make_runner(4, 3, 64);
  ASSERT_NE(runner, nullptr);
  auto out = runner->greedy(prompt, 12, {});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->tokens.size(), 12u);
  std::vector<int32_t> sequence = prompt;
  for (size_t step = 0; step < out->tokens.size(); ++step) {
    const auto logits = reference_logits(sequence);
    const int32_t expected = argmax(logits.back());
    EXPECT_EQ(out->tokens[step], expected) << "step " << step;
    sequence.push_back(expected);
  }
  // Stops right after a stop id.
  auto stopped = runner->greedy(prompt, 12, std::vector<int32_t>{out->tokens[2]});
  ASSERT_TRUE(stopped.ok());
  EXPECT_LE(stopped->tokens.size(), 3u);
  EXPECT_EQ(stopped->tokens.back(), out->tokens[2]);
  EXPECT_TRUE(runner->verify_integrity().ok());
}

TEST_F(EvalHarnessTest, IdenticalRunnersAgreeExactly) {
  const auto tokens = random_tokens(40, spec_.vocab_size, 9);
  auto baseline = make_runner(16, 256, 64);
  auto variant = make_runner(16, 256, 64);
  ASSERT_NE(baseline, nullptr);
  ASSERT_NE(variant, nullptr);
  auto result = compute_agreement(*baseline, *variant, tokens, 16);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->tokens, 15 + 15 + 7);
  EXPECT_EQ(result->top1_agreement, 1.0);
  EXPECT_EQ(result->mean_kl, 0.0);
  EXPECT_EQ(result->max_kl, 0.0);
  EXPECT_EQ(result->perplexity_change_percent, 0.0);
}

TEST_F(EvalHarnessTest, AgreementSeesADifferentModel) {
  const std::filesystem::path other_dir = testing::make_temp_dir("eval_harness_other");
  testing::TinyModelSpec other = spec_;
  other.seed = spec_.seed + 100;
  testing::write_tiny_model(other_dir, other);
  auto other_model = CpuModel::load(other_dir);
  ASSERT_TRUE(other_model.ok());
  PagedRunnerOptions options;
  options.max_sequence_tokens = 64;
  auto variant = make_cpu_paged_runner(std::move(*other_model), options);
  ASSERT_TRUE(variant.ok());
  auto baseline = make_runner(16, 256, 64);
  const auto tokens = random_tokens(40, spec_.vocab_size, 9);
  auto result = compute_agreement(*baseline, **variant, tokens, 16);
  ASSERT_TRUE(result.ok());
  EXPECT_LT(result->top1_agreement, 0.5);
  EXPECT_GT(result->mean_kl, 0.01);
  EXPECT_GE(result->max_kl, result->mean_kl);
  EXPECT_NE(result->perplexity_change_percent, 0.0);
  std::filesystem::remove_all(other_dir);
}

TEST_F(EvalHarnessTest, QuantizedKvRunsCloseToBaseline) {
  const auto tokens = random_tokens(40, spec_.vocab_size, 11);
  auto baseline = make_runner(16, 256, 64);
  struct Case {
    std::optional<DType> both, key, value;
    double min_agreement, max_kl;
  };
  // The tiny random model has near-flat distributions, so agreement is looser than on a real one.
  const Case cases[] = {{DType::kBF16, {}, {}, 0.9, 0.01},        {DType::kFP8E4M3, {}, {}, 0.8, 0.05},
                        {DType::kInt8, {}, {}, 0.8, 0.05},        {DType::kInt4, {}, {}, 0.6, 0.2},
                        {{}, DType::kInt8, DType::kInt4, 0.6, 0.2}, {DType::kInt4, DType::kF32, {}, 0.6, 0.2}};
  std::vector<std::unique_ptr<PagedRunner>> variants;
  std::vector<PagedRunner*> pointers;
  for (const Case& c : cases) {
    PagedRunnerOptions options;
    options.max_sequence_tokens = 64;
    options.kv_dtype = c.both;
    options.key_dtype = c.key;
    options.value_dtype = c.value;
    auto variant = make_cpu_paged_runner(model_, options);
    ASSERT_TRUE(variant.ok()) << variant.status().to_string();
    variants.push_back(std::move(*variant));
    pointers.push_back(variants.back().get());
  }
  EXPECT_EQ(variants[4]->key_dtype(), DType::kInt8);
  EXPECT_EQ(variants[4]->value_dtype(), DType::kInt4);
  EXPECT_EQ(variants[5]->key_dtype(), DType::kF32);  // the K override wins over kv_dtype
  EXPECT_EQ(variants[5]->value_dtype(), DType::kInt4);
  auto many = compute_agreement(*baseline, pointers, tokens, 16);
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  ASSERT_EQ(many->size(), std::size(cases));
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(::testing::Message() << "variant " << i);
    const AgreementResult& r = (*many)[i];
    EXPECT_GT(r.top1_agreement, cases[i].min_agreement);
    EXPECT_LT(r.mean_kl, cases[i].max_kl);
    EXPECT_GT(r.mean_kl, 0.0);  // quantized: not bit-identical to the baseline
    // The sweep gives what a one-variant run gives.
    auto fresh = make_runner(16, 256, 64);
    auto single = compute_agreement(*fresh, *variants[i], tokens, 16);
    ASSERT_TRUE(single.ok());
    EXPECT_EQ(single->top1_agreement, r.top1_agreement);
    EXPECT_EQ(single->mean_kl, r.mean_kl);
    EXPECT_EQ(single->variant_perplexity, r.variant_perplexity);
    EXPECT_EQ(single->baseline_perplexity, r.baseline_perplexity);
  }
  EXPECT_EQ(compute_agreement(*baseline, std::span<PagedRunner* const>{}, tokens, 16).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(EvalHarnessTest, BadInputIsRejectedAndLeaksNoBlocks) {
  auto runner = make_runner(4, 8, 32);
  ASSERT_NE(runner, nullptr);
  std::vector<float> logits;
  const std::vector<int32_t> out_of_vocab = {1, 2, 96};
  EXPECT_EQ(runner->score(out_of_vocab, logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->score({}, logits).code(), StatusCode::kInvalidArgument);
  const auto too_long = random_tokens(33, spec_.vocab_size, 1);
  EXPECT_EQ(runner->score(too_long, logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->greedy(random_tokens(30, spec_.vocab_size, 1), 5, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(compute_perplexity(*runner, too_long, 64).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(compute_perplexity(*runner, std::vector<int32_t>{7}, 8).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(runner->verify_integrity().ok());
  // The runner still works at full capacity afterwards: nothing leaked.
  const auto full = random_tokens(32, spec_.vocab_size, 2);
  EXPECT_TRUE(runner->score(full, logits).ok());
  EXPECT_TRUE(runner->score(full, logits).ok());

  PagedRunnerOptions bad;
  bad.block_size = 0;
  EXPECT_EQ(make_cpu_paged_runner(model_, bad).status().code(), StatusCode::kInvalidArgument);
  bad.block_size = 16;
  bad.prefill_chunk = 0;
  EXPECT_EQ(make_cpu_paged_runner(model_, bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagoda::eval
