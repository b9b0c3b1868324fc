#pragma once
// Parser: tokens -> syntax tree, with Jinja2's grammar and operator precedence (filters and
// tests bind tightest, then ** (left-assoc, as Jinja does), * / // %, ~, + -, comparisons,
// not, and, or, `x if c else y`).
//
// Supported statements: if/elif/else, for (tuple targets, `if` filter, else, loop.*), set
// (names, tuples, namespace attributes, block set), macro, filter blocks, with, break,
// continue (Jinja's loopcontrols, which transformers enables) and transformers' generation.
// Everything else Jinja has (include, import, extends, block, call, recursive loops, *args)
// fails with kUnimplemented naming the construct and its line; unknown tags, filters and tests
// fail with kInvalidArgument.
//
// Thread safety: pure function.

#include <vector>

#include "pagoda/chat/ast.h"
#include "pagoda/chat/lexer.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

// Nesting deeper than this (statements inside statements, or sub-expressions) is refused, so a
// hostile template cannot overflow the stack of the parser or of the renderer.
inline constexpr int kMaxTemplateNesting = 128;

StatusOr<NodeList> parse_template(const std::vector<Token>& tokens);

}  // namespace pagoda::chat
