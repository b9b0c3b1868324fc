// Token masks: the trie walk and the mask cache agree with a naive scan (every token tried on a
// copy of the matcher) along random generations; end ids exactly when the grammar is complete.

#include <gtest/gtest.h>

#include <random>

#include "pagoda/grammar/gbnf_parser.h"
#include "pagoda/grammar/json_schema_to_grammar.h"
#include "pagoda/grammar/token_matcher.h"

namespace pagoda::grammar {
namespace {

constexpr int32_t kEnd = 0;

// Id 0 ends generation; ids 1..256 are single bytes; the rest are multi-byte pieces.
std::shared_ptr<const TokenVocabulary> test_vocabulary() {
  std::vector<std::string> bytes = {""};
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"{\"", "\":", "\": ", "\",", "\"}", "true", "false", "null", "na", "name", "\"name\"",
                            "12", "3.", "e+", ", \"", "}\n", "\u00e9", "\xC3", "\xA9x", "[{", "}]", "\"a\":1}",
                            "abc", "ab", "a", " ", "  ", "\n ", "\"\"", "\\n", "\\u00", "x\"", "\":\"", "{}",
                            // Closing several levels at once: decided by frames below a window.
                            "}}", "]}", "}]}", "\"}}", "1}", "1]", "\"]", "null}", "true]}", "\"]}", "e]"}) {
    bytes.push_back(piece);
  }
  bytes.push_back("ab");  // a duplicate piece: both ids must be allowed together
  return TokenVocabulary::build(std::move(bytes), {kEnd});
}

std::vector<uint64_t> naive_mask(const TokenMatcher& matcher, const TokenVocabulary& vocab) {
  std::vector<uint64_t> mask(vocab.mask_words(), 0);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    TokenMatcher copy = matcher;
    if (copy.accept(id)) mask[id >> 6] |= uint64_t{1} << (id & 63);
  }
  return mask;
}

// Returns the grammar's stats after `runs` random generations of up to `steps` tokens, each
// mask checked against the naive scan.
MaskStats check_random_generations(const std::shared_ptr<const Grammar>& grammar, int runs, int steps,
                                   CompiledGrammar::Limits limits = {}, bool precompute = false) {
  auto vocab = test_vocabulary();
  auto compiled = std::make_shared<CompiledGrammar>(grammar, vocab, limits);
  if (precompute) {
    const PrecomputeStats pre = compiled->precompute(2000, 30.0);
    EXPECT_GT(pre.states, 0u);
    EXPECT_GT(pre.windows, 0u);
  }
  std::vector<uint64_t> mask(vocab->mask_words());
  for (int run = 0; run < runs; ++run) {
    std::mt19937_64 rng(run);
    TokenMatcher matcher(compiled);
    for (int step = 0; step < steps && !matcher.is_finished(); ++step) {
      const size_t allowed = matcher.fill_mask(mask);
      EXPECT_EQ(mask, naive_mask(matcher, *vocab)) << "run " << run << " step " << step;
      if (mask != naive_mask(matcher, *vocab)) return compiled->stats();
      EXPECT_GT(allowed, 0u);
      EXPECT_EQ((mask[0] & 1) != 0, matcher.is_complete());
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if ((mask[id >> 6] >> (id & 63)) & 1) ids.push_back(id);
      // Prefer not to end early so the walk goes deep.
      int32_t pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
      if (pick == kEnd && ids.size() > 1 && step < steps / 2) pick = ids.back();
      EXPECT_TRUE(matcher.accept(pick));
    }
  }
  const MaskStats stats = compiled->stats();
  EXPECT_GT(stats.hits, 0u);  // recurring states come from the cache
  return stats;
}

const char* kPairsGrammar = R"(
root ::= "{" ws ( pair ( "," ws pair )* )? "}"
pair ::= "\"" [a-z]{1,6} "\"" ws ":" ws ( [0-9]+ | "true" | "null" | root )
ws ::= [ \n]?
)";
const char* kSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"number"},"tags":{"type":"array","items":{"enum":["a","ab",null]}}},"required":["name"]})";

