#include "pagoda/grammar/regex_to_grammar.h"

#include <cctype>

#include <fmt/format.h>

#include "pagoda/core/utf8.h"

namespace pagoda::grammar {
namespace {

using Ranges = std::vector<std::pair<char32_t, char32_t>>;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

Ranges complement(const Ranges& ranges) {
  auto e = make_code_points(ranges, /*negate=*/true);
  return e->ranges;
}

std::string json_escape(char32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: return fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
  }
}

bool json_must_escape(char32_t c) { return c < 0x20 || c == '"' || c == '\\'; }

class RegexParser {
 public:
  RegexParser(std::string_view pattern, const RegexOptions& options) : p_(pattern), options_(options) {}

  StatusOr<ExprPtr> parse() {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_.front() == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    end_ = p_.size();
    if (end_ > pos_ && p_[end_ - 1] == '$' && !escaped_at(end_ - 1)) {
      anchored_end = true;
      --end_;
    }
    PAGODA_ASSIGN_OR_RETURN(ExprPtr body, parse_alternatives());
    if (pos_ != end_) return error("unbalanced \")\"");
    if (!options_.search) return body;
    std::vector<ExprPtr> items;
    auto anything = [&] { return make_repeat(code_points(complement({}), false), 0, kUnbounded); };
    if (!anchored_start) items.push_back(anything());
    items.push_back(body);
    if (!anchored_end) items.push_back(anything());
    return make_sequence(std::move(items));
  }

 private:
  bool escaped_at(size_t i) const {
    size_t backslashes = 0;
    while (i > 0 && p_[i - 1] == '\\') {
      ++backslashes;
      --i;
    }
    return backslashes % 2 == 1;
  }

  Status error(const std::string& what) const {
    return invalid_argument_error("regex \"{}\" at offset {}: {}", p_, pos_, what);
  }

  // A set of characters as an expression, JSON-escaped when asked.
  ExprPtr code_points(Ranges ranges, bool negate) {
    ExprPtr set = make_code_points(std::move(ranges), negate);
    if (!options_.json_string_content) return set;
    std::vector<ExprPtr> options;
    Ranges plain;
    for (const auto& [lo, hi] : set->ranges) {
      for (char32_t c = lo; c <= hi && c < 0x80; ++c) {
        if (json_must_escape(c)) options.push_back(make_literal(json_escape(c)));
      }
    }
    Ranges banned = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    // plain = set minus banned
    Ranges keep = set->ranges;
    Ranges allowed = complement(banned);
    for (const auto& [alo, ahi] : allowed)
      for (const auto& [klo, khi] : keep) {
        const char32_t lo = std::max(alo, klo), hi = std::min(ahi, khi);
        if (lo <= hi) plain.emplace_back(lo, hi);
      }
    if (!plain.empty()) options.insert(options.begin(), make_code_points(std::move(plain), false));
    if (options.empty()) return make_code_points({}, false);
    return make_alternatives(std::move(options));
  }

  ExprPtr literal_char(char32_t c) {
    if (options_.json_string_content && json_must_escape(c)) return make_literal(json_escape(c));
    std::string bytes;
    append_utf8(bytes, c);
    return make_literal(std::move(bytes));
  }

