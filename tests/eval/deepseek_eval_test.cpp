// The eval harness on DeepSeek checkpoints: greedy decoding through the engine
// (PagedRunner) reproduces transformers' tokens, and `eval agreement` compares
// a quantized latent cache with the f32 one on the same tokens.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "eval/cpu_paged_runner.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"
#include "pagoda/eval/agreement.h"

namespace pagoda::eval {
namespace {

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(PAGODA_SOURCE_DIR) / "tests" / "fixtures" / "models" / name;
}

TEST(DeepseekEvalTest, GreedyThroughTheEngineAndFp8LatentAgreement) {
  // transformers' exact greedy tokens: an f32-exact property, pinned to the exact GEMM path (the default
  // bf16 prefill GEMM rounds activations to bf16; bf16_prefill_tests bound it).
  const kernels::ScopedBf16Gemm exact(false);
  for (const char* name : {"deepseek_v2_lite_bf16", "deepseek_v3_latent512_bf16"}) {
    SCOPED_TRACE(name);
    std::ifstream in(fixture(name) / "expected.json");
    const nlohmann::json expected = nlohmann::json::parse(in);
    const auto prompt = expected["prompt_ids"].get<std::vector<int32_t>>();
    const auto greedy = expected["greedy_tokens"].get<std::vector<int32_t>>();
    auto loaded = CpuModel::load(fixture(name));
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    std::shared_ptr<CpuModel> model(std::move(*loaded));

    PagedRunnerOptions options;
    options.block_size = 4;
    options.prefill_chunk = 7;
    options.max_sequence_tokens = 64;
    options.kv_dtype = DType::kF32;
    auto baseline = make_cpu_paged_runner(model, options);
    ASSERT_TRUE(baseline.ok()) << baseline.status().to_string();
    auto out = (*baseline)->greedy(prompt, static_cast<int32_t>(greedy.size()), {});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->tokens, greedy);

    options.kv_dtype = DType::kFP8E4M3;
    auto fp8 = make_cpu_paged_runner(model, options);
    ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), greedy.begin(), greedy.end());
    auto agreement = compute_agreement(**baseline, **fp8, tokens, 16);
    ASSERT_TRUE(agreement.ok()) << agreement.status().to_string();
    std::printf("%s fp8 latent vs f32: top-1 agreement %.3f, mean KL %.2e, perplexity %+.3f%%\n", name,
                agreement->top1_agreement, agreement->mean_kl, agreement->perplexity_change_percent);
    EXPECT_GT(agreement->top1_agreement, 0.8);
    EXPECT_GT(agreement->mean_kl, 0.0);  // fp8 does change the distribution
    EXPECT_TRUE((*fp8)->verify_integrity().ok());
  }
}

}  // namespace
}  // namespace pagoda::eval
