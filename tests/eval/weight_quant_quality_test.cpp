// --quantization int8|int4|fp8 on the bundled model (models/pagoda-tiny) and real
// held-out text, against the model as loaded (bf16 weights, f32 compute):
// perplexity change within the issue's goals (int8 +0.5%, int4 +3%), top-1
// agreement and KL bounds measured on this model, through prefill (dequantized
// tiles + sgemm) and through decode (one token per forward: the integer dot
// kernels); --quantization fp8 (per-channel e4m3 weights, activations rounded
// to fp8 per token) against the issue's 1% perplexity goal. Plus the errors:
// quantizing twice, an unsupported dtype.

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpu_paged_runner.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/eval/agreement.h"
#include "pagoda/eval/paged_runner.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::eval {
namespace {

const std::filesystem::path kModelDir = std::filesystem::path(PAGODA_SOURCE_DIR) / "models/pagoda-tiny";

std::vector<int32_t> heldout_tokens(size_t n) {
  auto tok = tokenizer::Tokenizer::load(kModelDir);
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return {};
  std::ifstream in(kModelDir / "heldout.txt", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> tokens = (*tok)->encode(text.str(), /*add_special_tokens=*/false);
  EXPECT_GT(tokens.size(), n);
  tokens.resize(std::min(n, tokens.size()));
  return tokens;
}

std::shared_ptr<CpuModel> load(std::optional<DType> quantization) {
  auto model = CpuModel::load(kModelDir);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return nullptr;
  if (quantization) {
    const Status st = (*model)->quantize_weights(*quantization);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return std::shared_ptr<CpuModel>(std::move(*model));
}

struct Goal {
  DType dtype;
  double max_ppl_change_percent;
  double min_top1;
  double max_mean_kl;
};

void check_goals(int32_t window, int32_t prefill_chunk, const Goal* goals, size_t num_goals) {
  const std::vector<int32_t> tokens = heldout_tokens(static_cast<size_t>(window));
  ASSERT_EQ(tokens.size(), static_cast<size_t>(window));
  PagedRunnerOptions options;
  options.max_sequence_tokens = window;
  options.prefill_chunk = prefill_chunk;
  auto baseline = make_cpu_paged_runner(load(std::nullopt), options);
  ASSERT_TRUE(baseline.ok()) << baseline.status().to_string();
  std::vector<std::unique_ptr<PagedRunner>> variants;
  std::vector<PagedRunner*> pointers;
  for (size_t i = 0; i < num_goals; ++i) {
    auto runner = make_cpu_paged_runner(load(goals[i].dtype), options);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    variants.push_back(std::move(*runner));
    pointers.push_back(variants.back().get());
  }
  auto results = compute_agreement(**baseline, pointers, tokens, window);
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  for (size_t i = 0; i < num_goals; ++i) {
    const AgreementResult& r = (*results)[i];
    SCOPED_TRACE(::testing::Message() << "--quantization " << dtype_name(goals[i].dtype) << ", prefill chunk "
                                      << prefill_chunk);
    std::printf("weights %s, prefill chunk %d: perplexity %.4f -> %.4f (%+.3f%%), top-1 %.4f, mean KL %.3e, "
                "max KL %.3e\n", dtype_name(goals[i].dtype).data(), prefill_chunk, r.baseline_perplexity,
                r.variant_perplexity, r.perplexity_change_percent, r.top1_agreement, r.mean_kl, r.max_kl);
    EXPECT_EQ(r.tokens, window - 1);
    EXPECT_LE(std::abs(r.perplexity_change_percent), goals[i].max_ppl_change_percent);
    EXPECT_GE(r.top1_agreement, goals[i].min_top1);
    EXPECT_LE(r.mean_kl, goals[i].max_mean_kl);
    EXPECT_GT(r.mean_kl, 0.0);  // the weights really were quantized
  }
}

// Prefill in chunks of 256: the quantized rows go through dequantized tiles + sgemm.
TEST(WeightQuantQualityTest, PrefillMeetsTheIssueGoals) {
  const Goal goals[] = {{DType::kInt8, 0.5, 0.97, 1e-3}, {DType::kInt4, 3.0, 0.85, 3e-2},
                        {DType::kFP8E4M3, 1.0, 0.92, 1e-2}};
  check_goals(1024, 256, goals, std::size(goals));
}

// One token per forward: every projection runs the integer dot kernels. 512 tokens: over 192 the figures
// move by a point between models (one flipped token is 0.5% of top-1).
TEST(WeightQuantQualityTest, DecodeMeetsTheIssueGoals) {
  const Goal goals[] = {{DType::kInt8, 0.5, 0.97, 1e-3}, {DType::kInt4, 3.0, 0.85, 3e-2},
                        {DType::kFP8E4M3, 1.0, 0.92, 1e-2}};
  check_goals(512, 1, goals, std::size(goals));
}

TEST(WeightQuantQualityTest, RefusesToQuantizeTwiceOrToOtherTypes) {
  auto model = CpuModel::load(kModelDir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const Status bad = (*model)->quantize_weights(DType::kBF16);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--quantization bf16"), std::string::npos) << bad.to_string();
  ASSERT_TRUE((*model)->quantize_weights(DType::kInt8).ok());
  const Status twice = (*model)->quantize_weights(DType::kInt4);
  EXPECT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("--quantization int4"), std::string::npos) << twice.to_string();
  EXPECT_NE(twice.message().find("already quantized"), std::string::npos) << twice.to_string();
}

}  // namespace
}  // namespace pagoda::eval
