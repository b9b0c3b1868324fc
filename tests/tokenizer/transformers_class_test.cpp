// apply_transformers_class: how tokenizer_config.json's tokenizer_class and flags rewrite the
// tokenizer.json pipeline, as transformers 5's AutoTokenizer does.

#include <gtest/gtest.h>

#include "pagoda/tokenizer/transformers_class.h"

namespace pagoda::tokenizer {
namespace {

std::optional<int32_t> lookup(const std::string& token) {
  if (token == "<s>") return 1;
  if (token == "</s>") return 2;
  return std::nullopt;
}

PipelineSpecs literal_llama_specs() {
  PipelineSpecs specs;
  specs.normalizer = nlohmann::json::parse(
      R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},)"
      R"({"type":"Replace","pattern":{"String":" "},"content":"▁"}]})");
  specs.model = {{"type", "BPE"}, {"byte_fallback", false}};
  return specs;
}

TEST(TransformersClassTest, LegacyLlamaGetsMetaspaceAlways) {
  PipelineSpecs specs = literal_llama_specs();
  auto config = nlohmann::json::parse(R"({"tokenizer_class":"LlamaTokenizer","legacy":true})");
  auto report = apply_transformers_class(config, lookup, "cfg", specs);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->pipeline_rebuilt);
  EXPECT_FALSE(report->post_processor_rebuilt);
  EXPECT_TRUE(specs.normalizer.is_null());
  EXPECT_EQ(specs.pre_tokenizer["type"], "Metaspace");
  EXPECT_EQ(specs.pre_tokenizer["prepend_scheme"], "always");
  EXPECT_EQ(specs.pre_tokenizer["split"], false);
  EXPECT_EQ(specs.model["byte_fallback"], true);
  EXPECT_EQ(specs.decoder["decoders"].size(), 4u);  // Replace, ByteFallback, Fuse, Strip
}

TEST(TransformersClassTest, NonLegacyDefaultIsFirstAndNoPrefixSpaceIsNever) {
  PipelineSpecs specs = literal_llama_specs();
  ASSERT_TRUE(apply_transformers_class(nlohmann::json::parse(R"({"tokenizer_class":"LlamaTokenizerFast"})"),
                                       lookup, "cfg", specs)
                  .ok());
  EXPECT_EQ(specs.pre_tokenizer["prepend_scheme"], "first");

  PipelineSpecs no_prefix = literal_llama_specs();
  ASSERT_TRUE(apply_transformers_class(
                  nlohmann::json::parse(R"({"tokenizer_class":"LlamaTokenizer","add_prefix_space":false})"),
                  lookup, "cfg", no_prefix)
                  .ok());
  EXPECT_EQ(no_prefix.pre_tokenizer["prepend_scheme"], "never");
  EXPECT_EQ(no_prefix.decoder["decoders"].size(), 3u);  // no Strip of the leading space
}

TEST(TransformersClassTest, OtherClassesKeepTheirPipeline) {
  PipelineSpecs specs = literal_llama_specs();
  const nlohmann::json before = specs.normalizer;
  auto report = apply_transformers_class(
      nlohmann::json::parse(R"({"tokenizer_class":"PreTrainedTokenizerFast"})"), lookup, "cfg", specs);
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->pipeline_rebuilt);
  EXPECT_EQ(specs.normalizer, before);
  EXPECT_TRUE(specs.pre_tokenizer.is_null());
}

TEST(TransformersClassTest, BosEosFlagsRebuildThePostProcessor) {
  PipelineSpecs specs;
  auto config = nlohmann::json::parse(
      R"({"add_bos_token":true,"add_eos_token":true,"bos_token":"<s>","eos_token":{"content":"</s>"}})");
  auto report = apply_transformers_class(config, lookup, "cfg", specs);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->post_processor_rebuilt);
  ASSERT_EQ(specs.post_processor["single"].size(), 3u);
  EXPECT_EQ(specs.post_processor["special_tokens"]["</s>"]["ids"][0], 2);

  // A flag whose token is unset adds nothing (transformers turns it off).
  PipelineSpecs no_bos;
  ASSERT_TRUE(apply_transformers_class(nlohmann::json::parse(R"({"add_bos_token":true})"), lookup,
                                       "cfg", no_bos)
                  .ok());
  EXPECT_EQ(no_bos.post_processor["single"].size(), 1u);
}

TEST(TransformersClassTest, BadConfigNamesTheField) {
  PipelineSpecs specs;
  auto bad_flag = apply_transformers_class(
      nlohmann::json::parse(R"({"tokenizer_class":"LlamaTokenizer","legacy":"yes"})"), lookup, "cfg", specs);
  ASSERT_FALSE(bad_flag.ok());
  EXPECT_NE(bad_flag.status().to_string().find("legacy"), std::string::npos);

  auto unknown_bos = apply_transformers_class(
      nlohmann::json::parse(R"({"add_bos_token":true,"bos_token":"<nope>"})"), lookup, "cfg", specs);
  ASSERT_FALSE(unknown_bos.ok());
  EXPECT_NE(unknown_bos.status().to_string().find("bos_token"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::tokenizer
