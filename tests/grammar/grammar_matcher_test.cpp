// GBNF parsing, lowering checks and the byte-level pushdown matcher.

#include <gtest/gtest.h>

#include "grammar_test_util.h"
#include "pagoda/grammar/gbnf_parser.h"

namespace pagoda::grammar {
namespace {

using testing::matches;

std::shared_ptr<const Grammar> gbnf(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

TEST(GbnfTest, LiteralsClassesAndRepetition) {
  auto g = gbnf(R"(root ::= "ab" [0-9]+ ( "x" | "yz" )? [^a-c]{2} # comment
  )");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "ab1x!!"));
  EXPECT_TRUE(matches(g, "ab123yzdd"));
  EXPECT_TRUE(matches(g, "ab9\u00e9\u4e2d"));  // two non-ASCII characters from [^a-c]
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_FALSE(matches(g, "abx!!"));
  EXPECT_FALSE(matches(g, "ab1aa"));
  EXPECT_FALSE(matches(g, "ab1!"));
}

TEST(GbnfTest, RulesSpanLinesAndRecurse) {
  auto g = gbnf(R"(
root ::= list
list ::=
  "[" ( item ( "," item )* )? "]"
item ::= [a-z] | list
)");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[a,[b,[]],c]"));
  EXPECT_FALSE(matches(g, "[a,]"));
  EXPECT_FALSE(matches(g, "[[a]"));
}

TEST(GbnfTest, BoundedRepetitionCounts) {
  auto g = gbnf(R"(root ::= "a"{2,4} "b"{3})");
  ASSERT_TRUE(g);
  EXPECT_FALSE(matches(g, "abbb"));
  EXPECT_TRUE(matches(g, "aabbb"));
  EXPECT_TRUE(matches(g, "aaaabbb"));
  EXPECT_FALSE(matches(g, "aaaaabbb"));
  EXPECT_FALSE(matches(g, "aabb"));
}

TEST(GbnfTest, EscapesAndAnyCharacter) {
  auto g = gbnf(R"(root ::= "\"" . "\\" [\x41-\x43] "\u00e9" "\n")");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "\"\xF0\x9F\x98\x80\\B\u00e9\n"));
  EXPECT_FALSE(matches(g, "\"\xF0\x9F\x98\\B\u00e9\n"));  // a truncated character is not "."
}

TEST(GbnfTest, ErrorsNameTheProblem) {
  auto undefined = parse_gbnf("root ::= missing");
  ASSERT_FALSE(undefined.ok());
  EXPECT_NE(undefined.status().message().find("missing"), std::string::npos);
  auto left = parse_gbnf("root ::= root \"a\" | \"b\"");
  ASSERT_FALSE(left.ok());
  EXPECT_NE(left.status().message().find("left-recursive"), std::string::npos);
  auto empty_loop = parse_gbnf("root ::= ( \"a\"? )*");
  ASSERT_FALSE(empty_loop.ok());
  EXPECT_NE(empty_loop.status().message().find("can match nothing"), std::string::npos);
  auto syntax = parse_gbnf("root ::= \"abc");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(syntax.status().message().find("line 1"), std::string::npos);
  EXPECT_FALSE(parse_gbnf("notroot ::= \"a\"").ok());
  EXPECT_FALSE(parse_gbnf("root ::= \"a\"\nroot ::= \"b\"").ok());
}

TEST(GrammarMatcherTest, RejectedInputLeavesTheStateUnchanged) {
  auto g = gbnf(R"(root ::= "abc" | "abd")");
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept("ab"));
  EXPECT_FALSE(m.accept("x"));
  EXPECT_FALSE(m.accept("cz"));  // all or nothing
  EXPECT_TRUE(m.accept("d"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.exhausted());
}

TEST(GrammarMatcherTest, LoopStateIsStableFromByteToByte) {
  // Inside an unbounded loop the state (and so its hash, the mask cache key) does not change.
  auto g = gbnf(R"(root ::= "\"" [a-z]* "\"")");
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept("\"a"));
  m.compact();
  const auto image = m.image();
  for (char c : std::string("bcdefgh")) {
    ASSERT_TRUE(m.accept(std::string(1, c)));
    m.compact();
    EXPECT_EQ(m.image(), image);
    EXPECT_EQ(m.image().hash(), image.hash());
  }
}

TEST(GrammarMatcherTest, HashAndEqualityFromFramesAgreeWithTheImage) {
  // hash_of / same_state read the arena directly; they must agree with the image they stand for.
  auto g = gbnf(R"(root ::= "{" ( "\"" [a-z]* "\"" | [0-9]{1,3} | root )? "}")");
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  std::vector<GrammarMatcher::StateImage> seen;
  for (const std::string text : {"{", "{\"", "{\"ab", "{1", "{12", "{{", "{{{\"x", "{{}"}) {
    GrammarMatcher fresh(g);
    ASSERT_TRUE(fresh.accept(text)) << text;
    const auto image = fresh.image();
    EXPECT_EQ(fresh.hash_of(fresh.state()), image.hash()) << text;
    EXPECT_TRUE(fresh.same_state(fresh.state(), image)) << text;
    for (const auto& other : seen)
      if (!(other == image)) EXPECT_FALSE(fresh.same_state(fresh.state(), other)) << text;
    seen.push_back(image);
  }
}

TEST(GrammarMatcherTest, AmbiguousGrammarKeepsAllParses) {
  auto g = gbnf(R"(root ::= ( "a" | "aa" )* "b")");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "aaaaab"));
  EXPECT_TRUE(matches(g, "b"));
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept("aaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
  EXPECT_LE(m.state().tops.size(), 4u);  // duplicates are merged, not multiplied
}

TEST(GrammarMatcherTest, RandomSentencesAreAccepted) {
  auto g = gbnf(R"(
root ::= obj
obj ::= "{" ( pair ( "," pair )* )? "}"
pair ::= [a-c]{1,3} ":" ( [0-9]+ | obj )
)");
  ASSERT_TRUE(g);
  int produced = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto text = testing::random_sentence(g, seed, 2000, 0.5);
    if (!text) continue;
    ++produced;
    EXPECT_TRUE(matches(g, *text)) << *text;
  }
  EXPECT_GE(produced, 25);
}

}  // namespace
}  // namespace pagoda::grammar
