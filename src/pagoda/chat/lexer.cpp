#include "pagoda/chat/lexer.h"

#include <cctype>

#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {

std::string_view token_type_name(TokenType type) {
  switch (type) {
    case TokenType::kData: return "template data";
    case TokenType::kVariableBegin: return "'{{'";
    case TokenType::kVariableEnd: return "'}}'";
    case TokenType::kBlockBegin: return "'{%'";
    case TokenType::kBlockEnd: return "'%}'";
    case TokenType::kName: return "name";
    case TokenType::kString: return "string";
    case TokenType::kInteger: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kOperator: return "operator";
    case TokenType::kEnd: return "end of template";
  }
  return "token";
}

namespace {

std::string normalize_newlines(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's `\s`-run check (re's \s is str.isspace in str patterns).
bool is_all_whitespace(std::string_view text) {
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 1;
    if (!is_python_whitespace(decode_utf8_at(text, offset, &length))) return false;
    offset += length;
  }
  return true;
}

size_t skip_whitespace(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    size_t length = 1;
    if (!is_python_whitespace(decode_utf8_at(text, pos, &length))) break;
    pos += length;
  }
  return pos;
}

bool starts_with_at(std::string_view text, size_t pos, std::string_view prefix) {
  return text.substr(pos, prefix.size()) == prefix;
}

