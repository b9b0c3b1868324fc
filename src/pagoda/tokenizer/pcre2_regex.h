#pragma once
// A compiled regular expression from tokenizer.json, run through PCRE2 with JIT.
//
// tokenizer.json patterns are written for Oniguruma (what HF tokenizers uses). Both engines
// agree on the constructs these files use (\p{L}, \p{N}, (?i:...), lookahead (?!\S), {1,3}),
// except \s: PCRE2's Unicode \s also matches U+180E, Oniguruma's does not. compile() therefore
// rewrites \s and \S into Oniguruma's explicit White_Space class before compiling.
//
// Subjects must be valid UTF-8 (the tokenizer repairs input first); matching skips PCRE2's own
// UTF check for speed. Offsets are byte offsets.
//
// Thread safety: a compiled Pcre2Regex is immutable; find() may be called from many threads
// (match data and the JIT stack are per thread).

#include <memory>
#include <string>
#include <string_view>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {

class Pcre2Regex {
 public:
  // INVALID_ARGUMENT with PCRE2's message and the offset when the pattern does not compile.
  static StatusOr<Pcre2Regex> compile(std::string_view pattern);
  // A pattern matching `literal` exactly (tokenizer.json's {"String": ...} patterns).
  static StatusOr<Pcre2Regex> compile_literal(std::string_view literal);

  // Finds the first match at or after `start`. On success sets [match_begin, match_end).
  bool find(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  Pcre2Regex(std::shared_ptr<const Code> code, std::string pattern)
      : code_(std::move(code)), pattern_(std::move(pattern)) {}

  std::shared_ptr<const Code> code_;
  std::string pattern_;  // as given (before the \s rewrite), for messages
};

// Exposed for tests: the \s / \S rewrite applied by compile().
std::string rewrite_oniguruma_whitespace(std::string_view pattern);

}  // namespace pagoda::tokenizer
