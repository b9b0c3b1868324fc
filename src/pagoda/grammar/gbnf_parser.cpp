#include "pagoda/grammar/gbnf_parser.h"

#include <cctype>

#include <fmt/format.h>

#include "pagoda/core/utf8.h"

namespace pagoda::grammar {
namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  StatusOr<std::map<std::string, ExprPtr>> parse() {
    std::map<std::string, ExprPtr> rules;
    skip_space();
    while (pos_ < text_.size()) {
      const size_t name_start = pos_;
      std::string name = parse_name();
      if (name.empty()) return error("expected a rule name");
      skip_space();
      if (text_.substr(pos_, 3) != "::=") return error("expected \"::=\" after rule name \"" + name + "\"");
      pos_ += 3;
      PAGODA_ASSIGN_OR_RETURN(ExprPtr body, parse_alternatives(/*depth=*/0));
      if (rules.contains(name)) {
        pos_ = name_start;
        return error("rule \"" + name + "\" is defined twice");
      }
      rules[name] = body;
      skip_space();
    }
    if (rules.empty()) return invalid_argument_error("grammar: no rules");
    return rules;
  }

 private:
  Status error(const std::string& what) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return invalid_argument_error("grammar line {} column {}: {}", line, column, what);
  }

  void skip_space() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // True when the text at pos_ starts the next rule (`name ::=`).
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\n' || text_[p] == '\r')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  StatusOr<ExprPtr> parse_alternatives(int depth) {
    std::vector<ExprPtr> options;
    while (true) {
      PAGODA_ASSIGN_OR_RETURN(ExprPtr sequence, parse_sequence(depth));
      options.push_back(std::move(sequence));
      skip_space();
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return make_alternatives(std::move(options));
  }

  StatusOr<ExprPtr> parse_sequence(int depth) {
    std::vector<ExprPtr> items;
    while (true) {
      skip_space();
      if (pos_ >= text_.size()) break;
      const char c = text_[pos_];
      if (c == '|' || c == ')') break;
      if (depth == 0 && at_rule_start()) break;
      PAGODA_ASSIGN_OR_RETURN(ExprPtr item, parse_primary(depth));
      PAGODA_ASSIGN_OR_RETURN(item, parse_postfix(std::move(item)));
      items.push_back(std::move(item));
    }
    return make_sequence(std::move(items));
  }

  StatusOr<char32_t> parse_char(bool in_class) {
    if (pos_ >= text_.size()) return error("unexpected end of text");
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= text_.size()) return error("unexpected end of text after \\");
      const char e = text_[pos_ + 1];
      pos_ += 2;
      auto hex = [&](int digits) -> StatusOr<char32_t> {
        char32_t value = 0;
        for (int i = 0; i < digits; ++i) {
          if (pos_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[pos_]))) {
            return error(fmt::format("expected {} hex digits", digits));
          }
          const char h = text_[pos_++];
          value = value * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                         : (std::tolower(h) - 'a' + 10));
        }
        if (value > kMaxCodePoint) return error("code point above U+10FFFF");
        return value;
      };
      switch (e) {
        case 'n': return U'\n';
        case 'r': return U'\r';
        case 't': return U'\t';
        case '0': return U'\0';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.':
          return static_cast<char32_t>(e);
        default: return error(fmt::format("unknown escape \\{}", e));
      }
    }
    (void)in_class;
    size_t length = 0;
    const char32_t value = decode_utf8_at(text_, pos_, &length);
    if (static_cast<unsigned char>(text_[pos_]) >= 0x80 && length == 1) return error("invalid UTF-8");
    pos_ += length;
    return value;
  }

  StatusOr<ExprPtr> parse_primary(int depth) {
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (true) {
        if (pos_ >= text_.size()) return error("unterminated string literal");
        if (text_[pos_] == '"') {
          ++pos_;
          break;
        }
        PAGODA_ASSIGN_OR_RETURN(char32_t ch, parse_char(false));
        append_utf8(bytes, ch);
      }
      return make_literal(std::move(bytes));
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (pos_ < text_.size() && text_[pos_] == '^') {
        negate = true;
        ++pos_;
      }
      std::vector<std::pair<char32_t, char32_t>> ranges;
      while (true) {
        if (pos_ >= text_.size()) return error("unterminated character class");
        if (text_[pos_] == ']') {
          ++pos_;
          break;
        }
        PAGODA_ASSIGN_OR_RETURN(char32_t lo, parse_char(true));
        char32_t hi = lo;
        if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
          ++pos_;
          PAGODA_ASSIGN_OR_RETURN(hi, parse_char(true));
          if (hi < lo) return error("character range is reversed");
        }
        ranges.emplace_back(lo, hi);
      }
      if (ranges.empty() && !negate) return error("empty character class");
      return make_code_points(std::move(ranges), negate);
    }
    if (c == '.') {
      ++pos_;
      return make_code_points({}, /*negate=*/true);
    }
    if (c == '(') {
      ++pos_;
      PAGODA_ASSIGN_OR_RETURN(ExprPtr inner, parse_alternatives(depth + 1));
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != ')') return error("expected \")\"");
      ++pos_;
      return inner;
    }
    if (is_name_char(c)) return make_rule_ref(parse_name());
    return error(fmt::format("unexpected character '{}'", c));
  }

  StatusOr<uint32_t> parse_number() {
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      value = value * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
      if (value > 100000) return error("repetition count above 100000");
    }
    if (pos_ == start) return error("expected a number");
    return static_cast<uint32_t>(value);
  }

  StatusOr<ExprPtr> parse_postfix(ExprPtr item) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '*') {
        ++pos_;
        item = make_repeat(item, 0, kUnbounded);
      } else if (c == '+') {
        ++pos_;
        item = make_repeat(item, 1, kUnbounded);
      } else if (c == '?') {
        ++pos_;
        item = make_repeat(item, 0, 1);
      } else if (c == '{') {
        ++pos_;
        skip_space();
        PAGODA_ASSIGN_OR_RETURN(uint32_t min, parse_number());
        skip_space();
        uint32_t max = min;
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          skip_space();
          if (pos_ < text_.size() && text_[pos_] == '}') {
            max = kUnbounded;
          } else {
            PAGODA_ASSIGN_OR_RETURN(max, parse_number());
            skip_space();
          }
        }
        if (pos_ >= text_.size() || text_[pos_] != '}') return error("expected \"}\"");
        ++pos_;
        if (max < min) return error("repetition {m,n} with n < m");
        item = make_repeat(item, min, max);
      } else {
        break;
      }
    }
    return item;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::map<std::string, ExprPtr>> parse_gbnf_rules(std::string_view text) {
  return Parser(text).parse();
}

StatusOr<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text) {
  PAGODA_ASSIGN_OR_RETURN(auto rules, parse_gbnf_rules(text));
  return lower_grammar(rules, "root");
}

}  // namespace pagoda::grammar
