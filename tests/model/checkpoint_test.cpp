// Model directories: single file, sharded index, and the ways an index can lie.

#include "pagoda/model/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/testing/tiny_checkpoint.h"

namespace pagoda {
namespace {

using ::testing::HasSubstr;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("checkpoint"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, OpensSingleFile) {
  testing::TinyModelSpec spec;
  const auto tensors = testing::write_tiny_model(dir_, spec);
  auto ckpt = Checkpoint::open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->num_tensors(), tensors.size());
  EXPECT_EQ(ckpt->source_name(), "model.safetensors");
  const TensorInfo* t = ckpt->find("model.norm.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(static_cast<const float*>(t->data)[3], tensors.at("model.norm.weight").values[3]);
}

TEST_F(CheckpointTest, OpensShardsThroughIndex) {
  testing::TinyModelSpec spec;
  spec.num_shards = 3;
  const auto tensors = testing::write_tiny_model(dir_, spec);
  std::vector<std::string> lines;
  auto ckpt = Checkpoint::open(dir_, [&](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->num_tensors(), tensors.size());
  EXPECT_EQ(lines.size(), 3u);  // one progress line per shard
  for (const auto& [name, t] : tensors) {
    const TensorInfo* info = ckpt->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(static_cast<const float*>(info->data)[0], t.values[0]) << name;
  }
}

TEST_F(CheckpointTest, NoWeightsFile) {
  auto s = Checkpoint::open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST_F(CheckpointTest, IndexNamesTensorMissingFromShard) {
  testing::TensorMap m;
  m["a"] = {DType::kF32, {2}, {1, 2}};
  testing::write_file(dir_ / "s1.safetensors", testing::safetensors_bytes(m));
  testing::write_file(dir_ / "model.safetensors.index.json",
                      R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  auto s = Checkpoint::open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'b' is listed in model.safetensors.index.json but missing from s1.safetensors"));
}

TEST_F(CheckpointTest, IndexShardOutsideDirectoryRejected) {
  testing::write_file(dir_ / "model.safetensors.index.json", R"({"weight_map": {"a": "../../etc/passwd"}})");
  auto s = Checkpoint::open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not a file inside the model directory"));
}

TEST_F(CheckpointTest, IndexMissingShardFile) {
  testing::write_file(dir_ / "model.safetensors.index.json", R"({"weight_map": {"a": "gone.safetensors"}})");
  auto s = Checkpoint::open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("gone.safetensors"));
}

TEST_F(CheckpointTest, BadIndexJson) {
  testing::write_file(dir_ / "model.safetensors.index.json", R"({"weight_map": )");
  EXPECT_THAT(Checkpoint::open(dir_).status().message(), HasSubstr("not valid JSON"));
  testing::write_file(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_THAT(Checkpoint::open(dir_).status().message(), HasSubstr("weight_map"));
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  testing::TensorMap m;
  m["a"] = {DType::kF32, {1}, {1}};
  testing::write_file(dir_ / "s1.safetensors", testing::safetensors_bytes(m));
  testing::write_file(dir_ / "s2.safetensors", testing::safetensors_bytes(m));
  testing::write_file(dir_ / "model.safetensors.index.json",
                      R"({"weight_map": {"a": "s1.safetensors", "x": "s2.safetensors"}})");
  auto s = Checkpoint::open(dir_).status();
  // "x" is missing from s2 (checked first) or "a" appears twice; both are data loss naming a file.
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  testing::write_file(dir_ / "model.safetensors.index.json",
                      R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  m["b"] = {DType::kF32, {1}, {2}};
  testing::write_file(dir_ / "s2.safetensors", testing::safetensors_bytes(m));
  s = Checkpoint::open(dir_).status();
  EXPECT_THAT(s.message(), HasSubstr("tensor 'a' appears in both s1.safetensors and s2.safetensors"));
}

}  // namespace
}  // namespace pagoda
