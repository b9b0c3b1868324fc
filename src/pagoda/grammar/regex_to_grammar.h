#pragma once
// Regular expressions as grammar expressions: the `guided_regex` request field (the whole output
// must match, as in vLLM) and JSON Schema's "pattern" (a search: unanchored ends match any text).
//
// Supported: literals and escapes (\n \r \t \f \v \0 \xHH \uHHHH \\ \. ...), classes [...] with
// ranges and negation, \d \w \s \D \W \S (ASCII meanings), "." (any character but \n),
// groups (...) (?:...) (?P<name>...) (?<name>...), alternation, quantifiers * + ? {m} {m,} {m,n}
// (lazy forms read as greedy: the grammar only says what may follow), and ^ / $ at the ends.
// Lookaround, backreferences and ^ / $ in the middle are UNIMPLEMENTED naming the construct.
//
// Thread safety: stateless functions.

#include <memory>
#include <string_view>

#include "pagoda/core/status.h"
#include "pagoda/grammar/grammar.h"

namespace pagoda::grammar {

struct RegexOptions {
  // JSON Schema "pattern": match anywhere unless anchored with ^ / $.
  bool search = false;
  // The text is the content of a JSON string: characters that JSON must escape (", \, controls)
  // are produced as their escapes (\", \\, \n, \u00XX) so the output is still valid JSON whose
  // decoded value matches the pattern.
  bool json_string_content = false;
};

StatusOr<ExprPtr> regex_to_expr(std::string_view pattern, const RegexOptions& options = {});

// A grammar whose root is the whole pattern (guided_regex).
StatusOr<std::shared_ptr<const Grammar>> regex_to_grammar(std::string_view pattern);

}  // namespace pagoda::grammar
