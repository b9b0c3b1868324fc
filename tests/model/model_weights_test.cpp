// Binding checkpoint tensors to a config: missing tensors, wrong shapes and
// wrong dtypes are errors that name the tensor and its file.

#include "pagoda/model/model_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/testing/tiny_checkpoint.h"
#include "pagoda/backend/cpu/cpu_model.h"

namespace pagoda {
namespace {

using ::testing::HasSubstr;

class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("weights"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Status load(const testing::TinyModelSpec& spec, const testing::TensorMap& tensors,
              const WeightLoadOptions& options = {}) {
    testing::write_model_dir(dir_, testing::tiny_config_json(spec), tensors, spec.num_shards);
    return CpuModel::load(dir_, options).status();
  }
  std::filesystem::path dir_;
};

TEST_F(ModelWeightsTest, LoadsEveryArchitecture) {
  for (const char* arch : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    testing::TinyModelSpec spec;
    spec.architecture = arch;
    EXPECT_TRUE(load(spec, testing::tiny_model_tensors(spec)).ok()) << arch;
  }
}

TEST_F(ModelWeightsTest, MissingTensorNamed) {
  testing::TinyModelSpec spec;
  auto tensors = testing::tiny_model_tensors(spec);
  tensors.erase("model.layers.1.mlp.up_proj.weight");
  auto s = load(spec, tensors);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing tensor 'model.layers.1.mlp.up_proj.weight' (expected shape [56, 32]) in model.safetensors"));
}

TEST_F(ModelWeightsTest, MissingBiasForQwen2AndNormForQwen3) {
  testing::TinyModelSpec spec;
  spec.architecture = "Qwen2ForCausalLM";
  auto tensors = testing::tiny_model_tensors(spec);
  tensors.erase("model.layers.0.self_attn.k_proj.bias");
  EXPECT_THAT(load(spec, tensors).message(), HasSubstr("'model.layers.0.self_attn.k_proj.bias'"));
  spec.architecture = "Qwen3ForCausalLM";
  tensors = testing::tiny_model_tensors(spec);
  tensors.erase("model.layers.1.self_attn.q_norm.weight");
  EXPECT_THAT(load(spec, tensors).message(), HasSubstr("'model.layers.1.self_attn.q_norm.weight'"));
}

TEST_F(ModelWeightsTest, ShapeDisagreeingWithConfig) {
  testing::TinyModelSpec spec;
  auto tensors = testing::tiny_model_tensors(spec);
  auto& k = tensors["model.layers.0.self_attn.k_proj.weight"];
  k.shape = {32, 16};  // config implies [kv_heads * head_dim = 16, hidden = 32]
  auto s = load(spec, tensors);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 16] but config.json implies [16, 32]"));
}

TEST_F(ModelWeightsTest, DtypeDisagreeingWithConfig) {
  testing::TinyModelSpec spec;
  spec.dtype = DType::kBF16;
  auto tensors = testing::tiny_model_tensors(spec);
  tensors["model.layers.1.self_attn.o_proj.weight"].dtype = DType::kF16;
  auto s = load(spec, tensors);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.1.self_attn.o_proj.weight' has dtype f16 but config.json torch_dtype is bf16"));
}

TEST_F(ModelWeightsTest, UnsupportedArchitecture) {
  testing::TinyModelSpec spec;
  spec.architecture = "FalconForCausalLM";
  auto s = load(spec, testing::tiny_model_tensors(spec));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("supported: LlamaForCausalLM"));
}

TEST_F(ModelWeightsTest, TiedEmbeddingsNeedNoLmHead) {
  testing::TinyModelSpec spec;
  spec.tie_word_embeddings = true;
  testing::write_tiny_model(dir_, spec);
  auto model = CpuModel::load(dir_);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->weights().lm_head.data, (*model)->weights().embed_tokens.data);
}

TEST_F(ModelWeightsTest, UpcastOnlyWithinTheF32Budget) {
  testing::TinyModelSpec spec;
  spec.dtype = DType::kBF16;
  testing::write_tiny_model(dir_, spec);
  WeightLoadOptions budget;
  budget.f32_cache_bytes = 1 << 20;
  auto upcast = CpuModel::load(dir_, budget);
  ASSERT_TRUE(upcast.ok());
  EXPECT_TRUE((*upcast)->weights().upcast_to_f32);
  EXPECT_EQ((*upcast)->weights().layers[0].q_proj.dtype, DType::kF32);

  budget.f32_cache_bytes = 1000;  // too small: stays bf16
  auto too_small = CpuModel::load(dir_, budget);
  ASSERT_TRUE(too_small.ok());
  EXPECT_FALSE((*too_small)->weights().upcast_to_f32);

  auto zero_copy = CpuModel::load(dir_);  // default: no upcast
  ASSERT_TRUE(zero_copy.ok());
  const ModelWeights& w = (*zero_copy)->weights();
  EXPECT_FALSE(w.upcast_to_f32);
  EXPECT_EQ(w.file_dtype, DType::kBF16);
  EXPECT_EQ(w.layers[0].q_proj.dtype, DType::kBF16);
  // The matrix points into the mmapped file, not a copy.
  const TensorInfo* t = w.checkpoint->find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(w.layers[0].q_proj.data, t->data);
}

TEST_F(ModelWeightsTest, CorruptShardNamedThroughLoad) {
  testing::TinyModelSpec spec;
  spec.num_shards = 2;
  testing::write_tiny_model(dir_, spec);
  testing::write_file(dir_ / "model-00002-of-00002.safetensors", "short");
  auto s = CpuModel::load(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("model-00002-of-00002.safetensors: truncated"));
}

}  // namespace
}  // namespace pagoda
