#include "pagoda/chat/filters.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "pagoda/chat/call_args.h"
#include "pagoda/chat/interpreter.h"
#include "pagoda/chat/methods.h"
#include "pagoda/chat/operators.h"
#include "pagoda/chat/python_json.h"
#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {
namespace {

// ---- helpers ----

Status undefined_error(const Value& value) { return invalid_argument_error("{}", value.undefined_hint()); }

// Jinja's make_attrgetter: "a.b.0" walks attributes/items; integer parts index.
StatusOr<Value> get_path(Interpreter& interpreter, const Value& object, const Value& attribute) {
  if (attribute.is_integral()) return interpreter.get_item(object, attribute);
  if (!attribute.is_string()) return invalid_argument_error("attribute must be a string, not {}", type_name(attribute));
  Value current = object;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    PAGODA_ASSIGN_OR_RETURN(current, numeric ? interpreter.get_item(current, Value(static_cast<int64_t>(std::stoll(part))))
                                             : interpreter.get_item(current, Value(part)));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// Sort key: lowercased strings unless case_sensitive (Jinja's ignore_case).
Value sort_key(const Value& value, bool case_sensitive) {
  if (!case_sensitive && value.is_string()) return Value(python_lower(value.as_string()));
  return value;
}

// Stable sort by precomputed keys; fails like Python on incomparable keys.
StatusOr<std::vector<Value>> sorted_by_keys(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status failure;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!failure.ok()) return false;
    auto c = compare_values(keys[a], keys[b]);
    if (!c.ok()) {
      failure = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  PAGODA_RETURN_IF_ERROR(failure);
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

StatusOr<std::vector<Value>> keys_for(Interpreter& interpreter, const std::vector<Value>& items, const Value& attribute,
                                      bool case_sensitive) {
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    Value key = item;
    if (!attribute.is_none()) {
      PAGODA_ASSIGN_OR_RETURN(key, get_path(interpreter, item, attribute));
    }
    // lowercasing copies each key, even when every item is the same long string
    if (!WorkMeter::spend(approximate_size(key))) return WorkMeter::exhausted_error();
    keys.push_back(sort_key(key, case_sensitive));
  }
  return keys;
}

// ---- filters ----

StatusOr<Value> filter_tojson(Interpreter&, const Value& subject, CallArgs& call_args) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  ArgReader args("tojson", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value ensure_ascii, args.take_or("ensure_ascii", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value indent, args.take_or("indent", Value::none()));
  PAGODA_ASSIGN_OR_RETURN(Value separators, args.take_or("separators", Value::none()));
  PAGODA_ASSIGN_OR_RETURN(Value sort_keys, args.take_or("sort_keys", Value(false)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PythonJsonOptions options;
  options.ensure_ascii = is_truthy(ensure_ascii);
  options.sort_keys = is_truthy(sort_keys);
  if (indent.is_integral()) {
    options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 256))), ' ');
  } else if (indent.is_string()) {
    options.indent = indent.as_string();
  } else if (!indent.is_none()) {
    return invalid_argument_error("indent must be an int, a str or None, not {}", type_name(indent));
  }
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.as_list()->items.size() != 2 || !separators.as_list()->items[0].is_string() ||
        !separators.as_list()->items[1].is_string()) {
      return invalid_argument_error("separators must be a pair of strings, like (',', ': ')");
    }
    options.item_separator = separators.as_list()->items[0].as_string();
    options.key_separator = separators.as_list()->items[1].as_string();
  }
  PAGODA_ASSIGN_OR_RETURN(std::string text, python_json_dumps(subject, options));
  return Value(std::move(text));
}

