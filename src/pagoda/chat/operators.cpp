#include "pagoda/chat/operators.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {
namespace {

Status unsupported(std::string_view op, const Value& left, const Value& right) {
  return invalid_argument_error("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(left),
                                type_name(right));
}

Status too_large(size_t max_bytes) {
  return resource_exhausted_error("a template value would exceed the render limit of {} bytes", max_bytes);
}

StatusOr<Value> checked_int(bool overflowed, int64_t value) {
  if (overflowed) return out_of_range_error("integer overflow in a template expression (values beyond 64 bits)");
  return Value(value);
}

// Python's floor division and modulo for ints.
int64_t floor_divide(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_modulo(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

StatusOr<Value> repeat(const Value& sequence, int64_t times, size_t max_bytes) {
  const size_t count = times > 0 ? static_cast<size_t>(times) : 0;
  if (sequence.is_string()) {
    const std::string& text = sequence.as_string();
    if (count != 0 && text.size() > max_bytes / count) return too_large(max_bytes);
    std::string out;
    out.reserve(text.size() * count);
    if (count != 0) out = text;
    while (out.size() < text.size() * count) out.append(out, 0, std::min(out.size(), text.size() * count - out.size()));
    return Value(std::move(out));
  }
  const auto& items = sequence.as_list()->items;
  if (count != 0 && items.size() * 16 > max_bytes / count) return too_large(max_bytes);
  std::vector<Value> out;
  out.reserve(items.size() * count);
  for (size_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return sequence.as_list()->is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

StatusOr<Value> add(const Value& left, const Value& right, size_t max_bytes) {
  if (left.is_integral() && right.is_integral()) {
    int64_t sum = 0;
    const bool overflowed = __builtin_add_overflow(left.as_int(), right.as_int(), &sum);
    return checked_int(overflowed, sum);
  }
  if (left.is_number() && right.is_number()) return Value(left.as_double() + right.as_double());
  if (left.is_string() && right.is_string()) {
    const size_t bytes = left.as_string().size() + right.as_string().size();
    if (bytes > max_bytes) return too_large(max_bytes);
    std::string out;
    out.reserve(bytes);
    out += left.as_string();
    out += right.as_string();
    return Value(std::move(out));
  }
  if (left.is_list() && right.is_list() && left.as_list()->is_tuple == right.as_list()->is_tuple) {
    const auto& a = left.as_list()->items;
    const auto& b = right.as_list()->items;
    if ((a.size() + b.size()) * 16 > max_bytes) return too_large(max_bytes);
    std::vector<Value> out;
    out.reserve(a.size() + b.size());
    out.insert(out.end(), a.begin(), a.end());
    out.insert(out.end(), b.begin(), b.end());
    return left.as_list()->is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  if (left.is_string() || left.is_list()) {
    return invalid_argument_error("can only concatenate {} (not \"{}\") to {}", type_name(left), type_name(right),
                                  type_name(left));
  }
  return unsupported("+", left, right);
}

StatusOr<Value> arithmetic(std::string_view op, const Value& left, const Value& right, size_t max_bytes) {
  if (op == "+") return add(left, right, max_bytes);
  if (op == "*") {
    if (left.is_integral() && right.is_integral()) {
      int64_t product = 0;
      const bool overflowed = __builtin_mul_overflow(left.as_int(), right.as_int(), &product);
      return checked_int(overflowed, product);
    }
    if (left.is_number() && right.is_number()) return Value(left.as_double() * right.as_double());
    if ((left.is_string() || left.is_list()) && right.is_integral()) return repeat(left, right.as_int(), max_bytes);
    if ((right.is_string() || right.is_list()) && left.is_integral()) return repeat(right, left.as_int(), max_bytes);
    if (left.is_string() || left.is_list()) {
      return invalid_argument_error("can't multiply sequence by non-int of type '{}'", type_name(right));
    }
    return unsupported("*", left, right);
  }
  if (!left.is_number() || !right.is_number()) {
    if (op == "%" && left.is_string()) return python_percent_format(left.as_string(), right, max_bytes);
    return unsupported(op, left, right);
  }
  const bool integral = left.is_integral() && right.is_integral();
  if (op == "-") {
    if (integral) {
      int64_t difference = 0;
      const bool overflowed = __builtin_sub_overflow(left.as_int(), right.as_int(), &difference);
      return checked_int(overflowed, difference);
    }
    return Value(left.as_double() - right.as_double());
  }
  if (op == "/") {
    if (right.as_double() == 0.0) return invalid_argument_error("division by zero");
    return Value(left.as_double() / right.as_double());
  }
  if (op == "//" || op == "%") {
    if (right.as_double() == 0.0) {
      return invalid_argument_error("{}", integral ? "integer division or modulo by zero" : "float modulo");
    }
    if (integral) {
      if (left.as_int() == std::numeric_limits<int64_t>::min() && right.as_int() == -1) {
        return checked_int(true, 0);
      }
      return Value(op == "//" ? floor_divide(left.as_int(), right.as_int()) : floor_modulo(left.as_int(), right.as_int()));
    }
    const double a = left.as_double();
    const double b = right.as_double();
    if (op == "//") return Value(std::floor(a / b));
    double r = std::fmod(a, b);
    if (r != 0.0 && ((r < 0) != (b < 0))) r += b;
    return Value(r);
  }
  if (op == "**") {
    if (integral && right.as_int() >= 0) {
      int64_t result = 1;
      int64_t base = left.as_int();
      int64_t exponent = right.as_int();
      bool overflowed = false;
      while (exponent > 0 && !overflowed) {
        if (exponent & 1) overflowed |= __builtin_mul_overflow(result, base, &result);
        exponent >>= 1;
        if (exponent > 0) overflowed |= __builtin_mul_overflow(base, base, &base);
      }
      return checked_int(overflowed, result);
    }
    return Value(std::pow(left.as_double(), right.as_double()));
  }
  return internal_error("unknown operator '{}'", op);
}

}  // namespace

StatusOr<Value> apply_binary_operator(std::string_view op, const Value& left, const Value& right, size_t max_bytes) {
  if (op == "~") {  // Jinja's string concatenation: str() of both sides
    const std::string left_text = left.is_string() ? std::string() : to_python_str(left);
    const std::string right_text = right.is_string() ? std::string() : to_python_str(right);
    const std::string& a = left.is_string() ? left.as_string() : left_text;
    const std::string& b = right.is_string() ? right.as_string() : right_text;
    if (a.size() + b.size() > max_bytes) return too_large(max_bytes);
    std::string out;
    out.reserve(a.size() + b.size());
    out += a;
    out += b;
    return Value(std::move(out));
  }
  if (left.is_undefined()) return invalid_argument_error("{}", left.undefined_hint());
  if (right.is_undefined()) return invalid_argument_error("{}", right.undefined_hint());
  return arithmetic(op, left, right, max_bytes);
}

StatusOr<bool> contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return invalid_argument_error("'in <string>' requires string as left operand, not {}", type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& element : container.as_list()->items) {
        if (values_equal(element, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (container.as_dict()->is_namespace) break;
      if (!hash_key(item)) return invalid_argument_error("unhashable type: '{}'", type_name(item));
      return container.as_dict()->find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      break;
  }
  return invalid_argument_error("argument of type '{}' is not iterable", type_name(container));
}

StatusOr<bool> apply_comparison(std::string_view op, const Value& left, const Value& right) {
  if (op == "==") return values_equal(left, right);
  if (op == "!=") return !values_equal(left, right);
  if (op == "in") return contains(right, left);
  if (op == "not in") {
    PAGODA_ASSIGN_OR_RETURN(bool found, contains(right, left));
    return !found;
  }
  if (left.is_undefined()) return invalid_argument_error("{}", left.undefined_hint());
  if (right.is_undefined()) return invalid_argument_error("{}", right.undefined_hint());
  auto order = compare_values(left, right);
  if (!order.ok()) {
    return invalid_argument_error("'{}' not supported between instances of '{}' and '{}'", op, type_name(left),
                                  type_name(right));
  }
  if (op == "<") return *order < 0;
  if (op == "<=") return *order <= 0;
  if (op == ">") return *order > 0;
  if (op == ">=") return *order >= 0;
  return internal_error("unknown comparison '{}'", op);
}

std::optional<Value> index_sequence(const Value& sequence, int64_t index) {
  if (sequence.is_list()) {
    const auto& items = sequence.as_list()->items;
    const int64_t size = static_cast<int64_t>(items.size());
    if (index < 0) index += size;
    if (index < 0 || index >= size) return std::nullopt;
    return items[static_cast<size_t>(index)];
  }
  if (sequence.is_string()) {
    const std::string& text = sequence.as_string();
    const std::vector<size_t> offsets = code_point_offsets(text);
    const int64_t size = static_cast<int64_t>(offsets.size()) - 1;
    if (index < 0) index += size;
    if (index < 0 || index >= size) return std::nullopt;
    const size_t i = static_cast<size_t>(index);
    return Value(std::string_view(text).substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  return std::nullopt;
}

StatusOr<Value> slice_sequence(const Value& sequence, const Value& start_value, const Value& stop_value,
                               const Value& step_value) {
  const auto bound = [](const Value& v, const char* what) -> StatusOr<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!v.is_integral()) {
      return invalid_argument_error("slice indices must be integers or None, not {} (the {})", type_name(v), what);
    }
    return std::optional<int64_t>(v.as_int());
  };
  PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> start, bound(start_value, "start"));
  PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> stop, bound(stop_value, "stop"));
  PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> step_given, bound(step_value, "step"));
  const int64_t step = step_given.value_or(1);
  if (step == 0) return invalid_argument_error("slice step cannot be zero");

  std::vector<size_t> offsets;
  int64_t length = 0;
  if (sequence.is_list()) {
    length = static_cast<int64_t>(sequence.as_list()->items.size());
  } else if (sequence.is_string()) {
    offsets = code_point_offsets(sequence.as_string());
    length = static_cast<int64_t>(offsets.size()) - 1;
  } else if (sequence.is_undefined()) {
    return invalid_argument_error("{}", sequence.undefined_hint());
  } else {
    return invalid_argument_error("'{}' object is not subscriptable", type_name(sequence));
  }

  // CPython's PySlice_AdjustIndices
  const auto adjust = [&](std::optional<int64_t> given, int64_t fallback) {
    if (!given) return fallback;
    int64_t v = *given;
    if (v < 0) {
      v += length;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= length) {
      v = step < 0 ? length - 1 : length;
    }
    return v;
  };
  const int64_t first = adjust(start, step < 0 ? length - 1 : 0);
  const int64_t last = adjust(stop, step < 0 ? -1 : length);

  std::vector<int64_t> picked;
  for (int64_t i = first; step > 0 ? i < last : i > last; i += step) picked.push_back(i);

  if (sequence.is_string()) {
    const std::string& text = sequence.as_string();
    std::string out;
    if (step == 1 && !picked.empty()) {
      out.assign(text, offsets[static_cast<size_t>(picked.front())],
                 offsets[static_cast<size_t>(picked.back()) + 1] - offsets[static_cast<size_t>(picked.front())]);
    } else {
      for (int64_t i : picked) {
        const size_t k = static_cast<size_t>(i);
        out.append(text, offsets[k], offsets[k + 1] - offsets[k]);
      }
    }
    return Value(std::move(out));
  }
  const auto& items = sequence.as_list()->items;
  std::vector<Value> out;
  out.reserve(picked.size());
  for (int64_t i : picked) out.push_back(items[static_cast<size_t>(i)]);
  return sequence.as_list()->is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

StatusOr<Value> python_percent_format(const std::string& format, const Value& args, size_t max_bytes) {
  std::vector<Value> values;
  const bool is_tuple = args.is_list() && args.as_list()->is_tuple;
  if (is_tuple) {
    values = args.as_list()->items;
  } else {
    values.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) return invalid_argument_error("incomplete format");
    if (format[i] == '%') {
      out.push_back('%');
      continue;
    }
    if (format[i] == '(') return unimplemented_error("unsupported template construct: %(name)s formatting");
    std::string flags;
    while (i < format.size() && std::string_view("-0+ #").find(format[i]) != std::string_view::npos) flags += format[i++];
    // width and precision saturate instead of overflowing; a width past the size limit fails
    // before anything is padded
    const auto read_number = [&]() {
      size_t number = 0;
      for (; i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])); ++i) {
        number = std::min<size_t>(number * 10 + static_cast<size_t>(format[i] - '0'), size_t{1} << 40);
      }
      return number;
    };
    const size_t width = read_number();
    std::optional<size_t> precision;
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = read_number();
    }
    if (i >= format.size()) return invalid_argument_error("incomplete format");
    if (width > max_bytes) return too_large(max_bytes);
    const char conversion = format[i];
    if (next >= values.size()) return invalid_argument_error("not enough arguments for format string");
    const Value& value = values[next++];
    if (conversion == 's' || conversion == 'r') {
      std::string body = conversion == 's' ? to_python_str(value) : to_python_repr(value);
      // width and precision count code points, as in Python
      if (precision) {
        const std::vector<size_t> offsets = code_point_offsets(body);
        if (*precision + 1 < offsets.size()) body.resize(offsets[*precision]);
      }
      const size_t length = code_point_count(body);
      const std::string padding(width > length ? width - length : 0, ' ');
      out += flags.find('-') != std::string::npos ? body + padding : padding + body;
      if (out.size() > max_bytes) return too_large(max_bytes);
      continue;
    }
    // snprintf for numbers: C's printf flags, width and precision mean what Python's do here
    constexpr size_t kMaxNumberPrecision = 1024;
    if (precision && *precision > kMaxNumberPrecision) {
      return resource_exhausted_error("format precision {} is over the limit of {}", *precision, kMaxNumberPrecision);
    }
    std::string spec = "%" + flags + (width > 0 ? std::to_string(width) : "") +
                       (precision ? "." + std::to_string(*precision) : "");
    std::string formatted;
    const auto print = [&](const std::string& c_format, auto number) {
      const int length = std::snprintf(nullptr, 0, c_format.c_str(), number);
      if (length <= 0) return;
      formatted.resize(static_cast<size_t>(length));
      std::snprintf(formatted.data(), formatted.size() + 1, c_format.c_str(), number);
    };
    if (conversion == 'd' || conversion == 'i' || conversion == 'x' || conversion == 'X' || conversion == 'o' ||
        conversion == 'c') {
      if (!value.is_number()) {
        return invalid_argument_error("%{} format: a real number is required, not {}", std::string(1, conversion), type_name(value));
      }
      const long long number = value.is_float() ? static_cast<long long>(value.as_double()) : value.as_int();
      if (conversion == 'c') {
        append_utf8(out, static_cast<char32_t>(number));
        continue;
      }
      print(spec + "ll" + std::string(1, conversion == 'i' ? 'd' : conversion), number);
    } else if (conversion == 'f' || conversion == 'F' || conversion == 'e' || conversion == 'E') {
      if (!value.is_number()) {
        return invalid_argument_error("must be real number, not {}", type_name(value));
      }
      print(spec + std::string(1, conversion), value.as_double());
    } else {
      return unimplemented_error("unsupported template construct: '%{}' string formatting", std::string(1, conversion));
    }
    out += formatted;
    if (out.size() > max_bytes) return too_large(max_bytes);
  }
  // Python only complains about leftovers for tuples (a lone list or dict argument is allowed)
  if (next < values.size() && (is_tuple || !(args.is_list() || args.is_dict()))) {
    return invalid_argument_error("not all arguments converted during string formatting");
  }
  return Value(std::move(out));
}

size_t approximate_size(const Value& value) {
  if (value.is_string()) return value.as_string().size();
  if (value.is_list()) return value.as_list()->items.size() * 16;
  if (value.is_dict()) return value.as_dict()->size() * 32;
  return 16;
}

}  // namespace pagoda::chat