// Python's unicode-escape decoding of a string literal's body (Jinja unescapes that way).
StatusOr<std::string> unescape_string(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    const auto hex_escape = [&](size_t digits) -> Status {
      uint32_t code = 0;
      for (size_t k = 1; k <= digits; ++k) {
        const char h = i + k < body.size() ? body[i + k] : '\0';
        if (!std::isxdigit(static_cast<unsigned char>(h))) {
          return invalid_argument_error("line {}: truncated \\{} escape in a string literal", line, e);
        }
        code = code * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      if (code > 0x10FFFF) return invalid_argument_error("line {}: illegal Unicode character in a string literal", line);
      append_utf8(out, code);
      i += digits;
      return ok_status();
    };
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': PAGODA_RETURN_IF_ERROR(hex_escape(2)); break;
      case 'u': PAGODA_RETURN_IF_ERROR(hex_escape(4)); break;
      case 'U': PAGODA_RETURN_IF_ERROR(hex_escape(8)); break;
      case 'N':
        return unimplemented_error("line {}: \\N{{...}} escapes in string literals are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          uint32_t code = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            code = code * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          append_utf8(out, code);
        } else {  // unknown escapes stay as written
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options)
      : source_(std::move(source)), text_(source_), options_(options) {}

  StatusOr<std::vector<Token>> run() {
    while (pos_ < text_.size()) {
      PAGODA_RETURN_IF_ERROR(lex_root());
    }
    tokens_.push_back({TokenType::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  enum class TagKind { kVariable, kBlock, kComment };

  void emit(TokenType type, std::string value, int line) {
    tokens_.push_back({type, std::move(value), line});
  }

  // Moves pos_ to `to`, counting lines, and remembers whether the consumed text ended a line
  // (Jinja's `line_starting`, which lstrip_blocks needs).
  void advance(size_t to) {
    for (size_t i = pos_; i < to; ++i) {
      if (text_[i] == '\n') ++line_;
    }
    if (to > pos_) line_starting_ = text_[to - 1] == '\n';
    pos_ = to;
  }

  // Jinja's OptionalLStrip: the data before a tag, after whitespace control.
  std::string strip_before_tag(std::string_view data, char sign, bool is_variable) const {
    if (sign == '-') {
      return python_strip(data, false, true);
    }
    if (sign != '+' && options_.lstrip_blocks && !is_variable) {
      const size_t newline = data.rfind('\n');
      const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
      if ((line_start > 0 || line_starting_) && line_start < data.size() &&
          is_all_whitespace(data.substr(line_start))) {
        return std::string(data.substr(0, line_start));
      }
    }
    return std::string(data);
  }

  // If `{%[-+]?\s*raw\s*(-%}\s*|%})` starts at `at`, its end; else npos.
  size_t match_raw_begin(size_t at) const {
    size_t p = at + 2;
    if (p < text_.size() && (text_[p] == '-' || text_[p] == '+')) ++p;
    p = skip_whitespace(text_, p);
    if (!starts_with_at(text_, p, "raw")) return std::string_view::npos;
    p = skip_whitespace(text_, p + 3);
    if (starts_with_at(text_, p, "-%}")) return skip_whitespace(text_, p + 3);
    if (starts_with_at(text_, p, "%}")) return p + 2;
    return std::string_view::npos;
  }

  Status lex_root() {
    // the next tag opener
    size_t at = pos_;
    while (true) {
      at = text_.find('{', at);
      if (at == std::string_view::npos || at + 1 >= text_.size()) {
        const int line = line_;
        std::string data(text_.substr(pos_));
        advance(text_.size());
        if (!data.empty()) emit(TokenType::kData, std::move(data), line);
        return ok_status();
      }
      const char next = text_[at + 1];
      if (next == '{' || next == '%' || next == '#') break;
      ++at;
    }
    const char opener = text_[at + 1];
    const char sign = at + 2 < text_.size() && (text_[at + 2] == '-' || text_[at + 2] == '+') ? text_[at + 2] : '\0';
    const size_t raw_end = opener == '%' ? match_raw_begin(at) : std::string_view::npos;
    const TagKind kind = opener == '{' ? TagKind::kVariable : (opener == '%' ? TagKind::kBlock : TagKind::kComment);

    const int data_line = line_;
    std::string data = strip_before_tag(text_.substr(pos_, at - pos_), sign, kind == TagKind::kVariable);
    if (!data.empty()) emit(TokenType::kData, std::move(data), data_line);

    if (raw_end != std::string_view::npos) {
      advance(raw_end);
      return lex_raw();
    }
    advance(at);
    const int tag_line = line_;
    advance(at + 2 + (sign != '\0' ? 1 : 0));
    if (kind == TagKind::kComment) return lex_comment(tag_line);
    emit(kind == TagKind::kVariable ? TokenType::kVariableBegin : TokenType::kBlockBegin,
         kind == TagKind::kVariable ? "{{" : "{%", tag_line);
    return lex_tag(kind, tag_line);
  }

  Status lex_comment(int start_line) {
    for (size_t k = pos_; k + 1 < text_.size(); ++k) {
      if ((text_[k] == '-' || text_[k] == '+') && starts_with_at(text_, k + 1, "#}")) {
        advance(text_[k] == '-' ? skip_whitespace(text_, k + 3) : k + 3);
        return ok_status();
      }
      if (starts_with_at(text_, k, "#}")) {
        size_t end = k + 2;
        if (options_.trim_blocks && end < text_.size() && text_[end] == '\n') ++end;
        advance(end);
        return ok_status();
      }
    }
    return invalid_argument_error("line {}: missing end of comment tag '#}}'", start_line);
  }

  Status lex_raw() {
    const int start_line = line_;
    for (size_t k = text_.find("{%", pos_); k != std::string_view::npos; k = text_.find("{%", k + 1)) {
      size_t p = k + 2;
      char sign = '\0';
      if (p < text_.size() && (text_[p] == '-' || text_[p] == '+')) sign = text_[p++];
      p = skip_whitespace(text_, p);
      if (!starts_with_at(text_, p, "endraw")) continue;
      p = skip_whitespace(text_, p + 6);
      size_t end;
      if (starts_with_at(text_, p, "+%}")) {
        end = p + 3;
      } else if (starts_with_at(text_, p, "-%}")) {
        end = skip_whitespace(text_, p + 3);
      } else if (starts_with_at(text_, p, "%}")) {
        end = p + 2;
        if (options_.trim_blocks && end < text_.size() && text_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string data = strip_before_tag(text_.substr(pos_, k - pos_), sign, false);
      if (!data.empty()) emit(TokenType::kData, std::move(data), start_line);
      advance(end);
      return ok_status();
    }
    return invalid_argument_error("line {}: missing '{{% endraw %}}' for '{{% raw %}}'", start_line);
  }

  // If the tag closes at pos_, consumes the closer and returns true.
  bool try_close(TagKind kind) {
    if (kind == TagKind::kBlock) {
      if (starts_with_at(text_, pos_, "+%}")) {
        advance(pos_ + 3);
      } else if (starts_with_at(text_, pos_, "-%}")) {
        advance(skip_whitespace(text_, pos_ + 3));
      } else if (starts_with_at(text_, pos_, "%}")) {
        size_t end = pos_ + 2;
        if (options_.trim_blocks && end < text_.size() && text_[end] == '\n') ++end;
        advance(end);
      } else {
        return false;
      }
      return true;
    }
    if (starts_with_at(text_, pos_, "-}}")) {
      advance(skip_whitespace(text_, pos_ + 3));
    } else if (starts_with_at(text_, pos_, "}}")) {
      advance(pos_ + 2);
    } else {
      return false;
    }
    return true;
  }

  Status lex_tag(TagKind kind, int tag_line) {
    std::vector<char> brackets;  // closers expected, innermost last
    while (true) {
      if (pos_ >= text_.size()) {
        return invalid_argument_error("line {}: unexpected end of template: the tag opened here is never closed with '{}'",
                                      tag_line, kind == TagKind::kBlock ? "%}" : "}}");
      }
      const int line = line_;
      if (brackets.empty() && try_close(kind)) {
        emit(kind == TagKind::kBlock ? TokenType::kBlockEnd : TokenType::kVariableEnd,
             kind == TagKind::kBlock ? "%}" : "}}", line);
        return ok_status();
      }
      const char c = text_[pos_];
      if (is_ascii_space(c)) {
        advance(skip_whitespace(text_, pos_));
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number(line);
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_ + 1;
        while (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) ++end;
        emit(TokenType::kName, std::string(text_.substr(pos_, end - pos_)), line);
        advance(end);
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t end = pos_ + 1;
        while (end < text_.size() && text_[end] != c) end += text_[end] == '\\' ? 2 : 1;
        if (end >= text_.size()) return invalid_argument_error("line {}: unterminated string literal", line);
        PAGODA_ASSIGN_OR_RETURN(std::string value, unescape_string(text_.substr(pos_ + 1, end - pos_ - 1), line));
        emit(TokenType::kString, std::move(value), line);
        advance(end + 1);
        continue;
      }
      static constexpr std::string_view kTwoCharOperators[] = {"//", "**", "==", "!=", "<=", ">="};
      std::string op;
      for (std::string_view two : kTwoCharOperators) {
        if (starts_with_at(text_, pos_, two)) op = std::string(two);
      }
      if (op.empty() && std::string_view("+-/*%~[](){}<>=.:|,;").find(c) != std::string_view::npos) op = std::string(1, c);
      if (op.empty()) {
        return invalid_argument_error("line {}: unexpected character '{}' inside a tag", line, std::string(1, c));
      }
      if (op == "(" || op == "[" || op == "{") {
        brackets.push_back(op == "(" ? ')' : (op == "[" ? ']' : '}'));
      } else if (op == ")" || op == "]" || op == "}") {
        if (brackets.empty()) return invalid_argument_error("line {}: unexpected '{}'", line, op);
        if (brackets.back() != op[0]) {
          return invalid_argument_error("line {}: unexpected '{}', expected '{}'", line, op, std::string(1, brackets.back()));
        }
        brackets.pop_back();
      }
      emit(TokenType::kOperator, op, line);
      advance(pos_ + op.size());
    }
  }

  // Jinja's integer and float literals (decimal; underscores between digits allowed).
  void lex_number(int line) {
    const auto digits_end = [&](size_t p) {
      while (p < text_.size() && (std::isdigit(static_cast<unsigned char>(text_[p])) ||
                                  (text_[p] == '_' && p + 1 < text_.size() && std::isdigit(static_cast<unsigned char>(text_[p + 1]))))) {
        ++p;
      }
      return p;
    };
    size_t end = digits_end(pos_);
    bool is_float = false;
    if (end + 1 < text_.size() && text_[end] == '.' && std::isdigit(static_cast<unsigned char>(text_[end + 1]))) {
      end = digits_end(end + 1);
      is_float = true;
    }
    if (end < text_.size() && (text_[end] == 'e' || text_[end] == 'E')) {
      size_t p = end + 1;
      if (p < text_.size() && (text_[p] == '+' || text_[p] == '-')) ++p;
      if (p < text_.size() && std::isdigit(static_cast<unsigned char>(text_[p]))) {
        end = digits_end(p);
        is_float = true;
      }
    }
    std::string value;
    for (char ch : text_.substr(pos_, end - pos_)) {
      if (ch != '_') value.push_back(ch);
    }
    emit(is_float ? TokenType::kFloat : TokenType::kInteger, std::move(value), line);
    advance(end);
  }

  std::string source_;
  std::string_view text_;
  const LexerOptions& options_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
};

}  // namespace

StatusOr<std::vector<Token>> tokenize_template(std::string_view source, const LexerOptions& options) {
  Lexer lexer(normalize_newlines(source, options.keep_trailing_newline), options);
  return lexer.run();
}

}  // namespace pagoda::chat