StatusOr<Value> filter_trim(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("trim", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value chars, args.take_or("chars", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string text = to_python_str(subject);
  if (chars.is_none()) return Value(python_strip(text, true, true));
  return Value(python_strip_chars(text, to_python_str(chars), true, true));
}

StatusOr<Value> filter_length(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("length", call_args).finish());
  switch (subject.kind()) {
    case Value::Kind::kUndefined: return Value(0);
    case Value::Kind::kString: return Value(static_cast<int64_t>(code_point_count(subject.as_string())));
    case Value::Kind::kList: return Value(static_cast<int64_t>(subject.as_list()->items.size()));
    case Value::Kind::kDict:
      if (!subject.as_dict()->is_namespace) return Value(static_cast<int64_t>(subject.as_dict()->size()));
      break;
    default: break;
  }
  return invalid_argument_error("object of type '{}' has no len()", type_name(subject));
}

template <std::string (*Transform)(std::string_view)>
StatusOr<Value> string_filter(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("filter", call_args).finish());
  return Value(Transform(to_python_str(subject)));
}

StatusOr<Value> filter_string(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("string", call_args).finish());
  return subject.is_string() ? subject : Value(to_python_str(subject));
}

StatusOr<Value> filter_safe(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("safe", call_args).finish());
  return subject.is_string() ? subject : Value(to_python_str(subject));
}

StatusOr<Value> filter_escape(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("escape", call_args).finish());
  const std::string text = subject.is_none() ? "None" : to_python_str(subject);
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return Value(std::move(out));
}

