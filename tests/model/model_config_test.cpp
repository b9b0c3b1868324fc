#include "pagoda/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/testing/tiny_checkpoint.h"

namespace pagoda {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using nlohmann::json;

json llama_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
    "vocab_size": 100, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": [2, 7],
    "torch_dtype": "bfloat16"})");
}

TEST(ModelConfigTest, ParsesLlamaGqa) {
  auto cfg = parse_model_config(llama_config(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->architecture, Architecture::kLlama);
  EXPECT_EQ(cfg->num_q_heads, 8);
  EXPECT_EQ(cfg->num_kv_heads, 2);
  EXPECT_EQ(cfg->head_dim, 8);
  EXPECT_FLOAT_EQ(cfg->rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(cfg->rms_norm_eps, 1e-5f);
  EXPECT_EQ(cfg->max_position_embeddings, 2048);
  EXPECT_THAT(cfg->eos_token_ids, ElementsAre(2, 7));
  EXPECT_THAT(cfg->bos_token_ids, ElementsAre(1));
  EXPECT_TRUE(cfg->is_eos(7));
  EXPECT_FALSE(cfg->is_eos(1));
  EXPECT_EQ(cfg->dtype, DType::kBF16);
  EXPECT_FALSE(cfg->rope_llama3.has_value());
  EXPECT_FALSE(cfg->qkv_bias);
}

TEST(ModelConfigTest, KvHeadsDefaultToMha) {
  json j = llama_config();
  j.erase("num_key_value_heads");
  auto cfg = parse_model_config(j, "config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->num_kv_heads, 8);
}

TEST(ModelConfigTest, Llama3RopeScalingBothSpellings) {
  for (const char* key : {"rope_type", "type"}) {
    json j = llama_config();
    j["rope_scaling"] = {{key, "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    auto cfg = parse_model_config(j, "config.json");
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    ASSERT_TRUE(cfg->rope_llama3.has_value());
    EXPECT_FLOAT_EQ(cfg->rope_llama3->factor, 32.0f);
    EXPECT_EQ(cfg->rope_llama3->original_max_position_embeddings, 8192);
  }
}

TEST(ModelConfigTest, RopeParametersOfTransformers5) {
  json j = llama_config();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 123.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 64}};
  auto cfg = parse_model_config(j, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_FLOAT_EQ(cfg->rope_theta, 123.0f);
  ASSERT_TRUE(cfg->rope_llama3.has_value());
  EXPECT_EQ(cfg->rope_llama3->original_max_position_embeddings, 64);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  cfg = parse_model_config(j, "config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_FLOAT_EQ(cfg->rope_theta, 1e6f);
  EXPECT_FALSE(cfg->rope_llama3.has_value());
}

TEST(ModelConfigTest, UnsupportedRopeTypeIsClear) {
  json j = llama_config();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  auto s = parse_model_config(j, "dir/config.json").status();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("dir/config.json: rope type 'yarn' not supported"));
}

TEST(ModelConfigTest, UnsupportedArchitectureListsSupported) {
  json j = llama_config();
  j["architectures"] = {"GPT2LMHeadModel"};
  auto s = parse_model_config(j, "m/config.json").status();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("unsupported architecture 'GPT2LMHeadModel'"));
  EXPECT_THAT(s.message(), HasSubstr("LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"));
  j.erase("architectures");
  EXPECT_THAT(parse_model_config(j, "m/config.json").status().message(), HasSubstr("missing 'architectures'"));
}

TEST(ModelConfigTest, ArchitectureFlags) {
  json j = llama_config();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["tie_word_embeddings"] = true;
  auto cfg = parse_model_config(j, "c");
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(cfg->qkv_bias);
  EXPECT_FALSE(cfg->o_proj_bias);
  EXPECT_TRUE(cfg->tie_word_embeddings);

  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 32;  // != hidden / heads
  cfg = parse_model_config(j, "c");
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(cfg->qk_norm);
  EXPECT_FALSE(cfg->qkv_bias);
  EXPECT_EQ(cfg->head_dim, 32);

  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4096;
  cfg = parse_model_config(j, "c");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->sliding_window, 4096);
  j["sliding_window"] = nullptr;
  cfg = parse_model_config(j, "c");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->sliding_window, 0);

  j["architectures"] = {"LlamaForCausalLM"};
  j["attention_bias"] = true;
  cfg = parse_model_config(j, "c");
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(cfg->qkv_bias && cfg->o_proj_bias);
}

TEST(ModelConfigTest, BadFieldsNameTheKey) {
  struct Case {
    const char* key;
    json value;
    const char* expect;
  };
  for (const Case& c : {Case{"hidden_size", "big", "'hidden_size'"}, Case{"num_hidden_layers", 0, "'num_hidden_layers'"},
                        Case{"num_key_value_heads", 3, "not a multiple"}, Case{"eos_token_id", "x", "'eos_token_id'"},
                        Case{"torch_dtype", "int8", "torch_dtype 'int8'"}, Case{"hidden_act", "gelu", "gelu"},
                        Case{"rms_norm_eps", "tiny", "'rms_norm_eps'"}}) {
    json j = llama_config();
    j[c.key] = c.value;
    auto s = parse_model_config(j, "cfg.json").status();
    EXPECT_FALSE(s.ok()) << c.key;
    EXPECT_THAT(s.message(), HasSubstr(c.expect)) << c.key;
    EXPECT_THAT(s.message(), HasSubstr("cfg.json")) << c.key;
  }
  json j = llama_config();
  j.erase("vocab_size");
  EXPECT_THAT(parse_model_config(j, "cfg.json").status().message(), HasSubstr("missing field 'vocab_size'"));
}

TEST(ModelConfigTest, LoadsDirectoryWithGenerationConfig) {
  const auto dir = testing::make_temp_dir("config");
  testing::write_file(dir / "config.json", llama_config().dump());
  testing::write_file(dir / "generation_config.json", R"({"eos_token_id": [7, 9]})");
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_THAT(cfg->eos_token_ids, ElementsAre(2, 7, 9));
  testing::write_file(dir / "config.json", "{nope");
  EXPECT_THAT(load_model_config(dir).status().message(), HasSubstr("config.json: not valid JSON"));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(load_model_config(dir).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pagoda
