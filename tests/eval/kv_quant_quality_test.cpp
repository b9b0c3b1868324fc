// Quantized KV on the bundled model (models/pagoda-tiny) and real held-out text: the issue's
// quality goals, on one 1,024-token window (the full-file figures are in docs/BENCHMARKS.md).
// Perplexity change against the f32 KV: fp8 and int8 within +0.5%, int4 within +3%; top-1
// agreement and KL alongside. Scored through the paged path exactly as `pagoda eval agreement`.

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/eval/agreement.h"
#include "cpu_paged_runner.h"
#include "pagoda/eval/paged_runner.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::eval {
namespace {

const std::filesystem::path kModelDir = std::filesystem::path(PAGODA_SOURCE_DIR) / "models/pagoda-tiny";
constexpr int32_t kWindow = 1024;

TEST(KvQuantQualityTest, BundledModelMeetsTheIssueGoals) {
  if (!std::filesystem::exists(kModelDir / "model.safetensors")) FAIL() << "no bundled model in " << kModelDir;
  auto model = CpuModel::load(kModelDir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::shared_ptr<CpuModel> shared_model = std::move(*model);
  auto tok = tokenizer::Tokenizer::load(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::ifstream in(kModelDir / "heldout.txt", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> tokens = (*tok)->encode(text.str(), /*add_special_tokens=*/false);
  ASSERT_GT(tokens.size(), static_cast<size_t>(kWindow));
  tokens.resize(kWindow);

  struct Goal {
    DType key, value;
    double max_ppl_change_percent;
    double min_top1;
  };
  const Goal goals[] = {
      {DType::kFP8E4M3, DType::kFP8E4M3, 0.5, 0.95},
      {DType::kInt8, DType::kInt8, 0.5, 0.98},
      {DType::kInt4, DType::kInt4, 3.0, 0.85},
  };
  PagedRunnerOptions base_options;
  base_options.max_sequence_tokens = kWindow;
  auto baseline = make_cpu_paged_runner(shared_model, base_options);
  ASSERT_TRUE(baseline.ok());
  std::vector<std::unique_ptr<PagedRunner>> variants;
  std::vector<PagedRunner*> pointers;
  for (const Goal& g : goals) {
    PagedRunnerOptions options = base_options;
    options.key_dtype = g.key;
    options.value_dtype = g.value;
    auto runner = make_cpu_paged_runner(shared_model, options);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    variants.push_back(std::move(*runner));
    pointers.push_back(variants.back().get());
  }
  auto results = compute_agreement(**baseline, pointers, tokens, kWindow);
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  for (size_t i = 0; i < std::size(goals); ++i) {
    const AgreementResult& r = (*results)[i];
    SCOPED_TRACE(::testing::Message() << dtype_name(goals[i].key) << "/" << dtype_name(goals[i].value));
    std::printf("%s/%s: perplexity %.4f -> %.4f (%+.3f%%), top-1 %.4f, mean KL %.3e\n", dtype_name(goals[i].key).data(),
                dtype_name(goals[i].value).data(), r.baseline_perplexity, r.variant_perplexity,
                r.perplexity_change_percent, r.top1_agreement, r.mean_kl);
    EXPECT_EQ(r.tokens, kWindow - 1);
    EXPECT_LE(r.perplexity_change_percent, goals[i].max_ppl_change_percent);
    EXPECT_GE(r.top1_agreement, goals[i].min_top1);
    EXPECT_GT(r.mean_kl, 0.0);  // the KV really was quantized
  }
}

}  // namespace
}  // namespace pagoda::eval