TEST(TokenMatcherTest, MasksMatchANaiveScanOnAGbnfGrammar) {
  auto g = parse_gbnf(kPairsGrammar);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  check_random_generations(*g, 30, 60);
}

TEST(TokenMatcherTest, MasksMatchANaiveScanOnAJsonSchema) {
  auto g = json_schema_to_grammar(nlohmann::ordered_json::parse(kSchema), "s");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  check_random_generations(*g, 30, 80);
}

// Masks by parts: windows computed ahead (precompute) or on first use, composed with the uncertain
// tokens checked against each state, equal the naive scan on every state of many generations,
// including nested JSON whose stacks are deeper than every window size.
TEST(TokenMatcherTest, MasksComposedFromWindowsMatchANaiveScan) {
  auto pairs = parse_gbnf(kPairsGrammar);
  ASSERT_TRUE(pairs.ok()) << pairs.status().to_string();
  auto schema = json_schema_to_grammar(nlohmann::ordered_json::parse(kSchema), "s");
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  uint64_t uncertain = 0, union_hits = 0;
  for (const auto& grammar : {*pairs, *schema, json_object_grammar()}) {
    for (bool precompute : {false, true}) {
      const MaskStats stats = check_random_generations(grammar, 25, 120, {}, precompute);
      EXPECT_EQ(stats.whole_walks, 0u);
      EXPECT_GT(stats.windows, 0u);
      uncertain += stats.uncertain_checked;
      union_hits += stats.union_hits;
    }
  }
  EXPECT_GT(uncertain, 0u);   // the context-dependent tokens were exercised
  EXPECT_GT(union_hits, 0u);  // and the kept unions of window sets
}

// Precomputed windows make the first masks of a new grammar cheap: after precompute() no mask of
// these generations needs a new window (json_object is unbounded, so only a bounded grammar).
TEST(TokenMatcherTest, PrecomputeCoversABoundedGrammarAndStaysInItsBudget) {
  auto schema = json_schema_to_grammar(nlohmann::ordered_json::parse(kSchema), "s");
  ASSERT_TRUE(schema.ok());
  auto vocab = test_vocabulary();
  auto compiled = std::make_shared<CompiledGrammar>(*schema, vocab);
  const PrecomputeStats pre = compiled->precompute(100000, 60.0);
  EXPECT_TRUE(pre.complete);
  const uint64_t windows = compiled->stats().windows;
  std::vector<uint64_t> mask(vocab->mask_words());
  std::mt19937_64 rng(3);
  for (int run = 0; run < 20; ++run) {
    TokenMatcher matcher(compiled);
    for (int step = 0; step < 60 && !matcher.is_finished(); ++step) {
      matcher.fill_mask(mask);
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if ((mask[id >> 6] >> (id & 63)) & 1) ids.push_back(id);
      ASSERT_FALSE(ids.empty());
      ASSERT_TRUE(matcher.accept(ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)]));
    }
  }
  EXPECT_EQ(compiled->stats().windows, windows);
  // A budget of states stops early on an unbounded grammar.
  auto object = std::make_shared<CompiledGrammar>(json_object_grammar(), vocab);
  const PrecomputeStats bounded = object->precompute(50, 60.0);
  EXPECT_FALSE(bounded.complete);
  EXPECT_EQ(bounded.states, 50u);
}

// A bounded repetition (json_object's indentation: a newline and up to 20 blanks) has a state per
// count; precompute() walks the first rounds and computes the windows of the other counts from
// the stacks it met, so every indentation's first mask needs no new window, and stays exact.
TEST(TokenMatcherTest, PrecomputeCoversEveryCountOfABoundedRepetition) {
  auto vocab = test_vocabulary();
  auto compiled = std::make_shared<CompiledGrammar>(json_object_grammar(), vocab);
  const PrecomputeStats pre = compiled->precompute(300, 60.0);
  EXPECT_FALSE(pre.complete);
  EXPECT_GT(pre.count_siblings, 0u);
  const uint64_t windows = compiled->stats().windows;
  std::vector<uint64_t> mask(vocab->mask_words());
  for (int blanks = 1; blanks <= 20; ++blanks) {
    TokenMatcher matcher(compiled);
    ASSERT_TRUE(matcher.accept_text("{\n" + std::string(static_cast<size_t>(blanks), blanks % 2 ? ' ' : '\t')));
    matcher.fill_mask(mask);
    EXPECT_EQ(mask, naive_mask(matcher, *vocab)) << blanks << " blanks";
  }
  EXPECT_EQ(compiled->stats().windows, windows);
}

