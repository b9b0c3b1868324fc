#include "pagoda/grammar/grammar.h"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

namespace pagoda::grammar {

ExprPtr make_sequence(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::kSequence;
  e->children = std::move(items);
  return e;
}

ExprPtr make_alternatives(std::vector<ExprPtr> options) {
  if (options.size() == 1) return options[0];
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::kAlternatives;
  e->children = std::move(options);
  return e;
}

ExprPtr make_literal(std::string bytes) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::kLiteral;
  e->literal = std::move(bytes);
  return e;
}

ExprPtr make_empty() { return make_sequence({}); }

ExprPtr make_code_points(std::vector<std::pair<char32_t, char32_t>> ranges, bool negate) {
  for (auto& [lo, hi] : ranges) {
    if (lo > hi) std::swap(lo, hi);
    hi = std::min(hi, kMaxCodePoint);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (const auto& r : ranges) {
    if (r.first > kMaxCodePoint) continue;
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (negate) {
    std::vector<std::pair<char32_t, char32_t>> complement;
    char32_t next = 0;
    for (const auto& [lo, hi] : merged) {
      if (lo > next) complement.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodePoint) complement.emplace_back(next, kMaxCodePoint);
    merged = std::move(complement);
  }
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::kCodePoints;
  e->ranges = std::move(merged);
  return e;
}

ExprPtr make_rule_ref(std::string name) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::kRuleRef;
  e->rule = std::move(name);
  return e;
}

ExprPtr make_repeat(ExprPtr child, uint32_t min, uint32_t max) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::kRepeat;
  e->children = {std::move(child)};
  e->min = min;
  e->max = max;
  return e;
}

