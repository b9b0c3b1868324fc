// DeepSeek V2/V3 config.json parsing: the fixtures as transformers 5.17 saves
// them, the Hub's spelling (rope_scaling, scoring_func, topk_method), and every
// unsupported variant refused at load with its field named.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagoda/model/kv_geometry.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/yarn_rope.h"

namespace pagoda {
namespace {

using ::testing::HasSubstr;

nlohmann::json fixture_config(const std::string& name) {
  std::ifstream in(std::filesystem::path(PAGODA_SOURCE_DIR) / "tests/fixtures/models" / name / "config.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

// DeepSeek-V3's config.json as published on the Hub (transformers 4 spelling), trimmed of unused fields.
nlohmann::json hub_v3_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1})");
}

StatusOr<ModelConfig> parse(const nlohmann::json& j) { return parse_model_config(j, "config.json"); }

TEST(DeepseekConfigTest, V2LiteFixtureReadsPlainQueryGreedyRoutingAndLatentCache) {
  auto c = parse(fixture_config("deepseek_v2_lite_bf16"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, Architecture::kDeepseekV2);
  ASSERT_TRUE(c->mla && c->moe);
  EXPECT_EQ(c->mla->q_lora_rank, 0);  // null: plain q_proj
  EXPECT_EQ(c->mla->kv_lora_rank, 32);
  EXPECT_EQ(c->mla->qk_nope_head_dim, 16);
  EXPECT_EQ(c->mla->qk_rope_head_dim, 8);
  EXPECT_EQ(c->mla->v_head_dim, 16);
  EXPECT_TRUE(c->mla->rope_interleave);  // V2 always pairs (2i, 2i+1)
  EXPECT_FLOAT_EQ(c->mla->softmax_scale, 1.0f / std::sqrt(24.0f));
  EXPECT_EQ(c->moe->scoring, MoeScoring::kSoftmax);
  EXPECT_EQ(c->moe->group_score, MoeGroupScore::kNone);
  EXPECT_EQ(c->moe->num_experts, 8);
  EXPECT_EQ(c->moe->experts_per_token, 2);
  EXPECT_EQ(c->moe->num_shared_experts, 2);
  EXPECT_EQ(c->moe->first_k_dense_replace, 1);
  EXPECT_FALSE(c->moe->is_moe_layer(0));
  EXPECT_TRUE(c->moe->is_moe_layer(1));
  // The cache: one latent vector of 32 + 8 per token and layer.
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->head_dim, 40);
  const KvPoolShape pool = model_kv_pool_shape(*c, 4, 16, DType::kF32, DType::kF32);
  EXPECT_TRUE(pool.latent);
  EXPECT_EQ(pool.head_dim, 40);
  EXPECT_EQ(pool.bytes_per_token(), 3u * 40 * 4);
}

TEST(DeepseekConfigTest, V2GroupYarnFixtureAppliesDeepseekMscaleToTheSoftmaxScale) {
  auto c = parse(fixture_config("deepseek_v2_group_yarn_f32"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->mla->q_lora_rank, 24);
  EXPECT_TRUE(c->mla->attention_bias);
  EXPECT_EQ(c->moe->group_score, MoeGroupScore::kMax);
  EXPECT_EQ(c->moe->num_groups, 4);
  EXPECT_EQ(c->moe->topk_groups, 2);
  EXPECT_FLOAT_EQ(c->moe->routed_scaling_factor, 2.0f);
  ASSERT_TRUE(c->rope_yarn);
  EXPECT_EQ(c->rope_yarn->original_max_position_embeddings, 64);
  const double mscale = 0.1 * 0.707 * std::log(4.0) + 1.0;
  EXPECT_NEAR(c->mla->softmax_scale, mscale * mscale / std::sqrt(24.0), 1e-7);
  EXPECT_FLOAT_EQ(c->mla->rope_attention_factor, 1.0f);  // mscale == mscale_all_dim
}

TEST(DeepseekConfigTest, V3FixtureReadsSigmoidRoutingGroupsAndTheYarnAttentionFactor) {
  auto c = parse(fixture_config("deepseek_v3_bf16"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, Architecture::kDeepseekV3);
  EXPECT_EQ(c->moe->scoring, MoeScoring::kSigmoid);
  EXPECT_TRUE(c->moe->score_correction_bias);
  EXPECT_EQ(c->moe->group_score, MoeGroupScore::kTopTwoSum);
  EXPECT_TRUE(c->moe->norm_topk_prob);
  EXPECT_FLOAT_EQ(c->moe->routed_scaling_factor, 2.5f);
  EXPECT_TRUE(c->mla->rope_interleave);
  const double attention_factor = (0.1 * std::log(4.0) + 1.0) / (0.1 * 0.8 * std::log(4.0) + 1.0);
  EXPECT_NEAR(c->mla->rope_attention_factor, attention_factor, 1e-6);
  auto latent = parse(fixture_config("deepseek_v3_latent512_bf16"));
  ASSERT_TRUE(latent.ok()) << latent.status().to_string();
  EXPECT_FALSE(latent->mla->rope_interleave);
  EXPECT_EQ(latent->head_dim, 576);
  EXPECT_FALSE(latent->rope_yarn);
}

TEST(DeepseekConfigTest, HubV3ConfigWithRopeScalingYarn) {
  auto c = parse(hub_v3_config());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(c->rope_yarn);
  EXPECT_DOUBLE_EQ(c->rope_yarn->factor, 40.0);
  EXPECT_EQ(c->rope_yarn->original_max_position_embeddings, 4096);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->mla->softmax_scale, mscale * mscale / std::sqrt(192.0), 1e-7);
  EXPECT_EQ(c->mla->q_lora_rank, 1536);
  EXPECT_EQ(c->moe->num_groups, 8);
  EXPECT_EQ(c->moe->topk_groups, 4);
  EXPECT_EQ(c->moe->experts_per_token, 8);
  EXPECT_EQ(c->head_dim, 576);
  // The KV sizing knows it as MLA with the MHA dims beside it.
  const KvShape shape = model_kv_shape(*c);
  EXPECT_TRUE(shape.is_mla());
  EXPECT_EQ(shape.values_per_token_per_layer(), 576);
  EXPECT_EQ(kv_bytes_per_token(shape, DType::kBF16), 61 * 576 * 2);
  EXPECT_EQ(kv_bytes_per_token(mha_equivalent(shape), DType::kBF16), 61 * 128 * (192 + 128) * 2);
}

TEST(DeepseekConfigTest, YarnFrequenciesInterpolateLowFrequenciesAndKeepHighOnes) {
  YarnRopeScaling y;
  y.factor = 40.0;
  y.original_max_position_embeddings = 4096;
  const auto yarn = yarn_inverse_frequencies(64, 10000.0, y);
  const auto plain = rope_inverse_frequencies(64, 10000.0f);
  ASSERT_EQ(yarn.size(), 32u);
  EXPECT_FLOAT_EQ(yarn[0], plain[0]);          // fastest rotation: extrapolated (kept)
  EXPECT_FLOAT_EQ(yarn[31], plain[31] / 40.f);  // slowest: interpolated
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_LE(yarn[i], plain[i] * 1.000001f);
    EXPECT_GE(yarn[i], plain[i] / 40.f * 0.999999f);
  }
}

struct BadField {
  const char* label;
  const char* patch;  // merged into the config
  const char* field;  // must appear in the error
  StatusCode code;
};

class DeepseekConfigRefusesTest : public ::testing::TestWithParam<BadField> {};

TEST_P(DeepseekConfigRefusesTest, NamesTheField) {
  const BadField& bad = GetParam();
  nlohmann::json j = hub_v3_config();
  const nlohmann::json patch = nlohmann::json::parse(bad.patch);
  for (auto it = patch.begin(); it != patch.end(); ++it) j[it.key()] = it.value();
  auto c = parse(j);
  ASSERT_FALSE(c.ok()) << bad.label;
  EXPECT_EQ(c.status().code(), bad.code) << c.status().to_string();
  EXPECT_THAT(c.status().message(), HasSubstr(bad.field)) << bad.label;
  EXPECT_THAT(c.status().message(), HasSubstr("config.json")) << bad.label;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, DeepseekConfigRefusesTest,
    ::testing::Values(
        BadField{"V3 routing other than noaux_tc", R"({"topk_method": "greedy"})", "topk_method",
                 StatusCode::kUnimplemented},
        BadField{"V3 softmax scoring", R"({"scoring_func": "softmax"})", "scoring_func", StatusCode::kUnimplemented},
        BadField{"V2 with V3 routing", R"({"architectures": ["DeepseekV2ForCausalLM"], "scoring_func": "softmax",
                  "norm_topk_prob": false, "topk_method": "noaux_tc"})", "topk_method", StatusCode::kUnimplemented},
        BadField{"V2 norm_topk_prob", R"({"architectures": ["DeepseekV2ForCausalLM"], "scoring_func": "softmax",
                  "topk_method": "greedy", "norm_topk_prob": true})", "norm_topk_prob", StatusCode::kUnimplemented},
        BadField{"V2 group limit without groups", R"({"architectures": ["DeepseekV2ForCausalLM"],
                  "scoring_func": "softmax", "topk_method": "group_limited_greedy", "norm_topk_prob": false,
                  "n_group": null})", "n_group", StatusCode::kInvalidArgument},
        BadField{"rope type", R"({"rope_scaling": {"type": "linear", "factor": 2.0}})", "linear",
                 StatusCode::kUnimplemented},
        BadField{"yarn without its original length", R"({"rope_scaling": {"type": "yarn", "factor": 4.0}})",
                 "original_max_position_embeddings", StatusCode::kInvalidArgument},
        BadField{"sparse layer frequency", R"({"moe_layer_freq": 2})", "moe_layer_freq", StatusCode::kUnimplemented},
        BadField{"groups that do not divide", R"({"n_group": 7})", "n_group", StatusCode::kInvalidArgument},
        BadField{"more groups picked than exist", R"({"topk_group": 9})", "topk_group", StatusCode::kInvalidArgument},
        BadField{"top-k beyond the experts", R"({"num_experts_per_tok": 300})", "num_experts_per_tok",
                 StatusCode::kInvalidArgument},
        BadField{"dense config", R"({"n_routed_experts": null})", "n_routed_experts", StatusCode::kUnimplemented},
        BadField{"fp8 block-quantized weights", R"({"quantization_config": {"quant_method": "fp8"}})",
                 "quantization_config", StatusCode::kUnimplemented},
        BadField{"odd rope dim", R"({"qk_rope_head_dim": 63})", "qk_rope_head_dim", StatusCode::kInvalidArgument},
        BadField{"mlp bias", R"({"mlp_bias": true})", "mlp_bias", StatusCode::kUnimplemented}),
    [](const auto& info) {
      std::string name;
      for (const char* p = info.param.label; *p; ++p) name += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
      return name;
    });

}  // namespace
}  // namespace pagoda
