#pragma once
// A context-free grammar over bytes, the common form of every structured-output input: GBNF text
// (gbnf_parser.h), a regular expression (regex_to_grammar.h) and a JSON Schema
// (json_schema_to_gbnf.h, through GBNF) all end up here.
//
// Two layers:
//   Expr        what parsers build: sequences, alternatives, literals, sets of Unicode code
//               points, references to named rules, and bounded or unbounded repetition.
//   Grammar     what the matcher runs (grammar_matcher.h): rules made of alternatives, each a
//               flat run of Elements ending in kEnd. Terminals are sets of *bytes*: a set of code
//               points becomes UTF-8 byte sequences (only valid UTF-8, no surrogates), so the
//               matcher never decodes UTF-8 and a token's bytes are fed one by one.
//
// lower_grammar() checks what the matcher needs to terminate: every referenced rule exists, no
// rule can reach itself without consuming a byte (left recursion), and no repetition repeats
// something that can match nothing. Errors are INVALID_ARGUMENT naming the rule.
//
// Thread safety: plain data; a Grammar is immutable once built.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::grammar {

inline constexpr uint32_t kUnbounded = UINT32_MAX;
inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

// ---------------------------------------------------------------------------------------------
// Expressions (parser output).

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind { kSequence, kAlternatives, kLiteral, kCodePoints, kRuleRef, kRepeat };
  Kind kind = Kind::kSequence;
  std::vector<ExprPtr> children;                       // kSequence, kAlternatives; kRepeat: one
  std::string literal;                                 // kLiteral: UTF-8 bytes
  std::vector<std::pair<char32_t, char32_t>> ranges;   // kCodePoints: inclusive, after negation
  std::string rule;                                    // kRuleRef
  uint32_t min = 0, max = 0;                           // kRepeat (max may be kUnbounded)
};

ExprPtr make_sequence(std::vector<ExprPtr> items);
ExprPtr make_alternatives(std::vector<ExprPtr> options);
ExprPtr make_literal(std::string bytes);
ExprPtr make_empty();  // the empty sequence
// `ranges` need not be sorted or disjoint; `negate` takes the complement in [0, 0x10FFFF].
ExprPtr make_code_points(std::vector<std::pair<char32_t, char32_t>> ranges, bool negate);
ExprPtr make_rule_ref(std::string name);
ExprPtr make_repeat(ExprPtr child, uint32_t min, uint32_t max);

// ---------------------------------------------------------------------------------------------
// The lowered grammar (matcher input).

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void set_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  bool operator==(const ByteSet&) const = default;
};

enum class ElementKind : uint8_t {
  kBytes,   // one byte from byte_sets[index]
  kRule,    // the rule `index`
  kRepeat,  // the rule `index` repeated [min, max] times
  kEnd,     // end of an alternative
};

struct Element {
  ElementKind kind = ElementKind::kEnd;
  uint32_t index = 0;
  uint32_t min = 0, max = 0;
};

struct Grammar {
  struct Rule {
    std::string name;
    std::vector<uint32_t> alternatives;  // element index where each alternative starts
    bool nullable = false;               // can match the empty string
  };
  std::vector<ByteSet> byte_sets;
  std::vector<Element> elements;
  std::vector<Rule> rules;
  uint32_t root = 0;

  // GBNF-like text of the lowered grammar, for errors and debugging.
  std::string to_string() const;
};

// Lowers named rules; `root` names the start rule. Helper rules get names "<parent>-<n>".
StatusOr<std::shared_ptr<const Grammar>> lower_grammar(const std::map<std::string, ExprPtr>& rules,
                                                       const std::string& root);

// UTF-8 byte-range sequences covering code points [lo, hi] (surrogates excluded): each inner
// vector is one sequence of inclusive byte ranges. Exposed for tests.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(char32_t lo, char32_t hi);

}  // namespace pagoda::grammar