// The bounds: a full window cache falls back to whole-trie walks, and windows with too many
// uncertain tokens to larger windows (up to the whole stack); masks stay exact either way.
TEST(TokenMatcherTest, WindowLimitsFallBackToExactMasks) {
  auto g = json_schema_to_grammar(nlohmann::ordered_json::parse(kSchema), "s");
  ASSERT_TRUE(g.ok());
  CompiledGrammar::Limits few_windows;
  few_windows.max_windows = 3;
  EXPECT_GT(check_random_generations(*g, 10, 80, few_windows).whole_walks, 0u);
  CompiledGrammar::Limits small_memory;
  small_memory.max_window_bytes = 1;
  EXPECT_GT(check_random_generations(*g, 10, 80, small_memory).whole_walks, 0u);
  CompiledGrammar::Limits no_uncertain;
  no_uncertain.max_uncertain = 0;
  const MaskStats stats = check_random_generations(json_object_grammar(), 15, 120, no_uncertain, true);
  EXPECT_EQ(stats.uncertain_checked, 0u);
  EXPECT_EQ(stats.whole_walks, 0u);
}

TEST(TokenMatcherTest, EndIdsOnlyWhenCompleteAndRejectedTokensChangeNothing) {
  auto g = parse_gbnf(R"(root ::= "ab" "c"?)");
  ASSERT_TRUE(g.ok());
  auto vocab = test_vocabulary();
  TokenMatcher m(std::make_shared<CompiledGrammar>(*g, vocab));
  std::vector<uint64_t> mask(vocab->mask_words());
  m.fill_mask(mask);
  EXPECT_EQ(mask[0] & 1, 0u);
  EXPECT_FALSE(m.accept(kEnd));
  EXPECT_FALSE(m.accept(1 + 'x'));
  ASSERT_TRUE(m.accept(1 + 'a'));
  ASSERT_TRUE(m.accept(1 + 'b'));
  m.fill_mask(mask);
  EXPECT_EQ(mask[0] & 1, 1u);                                   // complete: may end
  EXPECT_TRUE((mask[(1 + 'c') >> 6] >> ((1 + 'c') & 63)) & 1);  // or go on
  ASSERT_TRUE(m.accept(1 + 'c'));
  EXPECT_EQ(m.fill_mask(mask), 1u);  // only the end id is left
  EXPECT_TRUE(m.accept(kEnd));
  EXPECT_TRUE(m.is_finished());
}

// forced_text: the bytes every continuation starts with, up to the first choice or a point
// where the grammar may end; the matcher does not move.
TEST(TokenMatcherTest, ForcedTextStopsAtAChoiceOrAPossibleEnd) {
  auto g = parse_gbnf(R"(root ::= "{" ( "abc" | "abd" ) "xyz" [0-9]+ "!"?)");
  ASSERT_TRUE(g.ok());
  auto vocab = test_vocabulary();
  TokenMatcher m(std::make_shared<CompiledGrammar>(*g, vocab));
  EXPECT_EQ(m.forced_text(100), "{ab");
  EXPECT_EQ(m.forced_text(2), "{a");
  EXPECT_EQ(m.forced_text(100), "{ab");  // unchanged
  ASSERT_TRUE(m.accept_text("{abd"));
  EXPECT_EQ(m.forced_text(100), "xyz");
  ASSERT_TRUE(m.accept_text("xyz7"));
  EXPECT_EQ(m.forced_text(100), "");  // another digit, "!" or the end
  auto optional_tail = parse_gbnf(R"(root ::= "ab" "cd"?)");
  ASSERT_TRUE(optional_tail.ok());
  TokenMatcher t(std::make_shared<CompiledGrammar>(*optional_tail, vocab));
  EXPECT_EQ(t.forced_text(100), "ab");
}

}  // namespace
}  // namespace pagoda::grammar