  StatusOr<ExprPtr> parse_alternatives() {
    std::vector<ExprPtr> options;
    while (true) {
      PAGODA_ASSIGN_OR_RETURN(ExprPtr sequence, parse_sequence());
      options.push_back(std::move(sequence));
      if (pos_ < end_ && p_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return make_alternatives(std::move(options));
  }

  StatusOr<ExprPtr> parse_sequence() {
    std::vector<ExprPtr> items;
    while (pos_ < end_ && p_[pos_] != '|' && p_[pos_] != ')') {
      PAGODA_ASSIGN_OR_RETURN(ExprPtr atom, parse_atom());
      PAGODA_ASSIGN_OR_RETURN(atom, parse_quantifiers(std::move(atom)));
      items.push_back(std::move(atom));
    }
    return make_sequence(std::move(items));
  }

  StatusOr<char32_t> parse_utf8_char() {
    size_t length = 0;
    const char32_t value = decode_utf8_at(p_.substr(0, end_), pos_, &length);
    if (static_cast<unsigned char>(p_[pos_]) >= 0x80 && length == 1) return error("invalid UTF-8");
    pos_ += length;
    return value;
  }

  StatusOr<char32_t> parse_hex(int digits) {
    char32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= end_ || !std::isxdigit(static_cast<unsigned char>(p_[pos_]))) {
        return error(fmt::format("expected {} hex digits", digits));
      }
      const char h = p_[pos_++];
      value = value * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                     : std::tolower(h) - 'a' + 10);
    }
    return value;
  }

  // After a backslash: a class escape (fills `ranges`, returns true) or one character.
  StatusOr<bool> parse_escape(Ranges& ranges, char32_t& ch) {
    if (pos_ >= end_) return error("pattern ends in a backslash");
    const char e = p_[pos_++];
    switch (e) {
      case 'd': ranges = kDigit; return true;
      case 'w': ranges = kWord; return true;
      case 's': ranges = kSpace; return true;
      case 'D': ranges = complement(kDigit); return true;
      case 'W': ranges = complement(kWord); return true;
      case 'S': ranges = complement(kSpace); return true;
      case 'n': ch = '\n'; return false;
      case 'r': ch = '\r'; return false;
      case 't': ch = '\t'; return false;
      case 'f': ch = '\f'; return false;
      case 'v': ch = '\v'; return false;
      case '0': ch = 0; return false;
      case 'x': {
        PAGODA_ASSIGN_OR_RETURN(ch, parse_hex(2));
        return false;
      }
      case 'u': {
        PAGODA_ASSIGN_OR_RETURN(ch, parse_hex(4));
        return false;
      }
      case 'b': case 'B': case 'A': case 'Z': case 'z':
        return unimplemented_error("regex \"{}\": the assertion \\{} is not supported", p_, e);
      default:
        if (std::isdigit(static_cast<unsigned char>(e))) {
          return unimplemented_error("regex \"{}\": backreferences are not supported", p_);
        }
        if (std::isalnum(static_cast<unsigned char>(e))) return error(fmt::format("unknown escape \\{}", e));
        ch = static_cast<unsigned char>(e);
        return false;
    }
  }

