#include "pagoda/tokenizer/pcre2_regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagoda::tokenizer {
namespace {

// Qwen2/Qwen3's Split pattern, as written in their tokenizer.json.
const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> all_matches(const Pcre2Regex& regex, std::string_view text) {
  std::vector<std::string> out;
  size_t pos = 0, begin = 0, end = 0;
  while (pos < text.size() && regex.find(text, pos, begin, end)) {
    out.emplace_back(text.substr(begin, end - begin));
    pos = end > begin ? end : end + 1;
  }
  return out;
}

TEST(Pcre2RegexTest, QwenPatternSplitsLikeHuggingFace) {
  auto regex = Pcre2Regex::compile(kQwenPattern);
  ASSERT_TRUE(regex.ok()) << regex.status().to_string();
  // Whitespace before a word stays with the word except the last one of a run: "\s+(?!\S)".
  EXPECT_EQ(all_matches(*regex, "Hello   world's 123!!\n\nok"),
            (std::vector<std::string>{"Hello", "  ", " world", "'s", " ", "1", "2", "3", "!!\n\n",
                                      "ok"}));
  EXPECT_EQ(all_matches(*regex, "I'M 世界"), (std::vector<std::string>{"I", "'M", " 世界"}));
}

TEST(Pcre2RegexTest, WhitespaceFollowsOnigurumaNotPcre2) {
  // U+180E MONGOLIAN VOWEL SEPARATOR is not White_Space: Oniguruma's \s does not match it.
  auto regex = Pcre2Regex::compile(R"(\s)");
  ASSERT_TRUE(regex.ok());
  size_t begin = 0, end = 0;
  EXPECT_FALSE(regex->find("\xE1\xA0\x8E", 0, begin, end));
  EXPECT_TRUE(regex->find("\xE3\x80\x80", 0, begin, end));  // U+3000 ideographic space is
  EXPECT_EQ(rewrite_oniguruma_whitespace(R"([^\s\p{L}])"),
            R"([^\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\p{L}])");
}

TEST(Pcre2RegexTest, LiteralPatternsAreQuoted) {
  auto regex = Pcre2Regex::compile_literal("a.b\\E(");
  ASSERT_TRUE(regex.ok()) << regex.status().to_string();
  size_t begin = 0, end = 0;
  EXPECT_FALSE(regex->find("axb\\E(", 0, begin, end));
  ASSERT_TRUE(regex->find("--a.b\\E(", 0, begin, end));
  EXPECT_EQ(begin, 2u);
  EXPECT_EQ(end, 8u);
}

TEST(Pcre2RegexTest, BadPatternNamesThePattern) {
  auto regex = Pcre2Regex::compile("(unclosed");
  ASSERT_FALSE(regex.ok());
  EXPECT_NE(regex.status().message().find("(unclosed"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::tokenizer
