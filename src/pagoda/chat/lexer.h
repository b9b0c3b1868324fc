#pragma once
// Lexer: template source -> tokens, following Jinja2's lexer rule for rule, because every
// byte of whitespace it keeps or drops ends up in the prompt:
//  - newlines (\r\n, \r, \n) become \n; one trailing newline of the source is dropped
//    (keep_trailing_newline=False);
//  - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` after it;
//  - trim_blocks: the first \n after `%}` / `#}` goes; lstrip_blocks: spaces and tabs from
//    the start of a line up to `{%` / `{#` go (`{%+` and `+%}` opt out);
//  - `{% raw %}...{% endraw %}` is data;
//  - inside a tag, `}}` / `%}` only closes it when brackets are balanced.
// transformers renders with trim_blocks=True and lstrip_blocks=True: the defaults here.
//
// Thread safety: pure function.

#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::chat {

enum class TokenType {
  kData,           // literal template text
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifiers and keywords (if, for, true, none, and, ...)
  kString,         // value holds the unescaped text
  kInteger,        // value holds the digits (underscores removed)
  kFloat,
  kOperator,       // + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } . , : |
  kEnd,            // end of the source
};

struct Token {
  TokenType type;
  std::string value;
  int line;  // 1-based line in the source
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Fails with the line on an unclosed tag, comment, string or raw block, or an unexpected
// character inside a tag.
StatusOr<std::vector<Token>> tokenize_template(std::string_view source, const LexerOptions& options);

std::string_view token_type_name(TokenType type);

}  // namespace pagoda::chat
