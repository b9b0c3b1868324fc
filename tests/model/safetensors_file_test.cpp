// Every way a .safetensors file can be broken gets a clear error that names the
// file (and the tensor), never a crash.

#include "pagoda/model/safetensors_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "model/testing/tiny_checkpoint.h"

namespace pagoda {
namespace {

using ::testing::HasSubstr;
using testing::TensorMap;

TensorMap two_tensors() {
  TensorMap m;
  m["a"] = {DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6}};
  m["b"] = {DType::kBF16, {4}, {0.5f, -1.0f, 2.0f, 3.0f}};
  return m;
}

// Replaces the JSON header of a valid file by `header` (length field updated).
std::string with_header(const std::string& file, const std::string& header) {
  uint64_t old_len;
  std::memcpy(&old_len, file.data(), 8);
  const uint64_t len = header.size();
  return std::string(reinterpret_cast<const char*>(&len), 8) + header + file.substr(8 + old_len);
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("safetensors"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Status open_bytes(const std::string& bytes) {
    testing::write_file(path(), bytes);
    return SafetensorsFile::open(path()).status();
  }
  std::filesystem::path path() const { return dir_ / "model.safetensors"; }

  std::filesystem::path dir_;
};

TEST_F(SafetensorsFileTest, ReadsValidFileZeroCopy) {
  testing::write_file(path(), testing::safetensors_bytes(two_tensors()));
  auto file = SafetensorsFile::open(path());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ(file->tensors().size(), 2u);
  const TensorInfo* a = file->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->num_bytes, 24u);
  EXPECT_EQ(static_cast<const float*>(a->data)[5], 6.0f);
  const TensorInfo* b = file->find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(bf16_to_f32(static_cast<const uint16_t*>(b->data)[1]), -1.0f);
  EXPECT_EQ(file->find("c"), nullptr);
}

TEST_F(SafetensorsFileTest, MissingFileIsNotFound) {
  auto s = SafetensorsFile::open(dir_ / "nope.safetensors").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("nope.safetensors"));
}

TEST_F(SafetensorsFileTest, FileShorterThanHeaderLength) {
  auto s = open_bytes("abc");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST_F(SafetensorsFileTest, HeaderLengthPastEnd) {
  std::string bytes = testing::safetensors_bytes(two_tensors());
  const uint64_t huge = bytes.size();  // header cannot be as long as the whole file
  std::memcpy(bytes.data(), &huge, 8);
  auto s = open_bytes(bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("runs past the end"));
}

TEST_F(SafetensorsFileTest, TruncatedDataSection) {
  std::string bytes = testing::safetensors_bytes(two_tensors());
  bytes.resize(bytes.size() - 3);
  auto s = open_bytes(bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
}

TEST_F(SafetensorsFileTest, BadJsonHeader) {
  auto s = open_bytes(with_header(testing::safetensors_bytes(two_tensors()), "{\"a\": [1, 2"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
  s = open_bytes(with_header(testing::safetensors_bytes(two_tensors()), "[1, 2]"));
  EXPECT_THAT(s.message(), HasSubstr("not a JSON object"));
}

TEST_F(SafetensorsFileTest, OffsetsOutOfRange) {
  const std::string good = testing::safetensors_bytes(two_tensors());
  auto s = open_bytes(with_header(good, R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 1000]}})"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'a'"));
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
  s = open_bytes(with_header(good, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})"));
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
  s = open_bytes(with_header(good, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})"));
  EXPECT_THAT(s.message(), HasSubstr("data_offsets"));
}

TEST_F(SafetensorsFileTest, OverlappingTensors) {
  const std::string good = testing::safetensors_bytes(two_tensors());
  auto s = open_bytes(with_header(good, R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                                           "y": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'x' and 'y' overlap"));
}

TEST_F(SafetensorsFileTest, ByteCountDisagreesWithShape) {
  const std::string good = testing::safetensors_bytes(two_tensors());
  auto s = open_bytes(with_header(good, R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 24]}})"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'a': shape [2, 2] of F32 needs 16 bytes but data_offsets span 24"));
}

TEST_F(SafetensorsFileTest, HugeShapeDoesNotOverflow) {
  const std::string good = testing::safetensors_bytes(two_tensors());
  auto s = open_bytes(with_header(
      good, R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 24]}})"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'a'"));
}

TEST_F(SafetensorsFileTest, UnsupportedDtypeNamesTensor) {
  const std::string good = testing::safetensors_bytes(two_tensors());
  auto s = open_bytes(with_header(good, R"({"ids": {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]}})"));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'ids': dtype I64 not supported"));
}

TEST_F(SafetensorsFileTest, MalformedEntries) {
  const std::string good = testing::safetensors_bytes(two_tensors());
  for (const char* header : {R"({"a": 3})", R"({"a": {"shape": [1], "data_offsets": [0, 4]}})",
                             R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})",
                             R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
                             R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})"}) {
    auto s = open_bytes(with_header(good, header));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << header;
    EXPECT_THAT(s.message(), HasSubstr("tensor 'a'")) << header;
  }
}

TEST_F(SafetensorsFileTest, MetadataIsIgnoredAndEmptyFileOk) {
  auto s = open_bytes(with_header(testing::safetensors_bytes({}), R"({"__metadata__": {"format": "pt"}})"));
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace pagoda
