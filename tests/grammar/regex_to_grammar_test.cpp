// Regular expressions as grammars (guided_regex and JSON Schema patterns).

#include <gtest/gtest.h>

#include "grammar_test_util.h"
#include "pagoda/grammar/regex_to_grammar.h"

namespace pagoda::grammar {
namespace {

using testing::matches;

std::shared_ptr<const Grammar> regex(std::string_view pattern) {
  auto g = regex_to_grammar(pattern);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

TEST(RegexToGrammarTest, WholeMatchSemantics) {
  auto g = regex(R"(\d{3}-\d{4})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "555-1234"));
  EXPECT_FALSE(matches(g, "555-12345"));
  EXPECT_FALSE(matches(g, "x555-1234"));
}

TEST(RegexToGrammarTest, ClassesGroupsAlternationQuantifiers) {
  auto g = regex(R"(^(?:ab|c)+[^\s,]*?(?P<tail>x|y{2,})?\.$)");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "abcab."));
  EXPECT_TRUE(matches(g, "cQQyyy."));
  EXPECT_TRUE(matches(g, "c\u00e9x."));
  EXPECT_FALSE(matches(g, "c ."));
  EXPECT_FALSE(matches(g, "."));
  auto words = regex(R"([\w.+-]+@[\w-]+\.[a-z]{2,3})");
  ASSERT_TRUE(words);
  EXPECT_TRUE(matches(words, "first.last+tag@example.com"));
  EXPECT_FALSE(matches(words, "first@example.comm"));
}

TEST(RegexToGrammarTest, SearchAndJsonStringContent) {
  auto e = regex_to_expr("^a\"b", {.search = true, .json_string_content = true});
  ASSERT_TRUE(e.ok());
  std::map<std::string, ExprPtr> rules{{"root", *e}};
  auto g = lower_grammar(rules, "root");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, "a\\\"b"));          // the quote comes out escaped
  EXPECT_TRUE(matches(*g, "a\\\"b tail"));     // unanchored end
  EXPECT_FALSE(matches(*g, "a\"b"));
  EXPECT_FALSE(matches(*g, "x a\\\"b"));       // anchored start
}

TEST(RegexToGrammarTest, UnsupportedConstructsAreNamed) {
  for (const char* pattern : {"(?=a)b", "(a)\\1", "a^b", "\\bword"}) {
    auto g = regex_to_grammar(pattern);
    EXPECT_FALSE(g.ok()) << pattern;
  }
  EXPECT_FALSE(regex_to_grammar("a{3,2}").ok());
  EXPECT_FALSE(regex_to_grammar("(ab").ok());
}

}  // namespace
}  // namespace pagoda::grammar