StatusOr<Value> filter_default(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("default", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value fallback, args.take_or("default_value", Value("")));
  PAGODA_ASSIGN_OR_RETURN(Value boolean, args.take_or("boolean", Value(false)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (subject.is_undefined() || (is_truthy(boolean) && !is_truthy(subject))) return fallback;
  return subject;
}

StatusOr<Value> filter_join(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("join", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value separator, args.take_or("d", Value("")));
  PAGODA_ASSIGN_OR_RETURN(Value attribute, args.take_or("attribute", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  const std::string glue = to_python_str(separator);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (!attribute.is_none()) {
      PAGODA_ASSIGN_OR_RETURN(item, get_path(interpreter, item, attribute));
    }
    if (i > 0) out += glue;
    out += to_python_str(item);
    PAGODA_RETURN_IF_ERROR(interpreter.check_size(out.size()));
  }
  return Value(std::move(out));
}

StatusOr<Value> filter_list(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("list", call_args).finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  return Value::list(std::move(items));
}

StatusOr<Value> filter_items(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("items", call_args).finish());
  if (subject.is_undefined()) return Value::list({});
  if (!subject.is_dict() || subject.as_dict()->is_namespace) {
    return invalid_argument_error("Can only get item pairs from a mapping, not {}", type_name(subject));
  }
  std::vector<Value> pairs;
  for (const auto& [key, value] : subject.as_dict()->entries()) pairs.push_back(Value::tuple({key, value}));
  return Value::list(std::move(pairs));
}

StatusOr<Value> filter_first(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("first", call_args).finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

StatusOr<Value> filter_last(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("last", call_args).finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

StatusOr<Value> filter_reverse(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("reverse", call_args).finish());
  if (subject.is_string()) {
    return slice_sequence(subject, Value::none(), Value::none(), Value(-1));
  }
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

StatusOr<Value> filter_int(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("int", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value fallback, args.take_or("default", Value(0)));
  PAGODA_ASSIGN_OR_RETURN(Value base, args.take_or("base", Value(10)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (subject.is_undefined()) return undefined_error(subject);  // int(Undefined) raises in Jinja
  if (subject.is_integral()) return Value(subject.as_int());
  if (subject.is_float()) {
    const double d = subject.as_double();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
    return Value(static_cast<int64_t>(d));
  }
  if (!subject.is_string()) return fallback;
  const std::string text = python_strip(subject.as_string(), true, true);
  std::string digits;
  for (char c : text) {
    if (c != '_') digits.push_back(c);
  }
  const int radix = base.is_integral() ? static_cast<int>(base.as_int()) : 10;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(digits.c_str(), &end, radix);
  if (!digits.empty() && errno == 0 && end != nullptr && *end == '\0') return Value(static_cast<int64_t>(parsed));
  // "42.23"|int is 42: Jinja falls back to int(float(value))
  errno = 0;
  const double d = std::strtod(text.c_str(), &end);
  if (!text.empty() && errno == 0 && end != nullptr && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
    return Value(static_cast<int64_t>(d));
  }
  return fallback;
}

StatusOr<Value> filter_float(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("float", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value fallback, args.take_or("default", Value(0.0)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (subject.is_undefined()) return undefined_error(subject);
  if (subject.is_number()) return Value(subject.as_double());
  if (!subject.is_string()) return fallback;
  const std::string text = python_strip(subject.as_string(), true, true);
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (!text.empty() && end != nullptr && *end == '\0') return Value(d);
  return fallback;
}

StatusOr<Value> filter_abs(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("abs", call_args).finish());
  if (subject.is_float()) return Value(std::fabs(subject.as_double()));
  if (subject.is_integral()) return Value(subject.as_int() < 0 ? -subject.as_int() : subject.as_int());
  return invalid_argument_error("bad operand type for abs(): '{}'", type_name(subject));
}

StatusOr<Value> filter_round(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("round", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value precision, args.take_or("precision", Value(0)));
  PAGODA_ASSIGN_OR_RETURN(Value method, args.take_or("method", Value("common")));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (!subject.is_number() || !precision.is_integral()) {
    return invalid_argument_error("round needs a number and an int precision");
  }
  const std::string how = to_python_str(method);
  if (how != "common" && how != "ceil" && how != "floor") {
    return invalid_argument_error("method must be common, ceil or floor, not '{}'", how);
  }
  const int64_t digits = std::clamp<int64_t>(precision.as_int(), -300, 300);
  if (how == "common" && subject.is_integral() && digits >= 0) return Value(subject.as_int());
  const double x = subject.as_double();
  if (how == "common") {  // Python's round(): correctly rounded, ties to even; printf does the same
    if (digits >= 0) {
      char buffer[512];
      std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(digits), x);
      return Value(std::strtod(buffer, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(-digits));
    return Value(std::nearbyint(x / scale) * scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(digits));
  return Value((how == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
}

StatusOr<Value> filter_replace(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("replace", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value old_text, args.take_required("old"));
  PAGODA_ASSIGN_OR_RETURN(Value new_text, args.take_required("new"));
  PAGODA_ASSIGN_OR_RETURN(Value count, args.take_or("count", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  CallArgs method_args;
  method_args.positional = {Value(to_python_str(old_text)), Value(to_python_str(new_text)),
                            count.is_none() ? Value(-1) : count};
  std::optional<Value> replace = find_method(Value(to_python_str(subject)), "replace");
  PAGODA_ASSIGN_OR_RETURN(Value result, interpreter.call(*replace, method_args));
  PAGODA_RETURN_IF_ERROR(interpreter.check_size(result.as_string().size()));
  return result;
}

StatusOr<Value> filter_indent(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("indent", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value width, args.take_or("width", Value(4)));
  PAGODA_ASSIGN_OR_RETURN(Value first, args.take_or("first", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value blank, args.take_or("blank", Value(false)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  std::string indention;
  if (width.is_string()) {
    indention = width.as_string();
  } else if (width.is_integral()) {
    indention.assign(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1024)), ' ');
  } else {
    return invalid_argument_error("width must be an int or a str, not {}", type_name(width));
  }
  // Jinja appends "\n" (so only strings work) then uses str.splitlines(), which drops it again
  if (!subject.is_string()) {
    return invalid_argument_error("unsupported operand type(s) for +=: '{}' and 'str'", type_name(subject));
  }
  std::string text = subject.as_string() + "\n";
  CallArgs no_args;
  PAGODA_ASSIGN_OR_RETURN(Value split, interpreter.call(*find_method(Value(text), "splitlines"), no_args));
  std::vector<std::string> lines;
  for (const Value& line : split.as_list()->items) lines.push_back(line.as_string());
  std::string out;
  if (is_truthy(blank)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indention;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention + lines[i];
    }
  }
  if (is_truthy(first)) out = indention + out;
  return Value(std::move(out));
}

StatusOr<Value> filter_sort(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("sort", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value reverse, args.take_or("reverse", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value case_sensitive, args.take_or("case_sensitive", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value attribute, args.take_or("attribute", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> keys, keys_for(interpreter, items, attribute, is_truthy(case_sensitive)));
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> sorted, sorted_by_keys(std::move(items), keys, is_truthy(reverse)));
  return Value::list(std::move(sorted));
}

StatusOr<Value> filter_dictsort(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("dictsort", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value case_sensitive, args.take_or("case_sensitive", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value by, args.take_or("by", Value("key")));
  PAGODA_ASSIGN_OR_RETURN(Value reverse, args.take_or("reverse", Value(false)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (!subject.is_dict() || subject.as_dict()->is_namespace) {
    return invalid_argument_error("dictsort needs a dict, not {}", type_name(subject));
  }
  const std::string by_text = to_python_str(by);
  if (by_text != "key" && by_text != "value") return invalid_argument_error("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> pairs;
  std::vector<Value> keys;
  for (const auto& [key, value] : subject.as_dict()->entries()) {
    pairs.push_back(Value::tuple({key, value}));
    keys.push_back(sort_key(by_text == "key" ? key : value, is_truthy(case_sensitive)));
  }
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> sorted, sorted_by_keys(std::move(pairs), keys, is_truthy(reverse)));
  return Value::list(std::move(sorted));
}

StatusOr<Value> filter_unique(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("unique", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value case_sensitive, args.take_or("case_sensitive", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value attribute, args.take_or("attribute", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> keys, keys_for(interpreter, items, attribute, is_truthy(case_sensitive)));
  // Jinja keeps a set of the keys seen: hashable keys (str, numbers, tuples) are looked up by
  // hash_key(); the rest (lists, dicts) by comparison with each unhashable key seen, counted
  // as loop iterations so that n distinct lists cannot take n^2 time.
  std::vector<Value> out;
  std::unordered_set<std::string> seen_hashes;
  std::vector<Value> seen_unhashable;
  for (size_t i = 0; i < items.size(); ++i) {
    if (std::optional<std::string> hashed = hash_key(keys[i])) {
      if (!seen_hashes.insert(std::move(*hashed)).second) continue;
    } else {
      PAGODA_RETURN_IF_ERROR(interpreter.count_iterations(seen_unhashable.size()));
      const auto equal = [&](const Value& s) { return values_equal(s, keys[i]); };
      if (std::any_of(seen_unhashable.begin(), seen_unhashable.end(), equal)) continue;
      seen_unhashable.push_back(keys[i]);
    }
    out.push_back(items[i]);
  }
  if (WorkMeter::exhausted()) return WorkMeter::exhausted_error();
  return Value::list(std::move(out));
}

StatusOr<Value> min_max(Interpreter& interpreter, const Value& subject, CallArgs& call_args, bool want_max) {
  ArgReader args(want_max ? "max" : "min", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value case_sensitive, args.take_or("case_sensitive", Value(false)));
  PAGODA_ASSIGN_OR_RETURN(Value attribute, args.take_or("attribute", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> keys, keys_for(interpreter, items, attribute, is_truthy(case_sensitive)));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    PAGODA_ASSIGN_OR_RETURN(int c, compare_values(keys[i], keys[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
StatusOr<Value> filter_max(Interpreter& i, const Value& s, CallArgs& a) { return min_max(i, s, a, true); }
StatusOr<Value> filter_min(Interpreter& i, const Value& s, CallArgs& a) { return min_max(i, s, a, false); }

StatusOr<Value> filter_sum(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("sum", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value attribute, args.take_or("attribute", Value::none()));
  PAGODA_ASSIGN_OR_RETURN(Value total, args.take_or("start", Value(0)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  for (const Value& item : items) {
    Value term = item;
    if (!attribute.is_none()) {
      PAGODA_ASSIGN_OR_RETURN(term, get_path(interpreter, item, attribute));
    }
    PAGODA_ASSIGN_OR_RETURN(total, apply_binary_operator("+", total, term, interpreter.options().limits.max_output_bytes));
  }
  return total;
}

StatusOr<Value> filter_attr(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  ArgReader args("attr", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value name, args.take_required("name"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string attribute = to_python_str(name);
  // attributes only, never keys (Jinja's do_attr uses getattr)
  if (subject.is_dict() && subject.as_dict()->is_namespace) return interpreter.get_attribute(subject, attribute);
  if (std::optional<Value> method = find_method(subject, attribute)) return std::move(*method);
  if (subject.is_loop()) return interpreter.get_attribute(subject, attribute);
  return Value::undefined(object_description(subject) + " has no attribute '" + attribute + "'");
}

StatusOr<Value> filter_map(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  if (!is_truthy(subject)) return Value::list({});  // Jinja: `if value:` before iterating
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  std::vector<Value> out;
  out.reserve(items.size());
  if (call_args.positional.empty()) {  // map(attribute='x', default=...)
    ArgReader args("map", call_args);
    PAGODA_ASSIGN_OR_RETURN(Value attribute, args.take_required("attribute"));
    PAGODA_ASSIGN_OR_RETURN(std::optional<Value> fallback, args.take("default"));
    PAGODA_RETURN_IF_ERROR(args.finish());
    for (const Value& item : items) {
      PAGODA_ASSIGN_OR_RETURN(Value mapped, get_path(interpreter, item, attribute));
      if (mapped.is_undefined() && fallback) mapped = *fallback;
      out.push_back(std::move(mapped));
    }
    return Value::list(std::move(out));
  }
  const std::string filter_name = to_python_str(call_args.positional[0]);
  CallArgs rest;
  rest.positional.assign(call_args.positional.begin() + 1, call_args.positional.end());
  rest.keyword = call_args.keyword;
  for (const Value& item : items) {
    CallArgs per_item = rest;
    PAGODA_ASSIGN_OR_RETURN(Value mapped, interpreter.apply_filter(filter_name, item, per_item));
    out.push_back(std::move(mapped));
  }
  return Value::list(std::move(out));
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...)
StatusOr<Value> select_impl(Interpreter& interpreter, const Value& subject, CallArgs& call_args, bool keep_matches,
                            bool by_attribute) {
  if (!is_truthy(subject)) return Value::list({});  // Jinja: `if value:` before iterating
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (call_args.positional.empty()) return invalid_argument_error("missing the attribute to test");
    attribute = call_args.positional[next++];
  }
  std::string test_name;
  if (next < call_args.positional.size()) test_name = to_python_str(call_args.positional[next++]);
  CallArgs test_args;
  test_args.positional.assign(call_args.positional.begin() + static_cast<long>(next), call_args.positional.end());
  test_args.keyword = call_args.keyword;
  std::vector<Value> out;
  for (const Value& item : items) {
    Value probe = item;
    if (by_attribute) {
      PAGODA_ASSIGN_OR_RETURN(probe, get_path(interpreter, item, attribute));
    }
    bool passed = false;
    if (test_name.empty()) {
      passed = is_truthy(probe);
    } else {
      CallArgs per_item = test_args;
      PAGODA_ASSIGN_OR_RETURN(passed, interpreter.apply_test(test_name, probe, per_item));
    }
    if (passed == keep_matches) out.push_back(item);
  }
  return Value::list(std::move(out));
}
StatusOr<Value> filter_select(Interpreter& i, const Value& s, CallArgs& a) { return select_impl(i, s, a, true, false); }
StatusOr<Value> filter_reject(Interpreter& i, const Value& s, CallArgs& a) { return select_impl(i, s, a, false, false); }
StatusOr<Value> filter_selectattr(Interpreter& i, const Value& s, CallArgs& a) { return select_impl(i, s, a, true, true); }
StatusOr<Value> filter_rejectattr(Interpreter& i, const Value& s, CallArgs& a) { return select_impl(i, s, a, false, true); }

// "%s and %s"|format(a, b): printf-style, like the % operator.
StatusOr<Value> filter_format(Interpreter& interpreter, const Value& subject, CallArgs& call_args) {
  if (!call_args.keyword.empty()) return unimplemented_error("format with keyword arguments is not supported");
  if (!subject.is_string()) return invalid_argument_error("format needs a string, not {}", type_name(subject));
  // Jinja: soft_str(value) % args, with args always a tuple
  return python_percent_format(subject.as_string(), Value::tuple(call_args.positional),
                               interpreter.options().limits.max_output_bytes);
}

std::string upper_text(std::string_view s) { return python_upper(s); }
std::string lower_text(std::string_view s) { return python_lower(s); }
// Jinja's title filter is not str.title(): it capitalizes the first letter after whitespace,
// '-', '(', '{', '[' or '<' and lowercases the rest ("they're" -> "They're").
std::string title_text(std::string_view s) {
  std::string out;
  bool at_word_start = true;
  size_t offset = 0;
  while (offset < s.size()) {
    size_t length = 1;
    const char32_t c = decode_utf8_at(s, offset, &length);
    const bool separator = is_python_whitespace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    const std::string_view piece = s.substr(offset, length);
    if (separator) {
      out.append(piece);
      at_word_start = true;
    } else {
      out += at_word_start ? python_upper(piece) : python_lower(piece);
      at_word_start = false;
    }
    offset += length;
  }
  return out;
}
std::string capitalize_text(std::string_view s) { return python_capitalize(s); }

struct FilterEntry {
  std::string_view name;
  FilterFunction function;
};

constexpr std::array kFilters = {
    FilterEntry{"abs", filter_abs},
    FilterEntry{"attr", filter_attr},
    FilterEntry{"capitalize", string_filter<capitalize_text>},
    FilterEntry{"count", filter_length},
    FilterEntry{"d", filter_default},
    FilterEntry{"default", filter_default},
    FilterEntry{"dictsort", filter_dictsort},
    FilterEntry{"e", filter_escape},
    FilterEntry{"escape", filter_escape},
    FilterEntry{"first", filter_first},
    FilterEntry{"float", filter_float},
    FilterEntry{"format", filter_format},
    FilterEntry{"indent", filter_indent},
    FilterEntry{"int", filter_int},
    FilterEntry{"items", filter_items},
    FilterEntry{"join", filter_join},
    FilterEntry{"last", filter_last},
    FilterEntry{"length", filter_length},
    FilterEntry{"list", filter_list},
    FilterEntry{"lower", string_filter<lower_text>},
    FilterEntry{"map", filter_map},
    FilterEntry{"max", filter_max},
    FilterEntry{"min", filter_min},
    FilterEntry{"reject", filter_reject},
    FilterEntry{"rejectattr", filter_rejectattr},
    FilterEntry{"replace", filter_replace},
    FilterEntry{"reverse", filter_reverse},
    FilterEntry{"round", filter_round},
    FilterEntry{"safe", filter_safe},
    FilterEntry{"select", filter_select},
    FilterEntry{"selectattr", filter_selectattr},
    FilterEntry{"sort", filter_sort},
    FilterEntry{"string", filter_string},
    FilterEntry{"sum", filter_sum},
    FilterEntry{"title", string_filter<title_text>},
    FilterEntry{"tojson", filter_tojson},
    FilterEntry{"trim", filter_trim},
    FilterEntry{"unique", filter_unique},
    FilterEntry{"upper", string_filter<upper_text>},
};

}  // namespace

FilterFunction find_filter(std::string_view name) {
  for (const FilterEntry& entry : kFilters) {
    if (entry.name == name) return entry.function;
  }
  return nullptr;
}

}  // namespace pagoda::chat
