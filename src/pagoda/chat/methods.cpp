#include "pagoda/chat/methods.h"

#include <algorithm>
#include <array>

#include "pagoda/chat/call_args.h"
#include "pagoda/chat/interpreter.h"
#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {
namespace {

using Method = StatusOr<Value> (*)(const Value& receiver, ArgReader& args);

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const std::string& part : parts) items.emplace_back(part);
  return Value::list(std::move(items));
}

// Splitting makes one value per part: charged for the most parts the text could give (one
// per separator), before any is built, so a long text of separators cannot allocate past the
// render's work limit.
Status charge_parts(const std::string& text, size_t separator_bytes) {
  const uint64_t most_parts = text.size() / std::max<size_t>(separator_bytes, 1) + 1;
  return WorkMeter::spend(most_parts * 16) ? ok_status() : WorkMeter::exhausted_error();
}

StatusOr<std::string> string_argument(ArgReader& args, std::string_view name) {
  PAGODA_ASSIGN_OR_RETURN(Value value, args.take_required(name));
  if (!value.is_string()) {
    return invalid_argument_error("{}: argument '{}' must be str, not {}", args.function_name(), name, type_name(value));
  }
  return value.as_string();
}

// prefix/suffix may be a str or a tuple of str, as in Python.
StatusOr<bool> affix_matches(const Value& receiver, ArgReader& args, bool prefix) {
  PAGODA_ASSIGN_OR_RETURN(Value affix, args.take_required(prefix ? "prefix" : "suffix"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  const auto matches = [&](const Value& candidate) -> StatusOr<bool> {
    if (!candidate.is_string()) {
      return invalid_argument_error("{}: arguments must be str or a tuple of str, not {}", args.function_name(),
                                    type_name(candidate));
    }
    const std::string& a = candidate.as_string();
    if (a.size() > text.size()) return false;
    return prefix ? text.compare(0, a.size(), a) == 0 : text.compare(text.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list()) {
    for (const Value& candidate : affix.as_list()->items) {
      PAGODA_ASSIGN_OR_RETURN(bool match, matches(candidate));
      if (match) return true;
    }
    return false;
  }
  return matches(affix);
}

StatusOr<Value> str_startswith(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(bool match, affix_matches(receiver, args, true));
  return Value(match);
}

StatusOr<Value> str_endswith(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(bool match, affix_matches(receiver, args, false));
  return Value(match);
}

StatusOr<Value> strip_impl(const Value& receiver, ArgReader& args, bool left, bool right) {
  PAGODA_ASSIGN_OR_RETURN(Value chars, args.take_or("chars", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (chars.is_none()) return Value(python_strip(receiver.as_string(), left, right));
  if (!chars.is_string()) {
    return invalid_argument_error("{}: arg must be None or str, not {}", args.function_name(), type_name(chars));
  }
  return Value(python_strip_chars(receiver.as_string(), chars.as_string(), left, right));
}
StatusOr<Value> str_strip(const Value& r, ArgReader& a) { return strip_impl(r, a, true, true); }
StatusOr<Value> str_lstrip(const Value& r, ArgReader& a) { return strip_impl(r, a, true, false); }
StatusOr<Value> str_rstrip(const Value& r, ArgReader& a) { return strip_impl(r, a, false, true); }

StatusOr<Value> split_impl(const Value& receiver, ArgReader& args, bool from_right) {
  PAGODA_ASSIGN_OR_RETURN(Value separator, args.take_or("sep", Value::none()));
  PAGODA_ASSIGN_OR_RETURN(Value max_split, args.take_or("maxsplit", Value(-1)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (!max_split.is_integral()) {
    return invalid_argument_error("{}: maxsplit must be an int, not {}", args.function_name(), type_name(max_split));
  }
  const std::string& text = receiver.as_string();
  if (separator.is_none()) {
    if (from_right && max_split.as_int() >= 0) {
      return unimplemented_error("str.rsplit() without a separator but with maxsplit is not supported");
    }
    PAGODA_RETURN_IF_ERROR(charge_parts(text, 1));
    return string_list(python_split_whitespace(text, max_split.as_int()));
  }
  if (!separator.is_string()) {
    return invalid_argument_error("{}: must be str or None, not {}", args.function_name(), type_name(separator));
  }
  if (separator.as_string().empty()) return invalid_argument_error("{}: empty separator", args.function_name());
  PAGODA_RETURN_IF_ERROR(charge_parts(text, separator.as_string().size()));
  return string_list(from_right ? python_rsplit(text, separator.as_string(), max_split.as_int())
                                : python_split(text, separator.as_string(), max_split.as_int()));
}
StatusOr<Value> str_split(const Value& r, ArgReader& a) { return split_impl(r, a, false); }
StatusOr<Value> str_rsplit(const Value& r, ArgReader& a) { return split_impl(r, a, true); }

StatusOr<Value> str_splitlines(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(Value keep_ends, args.take_or("keepends", Value(false)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  PAGODA_RETURN_IF_ERROR(charge_parts(text, 1));
  std::vector<std::string> lines;
  size_t start = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 1;
    const char32_t c = decode_utf8_at(text, offset, &length);
    const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                          c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      offset += length;
      continue;
    }
    size_t end = offset + length;
    if (c == '\r' && end < text.size() && text[end] == '\n') ++end;
    lines.push_back(text.substr(start, (is_truthy(keep_ends) ? end : offset) - start));
    start = offset = end;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return string_list(lines);
}

StatusOr<Value> str_upper(const Value& r, ArgReader& a) {
  PAGODA_RETURN_IF_ERROR(a.finish());
  return Value(python_upper(r.as_string()));
}
StatusOr<Value> str_lower(const Value& r, ArgReader& a) {
  PAGODA_RETURN_IF_ERROR(a.finish());
  return Value(python_lower(r.as_string()));
}
StatusOr<Value> str_title(const Value& r, ArgReader& a) {
  PAGODA_RETURN_IF_ERROR(a.finish());
  return Value(python_title(r.as_string()));
}
StatusOr<Value> str_capitalize(const Value& r, ArgReader& a) {
  PAGODA_RETURN_IF_ERROR(a.finish());
  return Value(python_capitalize(r.as_string()));
}

StatusOr<Value> str_replace(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(std::string old_text, string_argument(args, "old"));
  PAGODA_ASSIGN_OR_RETURN(std::string new_text, string_argument(args, "new"));
  PAGODA_ASSIGN_OR_RETURN(Value count_value, args.take_or("count", Value(-1)));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (!count_value.is_integral()) return invalid_argument_error("str.replace: count must be an int");
  int64_t count = count_value.as_int();
  const std::string& text = receiver.as_string();
  std::string out;
  if (old_text.empty()) {  // Python inserts `new` around every code point
    const std::vector<size_t> offsets = code_point_offsets(text);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count != 0) {
        out += new_text;
        --count;
      }
      out.append(text, offsets[i], offsets[i + 1] - offsets[i]);
    }
    if (count != 0) out += new_text;
    return Value(std::move(out));
  }
  size_t start = 0;
  while (count != 0) {
    const size_t found = text.find(old_text, start);
    if (found == std::string::npos) break;
    out.append(text, start, found - start);
    out += new_text;
    start = found + old_text.size();
    --count;
  }
  out.append(text, start, std::string::npos);
  return Value(std::move(out));
}

StatusOr<Value> find_impl(const Value& receiver, ArgReader& args, bool from_right, bool must_find) {
  PAGODA_ASSIGN_OR_RETURN(std::string needle, string_argument(args, "sub"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  const size_t found = from_right ? text.rfind(needle) : text.find(needle);
  if (found == std::string::npos) {
    if (must_find) return invalid_argument_error("substring not found");
    return Value(-1);
  }
  return Value(static_cast<int64_t>(code_point_count(std::string_view(text).substr(0, found))));
}
StatusOr<Value> str_find(const Value& r, ArgReader& a) { return find_impl(r, a, false, false); }
StatusOr<Value> str_rfind(const Value& r, ArgReader& a) { return find_impl(r, a, true, false); }
StatusOr<Value> str_index(const Value& r, ArgReader& a) { return find_impl(r, a, false, true); }
StatusOr<Value> str_rindex(const Value& r, ArgReader& a) { return find_impl(r, a, true, true); }

StatusOr<Value> str_count(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(std::string needle, string_argument(args, "sub"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  if (needle.empty()) return Value(static_cast<int64_t>(code_point_count(text) + 1));
  int64_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++count;
  return Value(count);
}

StatusOr<Value> str_join(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(Value iterable, args.take_required("iterable"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(iterable));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return invalid_argument_error("sequence item {}: expected str instance, {} found", i, type_name(items[i]));
    }
    if (i > 0) out += receiver.as_string();
    out += items[i].as_string();
  }
  return Value(std::move(out));
}

template <bool (*Predicate)(char32_t)>
StatusOr<Value> str_all_of(const Value& receiver, ArgReader& args) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  if (text.empty()) return Value(false);
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 1;
    if (!Predicate(decode_utf8_at(text, offset, &length))) return Value(false);
    offset += length;
  }
  return Value(true);
}
bool is_alnum(char32_t c) { return python_is_alpha(c) || python_is_digit(c); }

// islower/isupper: at least one cased character and no character of the other case.
StatusOr<Value> case_check(const Value& receiver, ArgReader& args, bool want_lower) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  const bool has_cased = python_upper(text) != python_lower(text);
  return Value(has_cased && text == (want_lower ? python_lower(text) : python_upper(text)));
}
StatusOr<Value> str_islower(const Value& r, ArgReader& a) { return case_check(r, a, true); }
StatusOr<Value> str_isupper(const Value& r, ArgReader& a) { return case_check(r, a, false); }

StatusOr<Value> str_removeprefix(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(std::string prefix, string_argument(args, "prefix"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  if (text.compare(0, prefix.size(), prefix) == 0) return Value(text.substr(prefix.size()));
  return receiver;
}

StatusOr<Value> str_removesuffix(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(std::string suffix, string_argument(args, "suffix"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const std::string& text = receiver.as_string();
  if (!suffix.empty() && text.size() >= suffix.size() &&
      text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return Value(text.substr(0, text.size() - suffix.size()));
  }
  return receiver;
}

StatusOr<Value> dict_get(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(Value key, args.take_required("key"));
  PAGODA_ASSIGN_OR_RETURN(Value fallback, args.take_or("default", Value::none()));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (!hash_key(key)) return invalid_argument_error("unhashable type: '{}'", type_name(key));
  const Value* found = receiver.as_dict()->find(key);
  return found ? *found : fallback;
}

StatusOr<Value> dict_items(const Value& receiver, ArgReader& args) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  std::vector<Value> items;
  for (const auto& [key, value] : receiver.as_dict()->entries()) items.push_back(Value::tuple({key, value}));
  return Value::list(std::move(items));
}

StatusOr<Value> dict_keys(const Value& receiver, ArgReader& args) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  return Value::list(iterate(receiver).value());
}

StatusOr<Value> dict_values(const Value& receiver, ArgReader& args) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  std::vector<Value> values;
  for (const auto& entry : receiver.as_dict()->entries()) values.push_back(entry.second);
  return Value::list(std::move(values));
}

StatusOr<Value> dict_copy(const Value& receiver, ArgReader& args) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  auto copy = std::make_shared<Dict>(*receiver.as_dict());
  return Value(std::move(copy));
}

StatusOr<Value> list_count(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(Value needle, args.take_required("value"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const auto& items = receiver.as_list()->items;
  return Value(static_cast<int64_t>(std::count_if(items.begin(), items.end(), [&](const Value& v) { return values_equal(v, needle); })));
}

StatusOr<Value> list_index(const Value& receiver, ArgReader& args) {
  PAGODA_ASSIGN_OR_RETURN(Value needle, args.take_required("value"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  const auto& items = receiver.as_list()->items;
  for (size_t i = 0; i < items.size(); ++i) {
    if (values_equal(items[i], needle)) return Value(static_cast<int64_t>(i));
  }
  return invalid_argument_error("{} is not in list", to_python_repr(needle));
}

StatusOr<Value> list_copy(const Value& receiver, ArgReader& args) {
  PAGODA_RETURN_IF_ERROR(args.finish());
  return Value::list(receiver.as_list()->items);
}

struct MethodEntry {
  std::string_view name;
  Method method;
};

constexpr std::array kStringMethods = {
    MethodEntry{"startswith", str_startswith}, MethodEntry{"endswith", str_endswith},
    MethodEntry{"strip", str_strip},           MethodEntry{"lstrip", str_lstrip},
    MethodEntry{"rstrip", str_rstrip},         MethodEntry{"split", str_split},
    MethodEntry{"rsplit", str_rsplit},         MethodEntry{"splitlines", str_splitlines},
    MethodEntry{"upper", str_upper},           MethodEntry{"lower", str_lower},
    MethodEntry{"title", str_title},           MethodEntry{"capitalize", str_capitalize},
    MethodEntry{"replace", str_replace},       MethodEntry{"find", str_find},
    MethodEntry{"rfind", str_rfind},           MethodEntry{"index", str_index},
    MethodEntry{"rindex", str_rindex},         MethodEntry{"count", str_count},
    MethodEntry{"join", str_join},             MethodEntry{"isdigit", str_all_of<python_is_digit>},
    MethodEntry{"isalpha", str_all_of<python_is_alpha>}, MethodEntry{"isalnum", str_all_of<is_alnum>},
    MethodEntry{"isspace", str_all_of<is_python_whitespace>}, MethodEntry{"islower", str_islower},
    MethodEntry{"isupper", str_isupper},       MethodEntry{"removeprefix", str_removeprefix},
    MethodEntry{"removesuffix", str_removesuffix},
};
constexpr std::array kDictMethods = {
    MethodEntry{"get", dict_get}, MethodEntry{"items", dict_items}, MethodEntry{"keys", dict_keys},
    MethodEntry{"values", dict_values}, MethodEntry{"copy", dict_copy},
};
constexpr std::array kListMethods = {
    MethodEntry{"count", list_count}, MethodEntry{"index", list_index}, MethodEntry{"copy", list_copy},
};
constexpr std::string_view kUnsafeDictMethods[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kUnsafeListMethods[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};

template <typename Table>
std::optional<Value> bind_method(const Table& table, std::string_view type, const Value& receiver, std::string_view name) {
  for (const MethodEntry& entry : table) {
    if (entry.name != name) continue;
    const Method method = entry.method;
    std::string qualified = std::string(type) + "." + std::string(name);
    return Value::callable(qualified, [receiver, method, qualified](Interpreter&, CallArgs& call_args) {
      ArgReader args(qualified + "()", call_args);
      return method(receiver, args);
    });
  }
  return std::nullopt;
}

template <size_t N>
std::optional<Value> unsafe(const std::string_view (&names)[N], std::string_view type, std::string_view name) {
  for (std::string_view unsafe_name : names) {
    if (unsafe_name == name) {
      return Value::undefined("access to attribute '" + std::string(name) + "' of '" + std::string(type) +
                              "' object is unsafe (templates cannot modify values)");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> find_method(const Value& receiver, std::string_view name) {
  switch (receiver.kind()) {
    case Value::Kind::kString:
      return bind_method(kStringMethods, "str", receiver, name);
    case Value::Kind::kDict:
      if (receiver.as_dict()->is_namespace) return std::nullopt;
      if (auto method = bind_method(kDictMethods, "dict", receiver, name)) return method;
      return unsafe(kUnsafeDictMethods, "dict", name);
    case Value::Kind::kList:
      if (auto method = bind_method(kListMethods, receiver.as_list()->is_tuple ? "tuple" : "list", receiver, name)) {
        if (!receiver.as_list()->is_tuple || name != "copy") return method;
      }
      return receiver.as_list()->is_tuple ? std::nullopt : unsafe(kUnsafeListMethods, "list", name);
    default:
      return std::nullopt;
  }
}

}  // namespace pagoda::chat
