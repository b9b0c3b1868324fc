// Hand-checked cases on tiny tokenizer.json files built here, small enough to work out every
// id by hand: merge order, byte fallback, unk fusing, added tokens, templates, decoders,
// streaming, and the errors for bad files.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::tokenizer {
namespace {

using Ids = std::vector<TokenId>;
const std::string kFffd = "\xEF\xBF\xBD";

// Byte-level BPE (GPT-2 style): "Ġ" is the space byte. Merge ranks: a+b (0), ab+c (1), Ġ+a (2).
nlohmann::json byte_level_spec() {
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 7}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
        {{"id", 8}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
        {{"id", 9}, {"content", "[M]"}, {"special", false}, {"normalized", false},
         {"lstrip", true}, {"rstrip", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {8}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"Ġ", 3}, {"ab", 4}, {"abc", 5}, {"Ġa", 6}}},
        {"merges", {"a b", "ab c", "Ġ a"}}}}};
}

// Sentencepiece-style BPE (Llama 2 style): "▁" for spaces, byte fallback, fused unk.
nlohmann::json sentencepiece_spec() {
  return {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "▁"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab",
         {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"<0xE2>", 3}, {"<0x82>", 4}, {"<0xAC>", 5},
          {"▁", 6}, {"h", 7}, {"i", 8}, {"▁h", 9}, {"▁hi", 10}}},
        {"merges", {"▁ h", "▁h i"}}}}};
}

std::shared_ptr<const Tokenizer> load(const nlohmann::json& spec, const std::string& config = "",
                                      const std::string& generation_config = "") {
  TokenizerFiles files;
  files.tokenizer_json = spec.dump();
  files.tokenizer_config_json = config;
  files.generation_config_json = generation_config;
  auto tokenizer = Tokenizer::load_from_contents(files);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? *tokenizer : nullptr;
}

TEST(TinyByteLevelTest, MergesApplyInRankOrder) {
  auto tok = load(byte_level_spec());
  ASSERT_TRUE(tok);
  // "abc" -> a b c -> ab c -> abc; " ab" -> Ġ a b -> Ġ ab (a+b outranks Ġ+a).
  EXPECT_EQ(tok->encode("abc ab", false), (Ids{5, 3, 4}));
  EXPECT_EQ(tok->encode(" a", false), (Ids{6}));
  EXPECT_EQ(tok->encode("", false), Ids{});
  EXPECT_EQ(tok->encode("", true), (Ids{8}));
}

TEST(TinyByteLevelTest, AddedTokensAreCutOutFirstAndTemplateAddsBos) {
  auto tok = load(byte_level_spec());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode("abc<|end|>a", true), (Ids{8, 5, 7, 0}));
  EXPECT_EQ(tok->encode("<|end|><|end|>", false), (Ids{7, 7}));
  // "[M]" has lstrip and rstrip: it swallows the spaces around it.
  EXPECT_EQ(tok->encode("ab [M] c", false), (Ids{4, 9, 2}));
  // A partial token string is plain text (its bytes are not in this tiny vocab: dropped).
  EXPECT_EQ(tok->encode("ab<|end", false), (Ids{4}));
}

TEST(TinyByteLevelTest, DecodeSkipsOnlySpecialTokens) {
  auto tok = load(byte_level_spec());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->decode(Ids{8, 5, 3, 4, 7, 9}, false), "<s>abc ab<|end|>[M]");
  EXPECT_EQ(tok->decode(Ids{8, 5, 3, 4, 7, 9}, true), "abc ab[M]");
  EXPECT_EQ(tok->decode(Ids{5, 12345, -1}, false), "abc");  // unknown ids are skipped
  EXPECT_TRUE(tok->is_special(7));
  EXPECT_FALSE(tok->is_special(9));
  EXPECT_FALSE(tok->is_special(5));
}

TEST(TinyByteLevelTest, TokenLookups) {
  auto tok = load(byte_level_spec());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->token_to_id("Ġa"), 6);
  EXPECT_EQ(tok->token_to_id("<|end|>"), 7);
  EXPECT_EQ(tok->token_to_id("nope"), std::nullopt);
  EXPECT_EQ(tok->id_to_token(3), "Ġ");
  EXPECT_EQ(tok->id_to_token(9), "[M]");
  EXPECT_EQ(tok->id_to_token(100), std::nullopt);
  EXPECT_EQ(tok->vocab_size(), 10);
  EXPECT_EQ(tok->token_bytes(6), " a");
}