  StatusOr<ExprPtr> parse_class() {
    bool negate = false;
    if (pos_ < end_ && p_[pos_] == '^') {
      negate = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (pos_ >= end_) return error("unterminated character class");
      if (p_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      char32_t lo = 0;
      if (p_[pos_] == '\\') {
        ++pos_;
        Ranges escape_ranges;
        PAGODA_ASSIGN_OR_RETURN(bool is_class, parse_escape(escape_ranges, lo));
        if (is_class) {
          ranges.insert(ranges.end(), escape_ranges.begin(), escape_ranges.end());
          continue;
        }
      } else {
        PAGODA_ASSIGN_OR_RETURN(lo, parse_utf8_char());
      }
      char32_t hi = lo;
      if (pos_ + 1 < end_ && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (p_[pos_] == '\\') {
          ++pos_;
          Ranges unused;
          PAGODA_ASSIGN_OR_RETURN(bool is_class, parse_escape(unused, hi));
          if (is_class) return error("a class escape cannot end a range");
        } else {
          PAGODA_ASSIGN_OR_RETURN(hi, parse_utf8_char());
        }
        if (hi < lo) return error("character range is reversed");
      }
      ranges.emplace_back(lo, hi);
    }
    return code_points(std::move(ranges), negate);
  }

  StatusOr<ExprPtr> parse_atom() {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (pos_ < end_ && p_[pos_] == '?') {
        ++pos_;
        if (pos_ < end_ && p_[pos_] == ':') {
          ++pos_;
        } else if (pos_ < end_ && (p_[pos_] == 'P' || p_[pos_] == '<') &&
                   !(p_[pos_] == '<' && pos_ + 1 < end_ && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!'))) {
          // (?P<name>...) / (?<name>...): the name is irrelevant here.
          while (pos_ < end_ && p_[pos_] != '>') ++pos_;
          if (pos_ >= end_) return error("unterminated group name");
          ++pos_;
        } else {
          return unimplemented_error("regex \"{}\": lookaround and inline flags (?...) are not supported", p_);
        }
      }
      PAGODA_ASSIGN_OR_RETURN(ExprPtr inner, parse_alternatives());
      if (pos_ >= end_ || p_[pos_] != ')') return error("expected \")\"");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      ++pos_;
      return parse_class();
    }
    if (c == '.') {
      ++pos_;
      return code_points({{'\n', '\n'}}, /*negate=*/true);
    }
    if (c == '^' || c == '$') {
      return unimplemented_error("regex \"{}\": ^ and $ are supported only at the ends", p_);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return error("a quantifier with nothing to repeat");
    if (c == '\\') {
      ++pos_;
      Ranges ranges;
      char32_t ch = 0;
      PAGODA_ASSIGN_OR_RETURN(bool is_class, parse_escape(ranges, ch));
      if (is_class) return code_points(std::move(ranges), false);
      return literal_char(ch);
    }
    PAGODA_ASSIGN_OR_RETURN(char32_t ch, parse_utf8_char());
    return literal_char(ch);
  }

  StatusOr<ExprPtr> parse_quantifiers(ExprPtr atom) {
    while (pos_ < end_) {
      const char c = p_[pos_];
      uint32_t min = 0, max = 0;
      if (c == '*') {
        min = 0, max = kUnbounded;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = kUnbounded;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{') {
        const size_t save = pos_;
        ++pos_;
        auto number = [&]() -> std::optional<uint32_t> {
          const size_t start = pos_;
          uint64_t v = 0;
          while (pos_ < end_ && std::isdigit(static_cast<unsigned char>(p_[pos_]))) {
            v = v * 10 + static_cast<uint64_t>(p_[pos_++] - '0');
            if (v > 100000) return std::nullopt;
          }
          if (pos_ == start) return std::nullopt;
          return static_cast<uint32_t>(v);
        };
        auto lo = number();
        if (!lo) {
          pos_ = save;  // a literal "{"
          return atom;
        }
        min = max = *lo;
        if (pos_ < end_ && p_[pos_] == ',') {
          ++pos_;
          if (pos_ < end_ && p_[pos_] == '}') {
            max = kUnbounded;
          } else {
            auto hi = number();
            if (!hi) return error("bad {m,n} quantifier");
            max = *hi;
          }
        }
        if (pos_ >= end_ || p_[pos_] != '}') return error("bad {m,n} quantifier");
        ++pos_;
        if (max < min) return error("{m,n} with n < m");
      } else {
        break;
      }
      if (pos_ < end_ && (p_[pos_] == '?' || p_[pos_] == '+')) ++pos_;  // lazy / possessive
      atom = make_repeat(atom, min, max);
    }
    return atom;
  }

  std::string_view p_;
  RegexOptions options_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

}  // namespace

StatusOr<ExprPtr> regex_to_expr(std::string_view pattern, const RegexOptions& options) {
  return RegexParser(pattern, options).parse();
}

StatusOr<std::shared_ptr<const Grammar>> regex_to_grammar(std::string_view pattern) {
  PAGODA_ASSIGN_OR_RETURN(ExprPtr root, regex_to_expr(pattern));
  std::map<std::string, ExprPtr> rules;
  rules["root"] = root;
  return lower_grammar(rules, "root");
}

}  // namespace pagoda::grammar
