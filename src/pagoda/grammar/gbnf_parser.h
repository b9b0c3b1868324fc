#pragma once
// GBNF, the grammar notation of llama.cpp, as pagoda reads it (the `guided_grammar` request field
// and the output of json_schema_to_gbnf):
//
//   root   ::= object            # comments run to the end of the line
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ":" ws value
//   digit  ::= [0-9]             # [^...] negates; \n \t \r \\ \" \] \- \xHH \uHHHH \UHHHHHHHH
//   any    ::= .                 # any character
//   count  ::= digit{1,3} x* y+ z?   # repetition: * + ? {m} {m,} {m,n}
//
// A rule runs until the next `name ::=` (newlines are plain whitespace); names are
// [A-Za-z0-9_-]+; the start rule is `root`. Literals and classes are Unicode (UTF-8 in the
// text). Errors are INVALID_ARGUMENT with the line and column.
//
// Thread safety: stateless functions.

#include <memory>
#include <string_view>

#include "pagoda/core/status.h"
#include "pagoda/grammar/grammar.h"

namespace pagoda::grammar {

// Parses GBNF text into named rules (does not lower them).
StatusOr<std::map<std::string, ExprPtr>> parse_gbnf_rules(std::string_view text);

// Parses and lowers; the start rule is "root".
StatusOr<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text);

}  // namespace pagoda::grammar