TEST(TinyByteLevelTest, SpecialIdsComeFromTheConfigs) {
  auto tok = load(byte_level_spec(),
                  R"({"bos_token": {"content": "<s>"}, "eos_token": "<|end|>", "chat_template": "{{ x }}"})",
                  R"({"eos_token_id": [7, 9]})");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos_token_id(), 8);
  EXPECT_EQ(tok->eos_token_id(), 7);
  EXPECT_EQ(tok->eos_token_ids(), (Ids{7, 9}));
  EXPECT_EQ(tok->bos_token(), "<s>");
  EXPECT_EQ(tok->chat_template(), "{{ x }}");
  EXPECT_EQ(tok->pad_token_id(), std::nullopt);
}

TEST(TinySentencepieceTest, PrependReplaceAndMerges) {
  auto tok = load(sentencepiece_spec());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode("hi hi", true), (Ids{1, 10, 10}));
  EXPECT_EQ(tok->encode("", false), Ids{});  // Prepend leaves empty text empty
}

TEST(TinySentencepieceTest, ByteFallbackAndFusedUnk) {
  auto tok = load(sentencepiece_spec());
  ASSERT_TRUE(tok);
  // "€" is not in the vocab but its bytes are; "ü" has no byte tokens: unk, and two fuse.
  EXPECT_EQ(tok->encode("hi €", false), (Ids{10, 6, 3, 4, 5}));
  EXPECT_EQ(tok->encode("hüü", false), (Ids{9, 0}));
  // A special token in the text splits it; the next piece gets its own "▁" (HF behaviour).
  EXPECT_EQ(tok->encode("hi<s>hi", false), (Ids{10, 1, 10}));
}

TEST(TinySentencepieceTest, DecodeStripsOneLeadingSpaceAndReplacesBadBytes) {
  auto tok = load(sentencepiece_spec());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->decode(Ids{1, 10, 6, 3, 4, 5}, true), "hi €");
  EXPECT_EQ(tok->decode(Ids{1, 10, 6, 3, 4, 5}, false), "<s> hi €");
  // A run of byte tokens that is not UTF-8 becomes one U+FFFD per byte (HF's ByteFallback).
  EXPECT_EQ(tok->decode(Ids{10, 3, 4}, false), "hi" + kFffd + kFffd);
  EXPECT_EQ(tok->token_bytes(10), " hi");
  EXPECT_EQ(tok->token_bytes(3), "\xE2");
}

// Newer Mistral/Llama files: a Metaspace pre-tokenizer (prepend_scheme "first") and decoder
// instead of Prepend/Replace normalizers. Only the piece at the very start of the input gets
// a "▁"; text after a special token does not.
TEST(TinySentencepieceTest, MetaspacePrependFirst) {
  for (bool split : {false, true}) {
    nlohmann::json spec = sentencepiece_spec();
    spec["normalizer"] = nullptr;
    spec["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"},
                             {"prepend_scheme", "first"}, {"split", split}};
    spec["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}};
    auto tok = load(spec);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->encode("hi hi", false), (Ids{10, 10})) << split;
    EXPECT_EQ(tok->encode("hi<s>hi", false), (Ids{10, 1, 7, 8})) << split;
    EXPECT_EQ(tok->decode(Ids{10, 10}, false), "hi hi");
    EXPECT_EQ(tok->decode(Ids{7, 10}, false), "h hi");
  }
}

TEST(IncrementalDetokenizerTest, HoldsIncompleteCharactersBack) {
  auto tok = load(sentencepiece_spec());
  ASSERT_TRUE(tok);
  IncrementalDetokenizer stream(*tok, /*skip_special_tokens=*/true);
  EXPECT_EQ(stream.feed(1), "");
  EXPECT_EQ(stream.feed(10), "hi");
  EXPECT_EQ(stream.feed(6), " ");
  // Byte tokens are held until the run ends: HF decodes a run as a whole, and a following bad
  // byte would turn even the complete "€" into U+FFFD.
  EXPECT_EQ(stream.feed(3), "");
  EXPECT_EQ(stream.feed(4), "");
  EXPECT_EQ(stream.feed(5), "");
  EXPECT_EQ(stream.feed(10), "€ hi");
  EXPECT_EQ(stream.flush(), "");
}

TEST(IncrementalDetokenizerTest, ByteRunEndedByFlush) {
  auto tok = load(sentencepiece_spec());
  ASSERT_TRUE(tok);
  IncrementalDetokenizer stream(*tok);
  EXPECT_EQ(stream.feed(10), "hi");
  EXPECT_EQ(stream.feed(3), "");
  EXPECT_EQ(stream.feed(4), "");
  EXPECT_EQ(stream.feed(5), "");
  EXPECT_EQ(stream.flush(), "€");
  EXPECT_TRUE(tok->decode_depends_on_next(3));
  EXPECT_FALSE(tok->decode_depends_on_next(10));
}

