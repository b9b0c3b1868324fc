#include "pagoda/runtime/kv_sizing.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pagoda {
namespace {

KvShape llama70b_like() {  // the source article's 72B example: 80 layers, 8 KV heads, d = 128
  KvShape s;
  s.layers = 80;
  s.query_heads = 64;
  s.kv_heads = 8;
  s.head_dim = 128;
  return s;
}

TEST(KvSizingTest, ArticleFormulaGqaFp16) {
  KvShape s = llama70b_like();
  EXPECT_EQ(s.kind(), AttentionKind::kGQA);
  EXPECT_EQ(kv_bytes_per_token(s, DType::kF16), 327680);  // 2 x 80 x 8 x 128 x 2
  EXPECT_EQ(kv_bytes_per_token(s, DType::kBF16) * 4096, 1342177280);  // 1.25 GiB at 4K
  EXPECT_EQ(kv_bytes_per_token(s, DType::kBF16) * 131072, int64_t{40} << 30);  // 40 GiB at 128K
}

TEST(KvSizingTest, MhaMqaAndMlaByTheSameFormula) {
  KvShape mha = llama70b_like();
  mha.kv_heads = 64;
  EXPECT_EQ(mha.kind(), AttentionKind::kMHA);
  EXPECT_EQ(kv_bytes_per_token(mha, DType::kF16), 2621440);  // 2.5 MiB, not the article's 320 KB
  KvShape mqa = llama70b_like();
  mqa.kv_heads = 1;
  EXPECT_EQ(mqa.kind(), AttentionKind::kMQA);
  EXPECT_EQ(kv_bytes_per_token(mqa, DType::kF16), 40960);  // 40 KB, not 5 KB
  KvShape mla = llama70b_like();
  mla.mla_latent_dim = 512;
  mla.mla_rope_dim = 64;
  EXPECT_EQ(mla.kind(), AttentionKind::kMLA);
  EXPECT_EQ(kv_bytes_per_token(mla, DType::kF16), 92160);  // 90 KB, not 10 KB
}

TEST(KvSizingTest, QuantizedLayoutsCountTheirScales) {
  EXPECT_EQ(kv_vector_bytes(128, DType::kBF16), 256);
  EXPECT_EQ(kv_vector_bytes(128, DType::kFP8E4M3), 128 + 4);
  EXPECT_EQ(kv_vector_bytes(128, DType::kInt8), 128 + 4);
  EXPECT_EQ(kv_vector_bytes(128, DType::kInt4), 64 + 4 * 4);
  EXPECT_EQ(kv_vector_bytes(80, DType::kInt4), 40 + 3 * 4);  // a short last group
  KvShape s = llama70b_like();
  EXPECT_EQ(kv_bytes_per_token(s, DType::kFP8E4M3), 2 * 80 * 8 * 132);
  EXPECT_EQ(kv_bytes_per_token(s, DType::kInt4, DType::kBF16), 80 * 8 * (80 + 256));
}

TEST(KvSizingTest, ShapeFromConfigJson) {
  auto llama = kv_shape_from_config(nlohmann::json::parse(
      R"({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096})"));
  ASSERT_TRUE(llama.ok()) << llama.status().to_string();
  EXPECT_EQ(llama->head_dim, 128);
  EXPECT_EQ(kv_bytes_per_token(*llama, DType::kBF16), 131072);  // Llama-3-8B: 128 KiB per token

  auto qwen3 = kv_shape_from_config(nlohmann::json::parse(
      R"({"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "hidden_size": 1024, "head_dim": 128})"));
  ASSERT_TRUE(qwen3.ok());
  EXPECT_EQ(qwen3->head_dim, 128);

  auto deepseek = kv_shape_from_config(nlohmann::json::parse(
      R"({"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168,
          "kv_lora_rank": 512, "qk_rope_head_dim": 64})"));
  ASSERT_TRUE(deepseek.ok());
  EXPECT_TRUE(deepseek->is_mla());
  EXPECT_EQ(kv_bytes_per_token(*deepseek, DType::kBF16), 61 * 576 * 2);

  auto mha_default = kv_shape_from_config(nlohmann::json::parse(
      R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64})"));
  ASSERT_TRUE(mha_default.ok());
  EXPECT_EQ(mha_default->kv_heads, 4);
}

TEST(KvSizingTest, BadConfigsNameTheField) {
  auto missing = kv_shape_from_config(nlohmann::json::parse(R"({"num_attention_heads": 4})"));
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_hidden_layers"), std::string::npos);
  auto negative = kv_shape_from_config(
      nlohmann::json::parse(R"({"num_hidden_layers": -2, "num_attention_heads": 4, "hidden_size": 64})"));
  EXPECT_NE(negative.status().message().find("num_hidden_layers"), std::string::npos);
  auto uneven = kv_shape_from_config(nlohmann::json::parse(
      R"({"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 4, "hidden_size": 96})"));
  EXPECT_NE(uneven.status().message().find("num_key_value_heads"), std::string::npos);
  EXPECT_FALSE(kv_shape_from_config(nlohmann::json::array()).ok());
}

TEST(KvSizingTest, ParsesByteSizes) {
  EXPECT_EQ(*parse_byte_size("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(*parse_byte_size("16GB"), 16000000000);
  EXPECT_EQ(*parse_byte_size("1.5e9"), 1500000000);
  EXPECT_EQ(*parse_byte_size("512mib"), int64_t{512} << 20);
  EXPECT_EQ(*parse_byte_size("4096"), 4096);
  EXPECT_FALSE(parse_byte_size("lots").ok());
  EXPECT_FALSE(parse_byte_size("12 parsecs").ok());
  EXPECT_FALSE(parse_byte_size("").ok());
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace pagoda

namespace pagoda {
namespace {

// DeepSeek-V2-Lite's attention: 27 layers, 16 heads, latent 512 + rope 64, per-head K 128 + 64, V 128.
KvShape v2_lite_attention() {
  KvShape s;
  s.layers = 27;
  s.query_heads = 16;
  s.mla_latent_dim = 512;
  s.mla_rope_dim = 64;
  s.head_dim = 192;
  s.v_head_dim = 128;
  return s;
}

TEST(KvSizingMlaTest, LatentBytesAgainstMhaOfTheSameModel) {
  const KvShape s = v2_lite_attention();
  EXPECT_EQ(s.values_per_token_per_layer(), 576);
  EXPECT_EQ(kv_bytes_per_token(s, DType::kBF16), 27 * 576 * 2);
  EXPECT_EQ(kv_bytes_per_token(s, DType::kFP8E4M3), 27 * 656);  // FlashMLA's record: 512 codes, 4 scales, 64 bf16
  EXPECT_EQ(mla_vector_bytes(512, 64, DType::kFP8E4M3), 656);
  EXPECT_EQ(mla_vector_bytes(32, 8, DType::kFP8E4M3), 64);  // 32 codes, 1 scale, 8 bf16 = 52, padded to 16
  EXPECT_EQ(mla_vector_bytes(512, 64, DType::kBF16), 1152);
  EXPECT_EQ(kv_bytes_per_token(s, DType::kInt4), 27 * (288 + 18 * 4));
  const KvShape mha = mha_equivalent(s);
  EXPECT_EQ(mha.kind(), AttentionKind::kMHA);
  EXPECT_EQ(mha.values_per_token_per_layer(), 16 * (192 + 128));
  EXPECT_EQ(kv_bytes_per_token(mha, DType::kBF16), 27 * 16 * (192 + 128) * 2);
}

TEST(KvSizingMlaTest, StartupLineNamesMlaValuesAndTheMhaBytes) {
  EXPECT_EQ(format_kv_cache_line(v2_lite_attention(), DType::kFP8E4M3, DType::kFP8E4M3, int64_t{1} << 30),
            "KV cache: MLA, 576 values/token/layer (latent 512 + rope 64), fp8 (latent), 17,712 B/token "
            "(bf16: 31,104 B; MHA K/V in bf16: 276,480 B), 60,608 tokens fit in 1.00 GiB");
}

TEST(KvSizingMlaTest, DeepseekConfigKeepsThePerHeadDimsForTheComparison) {
  auto s = kv_shape_from_config(nlohmann::json::parse(
      R"({"num_hidden_layers": 27, "num_attention_heads": 16, "hidden_size": 2048, "kv_lora_rank": 512,
          "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": null})"));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->head_dim, 192);
  EXPECT_EQ(s->v_head_dim, 128);
  EXPECT_EQ(kv_bytes_per_token(mha_equivalent(*s), DType::kBF16), 276480);
}

}  // namespace
}  // namespace pagoda