namespace {

int utf8_length(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void encode_utf8(char32_t c, uint8_t* out) {
  switch (utf8_length(c)) {
    case 1: out[0] = static_cast<uint8_t>(c); break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  }
}

// Splits [lo, hi] until every piece has the same UTF-8 length and maps to a product of byte
// ranges (the classic construction: split where a continuation byte would wrap).
void split_utf8(char32_t lo, char32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) split_utf8(lo, 0xD7FF, out);
    if (hi > 0xDFFF) split_utf8(0xE000, hi, out);
    return;
  }
  for (char32_t boundary : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
    if (lo <= boundary && hi > boundary) {
      split_utf8(lo, boundary, out);
      split_utf8(boundary + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_utf8(lo, lo | m, out);
        split_utf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_utf8(lo, (hi & ~m) - 1, out);
        split_utf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode_utf8(lo, a);
  encode_utf8(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> sequence;
  for (int i = 0; i < n; ++i) sequence.emplace_back(a[i], b[i]);
  out.push_back(std::move(sequence));
}

class Lowerer {
 public:
  explicit Lowerer(Grammar& g) : g_(g) {}

  Status declare(const std::string& name) {
    ids_[name] = static_cast<uint32_t>(g_.rules.size());
    g_.rules.push_back({name, {}, false});
    return ok_status();
  }

  Status lower_rule(uint32_t rule, const ExprPtr& body) {
    std::vector<ExprPtr> options;
    if (body->kind == Expr::Kind::kAlternatives) {
      options = body->children;
    } else {
      options = {body};
    }
    for (const ExprPtr& option : options) {
      std::vector<Element> elements;
      PAGODA_RETURN_IF_ERROR(lower_sequence(rule, option, elements));
      elements.push_back({ElementKind::kEnd, 0, 0, 0});
      g_.rules[rule].alternatives.push_back(static_cast<uint32_t>(g_.elements.size()));
      g_.elements.insert(g_.elements.end(), elements.begin(), elements.end());
    }
    return ok_status();
  }

  StatusOr<uint32_t> rule_id(const std::string& name, uint32_t from) const {
    auto it = ids_.find(name);
    if (it == ids_.end()) {
      return invalid_argument_error("grammar rule \"{}\" refers to undefined rule \"{}\"",
                                    g_.rules[from].name, name);
    }
    return it->second;
  }

 private:
  uint32_t byte_set(const ByteSet& set) {
    for (size_t i = 0; i < g_.byte_sets.size(); ++i)
      if (g_.byte_sets[i] == set) return static_cast<uint32_t>(i);
    g_.byte_sets.push_back(set);
    return static_cast<uint32_t>(g_.byte_sets.size() - 1);
  }

  uint32_t helper_rule(uint32_t parent) {
    const uint32_t id = static_cast<uint32_t>(g_.rules.size());
    g_.rules.push_back({fmt::format("{}-{}", g_.rules[parent].name, ++helper_count_[parent]), {}, false});
    return id;
  }

  Status lower_sequence(uint32_t rule, const ExprPtr& e, std::vector<Element>& out) {
    if (e->kind == Expr::Kind::kSequence) {
      for (const ExprPtr& child : e->children) PAGODA_RETURN_IF_ERROR(lower_sequence(rule, child, out));
      return ok_status();
    }
    return lower_item(rule, e, out);
  }

  StatusOr<uint32_t> rule_for(uint32_t rule, const ExprPtr& e) {
    if (e->kind == Expr::Kind::kRuleRef) return rule_id(e->rule, rule);
    if (e->kind == Expr::Kind::kCodePoints) return code_point_rule(rule, e);
    const uint32_t helper = helper_rule(rule);
    PAGODA_RETURN_IF_ERROR(lower_rule(helper, e));
    return helper;
  }

  // One rule per distinct set of code points, shared by every use (one matcher position).
  StatusOr<uint32_t> code_point_rule(uint32_t rule, const ExprPtr& e) {
    if (auto it = code_point_rules_.find(e->ranges); it != code_point_rules_.end()) return it->second;
    const uint32_t helper = helper_rule(rule);
    code_point_rules_[e->ranges] = helper;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> sequences;
    for (const auto& [lo, hi] : e->ranges) split_utf8(lo, hi, sequences);
    // One-byte sequences share one alternative; longer ones are one alternative each.
    ByteSet ascii;
    bool has_ascii = false;
    std::vector<std::vector<Element>> alternatives;
    for (const auto& sequence : sequences) {
      if (sequence.size() == 1) {
        ascii.set_range(sequence[0].first, sequence[0].second);
        has_ascii = true;
        continue;
      }
      std::vector<Element> elements;
      for (const auto& [lo, hi] : sequence) {
        ByteSet set;
        set.set_range(lo, hi);
        elements.push_back({ElementKind::kBytes, byte_set(set), 0, 0});
      }
      alternatives.push_back(std::move(elements));
    }
    if (has_ascii) alternatives.insert(alternatives.begin(), {{ElementKind::kBytes, byte_set(ascii), 0, 0}});
    for (auto& elements : alternatives) {
      elements.push_back({ElementKind::kEnd, 0, 0, 0});
      g_.rules[helper].alternatives.push_back(static_cast<uint32_t>(g_.elements.size()));
      g_.elements.insert(g_.elements.end(), elements.begin(), elements.end());
    }
    return helper;
  }

  Status lower_item(uint32_t rule, const ExprPtr& e, std::vector<Element>& out) {
    switch (e->kind) {
      case Expr::Kind::kSequence:
        return lower_sequence(rule, e, out);
      case Expr::Kind::kLiteral:
        for (unsigned char c : e->literal) {
          ByteSet set;
          set.set_range(c, c);
          out.push_back({ElementKind::kBytes, byte_set(set), 0, 0});
        }
        return ok_status();
      case Expr::Kind::kCodePoints: {
        if (e->ranges.empty()) {
          return invalid_argument_error("grammar rule \"{}\": a character class that matches nothing",
                                        g_.rules[rule].name);
        }
        if (e->ranges.back().second < 0x80) {
          ByteSet set;
          for (const auto& [lo, hi] : e->ranges) set.set_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
          out.push_back({ElementKind::kBytes, byte_set(set), 0, 0});
          return ok_status();
        }
        PAGODA_ASSIGN_OR_RETURN(uint32_t id, code_point_rule(rule, e));
        out.push_back({ElementKind::kRule, id, 0, 0});
        return ok_status();
      }
      case Expr::Kind::kRuleRef: {
        PAGODA_ASSIGN_OR_RETURN(uint32_t id, rule_id(e->rule, rule));
        out.push_back({ElementKind::kRule, id, 0, 0});
        return ok_status();
      }
      case Expr::Kind::kAlternatives: {
        PAGODA_ASSIGN_OR_RETURN(uint32_t id, rule_for(rule, e));
        out.push_back({ElementKind::kRule, id, 0, 0});
        return ok_status();
      }
      case Expr::Kind::kRepeat: {
        if (e->max != kUnbounded && e->min > e->max) {
          return invalid_argument_error("grammar rule \"{}\": repetition {{{},{}}} has min > max",
                                        g_.rules[rule].name, e->min, e->max);
        }
        if (e->max == 0) return ok_status();
        if (e->min == 1 && e->max == 1) return lower_item(rule, e->children[0], out);
        PAGODA_ASSIGN_OR_RETURN(uint32_t id, rule_for(rule, e->children[0]));
        out.push_back({ElementKind::kRepeat, id, e->min, e->max});
        return ok_status();
      }
    }
    return internal_error("unknown expression kind");
  }

  Grammar& g_;
  std::map<std::string, uint32_t> ids_;
  std::map<uint32_t, int> helper_count_;
  std::map<std::vector<std::pair<char32_t, char32_t>>, uint32_t> code_point_rules_;
};

bool element_nullable(const Grammar& g, const Element& e) {
  switch (e.kind) {
    case ElementKind::kBytes: return false;
    case ElementKind::kRule: return g.rules[e.index].nullable;
    case ElementKind::kRepeat: return e.min == 0 || g.rules[e.index].nullable;
    case ElementKind::kEnd: return true;
  }
  return false;
}

void compute_nullable(Grammar& g) {
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& rule : g.rules) {
      if (rule.nullable) continue;
      for (uint32_t start : rule.alternatives) {
        bool all = true;
        for (uint32_t i = start; g.elements[i].kind != ElementKind::kEnd; ++i) {
          if (!element_nullable(g, g.elements[i])) {
            all = false;
            break;
          }
        }
        if (all) {
          rule.nullable = true;
          changed = true;
          break;
        }
      }
    }
  }
}

// Left recursion and unbounded repetition of nullable rules make the matcher's closure endless.
Status check_termination(const Grammar& g) {
  const size_t n = g.rules.size();
  std::vector<std::vector<uint32_t>> first_refs(n);
  for (size_t r = 0; r < n; ++r) {
    for (uint32_t start : g.rules[r].alternatives) {
      for (uint32_t i = start; g.elements[i].kind != ElementKind::kEnd; ++i) {
        const Element& e = g.elements[i];
        if (e.kind == ElementKind::kRepeat && e.max == kUnbounded && g.rules[e.index].nullable) {
          return invalid_argument_error(
              "grammar rule \"{}\": unbounded repetition of \"{}\", which can match nothing",
              g.rules[r].name, g.rules[e.index].name);
        }
        if (e.kind == ElementKind::kRule || e.kind == ElementKind::kRepeat) first_refs[r].push_back(e.index);
        if (!element_nullable(g, e)) break;
      }
    }
  }
  std::vector<int> state(n, 0);  // 0 new, 1 on the path, 2 done
  std::function<Status(uint32_t)> visit = [&](uint32_t r) -> Status {
    state[r] = 1;
    for (uint32_t next : first_refs[r]) {
      if (state[next] == 1) {
        return invalid_argument_error("grammar rule \"{}\" is left-recursive (through \"{}\")",
                                      g.rules[next].name, g.rules[r].name);
      }
      if (state[next] == 0) PAGODA_RETURN_IF_ERROR(visit(next));
    }
    state[r] = 2;
    return ok_status();
  };
  for (uint32_t r = 0; r < n; ++r)
    if (state[r] == 0) PAGODA_RETURN_IF_ERROR(visit(r));
  return ok_status();
}

std::string byte_set_text(const ByteSet& set) {
  std::string text = "[";
  for (int b = 0; b < 256;) {
    if (!set.test(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set.test(static_cast<uint8_t>(e + 1))) ++e;
    text += fmt::format("\\x{:02X}", b);
    if (e > b) text += fmt::format("-\\x{:02X}", e);
    b = e + 1;
  }
  return text + "]";
}

}  // namespace

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(char32_t lo, char32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  split_utf8(lo, std::min(hi, kMaxCodePoint), out);
  return out;
}

StatusOr<std::shared_ptr<const Grammar>> lower_grammar(const std::map<std::string, ExprPtr>& rules,
                                                       const std::string& root) {
  auto g = std::make_shared<Grammar>();
  Lowerer lowerer(*g);
  if (!rules.contains(root)) return invalid_argument_error("grammar has no \"{}\" rule", root);
  for (const auto& [name, body] : rules) PAGODA_RETURN_IF_ERROR(lowerer.declare(name));
  uint32_t id = 0;
  for (const auto& [name, body] : rules) PAGODA_RETURN_IF_ERROR(lowerer.lower_rule(id++, body));
  PAGODA_ASSIGN_OR_RETURN(g->root, lowerer.rule_id(root, 0));
  compute_nullable(*g);
  PAGODA_RETURN_IF_ERROR(check_termination(*g));
  return std::shared_ptr<const Grammar>(std::move(g));
}

std::string Grammar::to_string() const {
  std::string text;
  for (const Rule& rule : rules) {
    text += rule.name + " ::=";
    for (size_t a = 0; a < rule.alternatives.size(); ++a) {
      if (a > 0) text += " |";
      for (uint32_t i = rule.alternatives[a]; elements[i].kind != ElementKind::kEnd; ++i) {
        const Element& e = elements[i];
        if (e.kind == ElementKind::kBytes) text += " " + byte_set_text(byte_sets[e.index]);
        else if (e.kind == ElementKind::kRule) text += " " + rules[e.index].name;
        else if (e.max == kUnbounded) text += fmt::format(" {}{{{},}}", rules[e.index].name, e.min);
        else text += fmt::format(" {}{{{},{}}}", rules[e.index].name, e.min, e.max);
      }
    }
    text += "\n";
  }
  return text;
}

}  // namespace pagoda::grammar