TEST(IncrementalDetokenizerTest, FlushReplacesBytesThatNeverCompleted) {
  auto tok = load(sentencepiece_spec());
  ASSERT_TRUE(tok);
  IncrementalDetokenizer stream(*tok);
  std::string text = stream.feed(10);
  text += stream.feed(3);
  EXPECT_EQ(text, "hi");
  text += stream.flush();
  EXPECT_EQ(text, tok->decode(Ids{10, 3}, true));
  EXPECT_EQ(text, "hi" + kFffd);
}

TEST(IncrementalDetokenizerTest, ByteLevelInvalidByteIsEmittedOnceFollowedByText) {
  // A byte-level vocab with the lone byte 0xE2 ("â") and the ASCII "a".
  nlohmann::json spec = byte_level_spec();
  spec["model"]["vocab"]["â"] = 10;
  auto tok = load(spec);
  ASSERT_TRUE(tok);
  IncrementalDetokenizer stream(*tok, false);
  EXPECT_EQ(stream.feed(10), "");             // could still become a character
  EXPECT_EQ(stream.feed(0), kFffd + "a");     // it did not: U+FFFD, as decode() gives
  EXPECT_EQ(stream.flush(), "");
  EXPECT_EQ(tok->decode(Ids{10, 0}), kFffd + "a");
}

TEST(TokenizerErrorsTest, MissingFileNamesThePath) {
  auto tok = Tokenizer::load("/nonexistent/model");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("/nonexistent/model/tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrorsTest, BadFieldsAreNamed) {
  auto expect_error = [](const nlohmann::json& spec, StatusCode code, const std::string& needle) {
    TokenizerFiles files;
    files.tokenizer_json = spec.dump();
    files.source_name = "x/tokenizer.json";
    auto tok = Tokenizer::load_from_contents(files);
    ASSERT_FALSE(tok.ok()) << needle;
    EXPECT_EQ(tok.status().code(), code) << tok.status().to_string();
    EXPECT_NE(tok.status().message().find(needle), std::string::npos) << tok.status().to_string();
  };
  nlohmann::json spec = byte_level_spec();
  spec["normalizer"] = {{"type", "Precompiled"}};
  expect_error(spec, StatusCode::kUnimplemented, "normalizer: normalizer type \"Precompiled\"");

  spec = byte_level_spec();
  spec["model"]["merges"].push_back("a zz");
  expect_error(spec, StatusCode::kDataLoss, "model.merges[3]");

  spec = byte_level_spec();
  spec["model"]["type"] = "WordPiece";
  expect_error(spec, StatusCode::kUnimplemented, "WordPiece");

  spec = byte_level_spec();
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(oops"}}}};
  expect_error(spec, StatusCode::kInvalidArgument, "pre_tokenizer.pattern");

  spec = byte_level_spec();
  spec.erase("model");
  expect_error(spec, StatusCode::kDataLoss, "x/tokenizer.json: no \"model\"");

  TokenizerFiles files;
  files.tokenizer_json = "{ not json";
  auto tok = Tokenizer::load_from_contents(files);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss);

  files.tokenizer_json = byte_level_spec().dump();
  files.tokenizer_config_json = R"({"eos_token": "<nope>"})";
  tok = Tokenizer::load_from_contents(files);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("tokenizer_config.json: eos_token"), std::string::npos);
}

// Every truncation and a sweep of single-byte corruptions of a valid file: each must load or
// fail with an error, never crash.
TEST(TokenizerErrorsTest, TruncatedOrCorruptFilesFailCleanly) {
  const std::string good = sentencepiece_spec().dump();
  size_t failures = 0;
  for (size_t length = 0; length < good.size(); ++length) {
    TokenizerFiles files;
    files.tokenizer_json = good.substr(0, length);
    auto tok = Tokenizer::load_from_contents(files);
    if (!tok.ok()) {
      ++failures;
      EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << length << ": " << tok.status().to_string();
    }
  }
  EXPECT_EQ(failures, good.size());  // no strict prefix of a JSON object is valid JSON
  for (size_t pos = 0; pos < good.size(); pos += 3) {
    for (char bad : {'"', '{', '\\', '\x01', '9'}) {
      TokenizerFiles files;
      files.tokenizer_json = good;
      files.tokenizer_json[pos] = bad;
      auto tok = Tokenizer::load_from_contents(files);
      if (tok.ok()) (*tok)->encode("hi \xE2\x82 there", true);
    }
  }
}

TEST(TokenizerInputTest, InvalidUtf8InputIsRepairedNotACrash) {
  auto tok = load(byte_level_spec());
  ASSERT_TRUE(tok);
  // "\xFF" becomes U+FFFD (EF BF BD); none of those bytes is in the tiny vocab (no unk), so
  // only "ab" is left.
  EXPECT_EQ(tok->encode("ab\xFF", false), (Ids{4}));
}

}  // namespace
}  // namespace pagoda::tokenizer
