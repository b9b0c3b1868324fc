#include "pagoda/chat/is_tests.h"

#include <array>

#include "pagoda/chat/call_args.h"
#include "pagoda/chat/filters.h"
#include "pagoda/chat/operators.h"
#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {
namespace {

// Tests without arguments: a predicate on the subject.
template <bool (*Predicate)(const Value&)>
StatusOr<bool> unary_test(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("test", call_args).finish());
  return Predicate(subject);
}

bool is_defined(const Value& v) { return !v.is_undefined(); }
bool is_undefined(const Value& v) { return v.is_undefined(); }
bool is_none(const Value& v) { return v.is_none(); }
bool is_true(const Value& v) { return v.is_bool() && v.as_bool(); }
bool is_false(const Value& v) { return v.is_bool() && !v.as_bool(); }
bool is_boolean(const Value& v) { return v.is_bool(); }
bool is_integer(const Value& v) { return v.is_int(); }  // bool is not an integer here
bool is_float(const Value& v) { return v.is_float(); }
bool is_number(const Value& v) { return v.is_number(); }
bool is_string(const Value& v) { return v.is_string(); }
bool is_mapping(const Value& v) { return v.is_dict() && !v.as_dict()->is_namespace; }
bool is_iterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.as_dict()->is_namespace);
}
bool is_sequence(const Value& v) { return is_iterable(v); }
bool is_callable(const Value& v) { return v.is_callable(); }
bool is_escaped(const Value&) { return false; }
bool is_lower(const Value& v) {
  const std::string text = to_python_str(v);
  return python_upper(text) != python_lower(text) && text == python_lower(text);
}
bool is_upper(const Value& v) {
  const std::string text = to_python_str(v);
  return python_upper(text) != python_lower(text) && text == python_upper(text);
}

// Jinja: value % 2 == 1 (odd) / value % 2 == 0 (even), so 4.0 is even and 1.5 is neither.
StatusOr<bool> odd_even(const Value& subject, bool odd) {
  if (!subject.is_number()) return invalid_argument_error("not all arguments converted during string formatting");
  PAGODA_ASSIGN_OR_RETURN(Value remainder, apply_binary_operator("%", subject, Value(2), 64));
  return values_equal(remainder, Value(odd ? 1 : 0));
}
StatusOr<bool> test_odd(Interpreter&, const Value& s, CallArgs& a) {
  PAGODA_RETURN_IF_ERROR(ArgReader("odd", a).finish());
  return odd_even(s, true);
}
StatusOr<bool> test_even(Interpreter&, const Value& s, CallArgs& a) {
  PAGODA_RETURN_IF_ERROR(ArgReader("even", a).finish());
  return odd_even(s, false);
}

// Comparison tests: x is eq(y), x is lt 3, ...
template <const char* Op>
StatusOr<bool> compare_test(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("test", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value other, args.take_required("other"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  return apply_comparison(Op, subject, other);
}
constexpr char kEq[] = "==";
constexpr char kNe[] = "!=";
constexpr char kLt[] = "<";
constexpr char kLe[] = "<=";
constexpr char kGt[] = ">";
constexpr char kGe[] = ">=";

StatusOr<bool> test_in(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("in", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value container, args.take_required("seq"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  return contains(container, subject);
}

StatusOr<bool> test_sameas(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("sameas", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value other, args.take_required("other"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (subject.kind() != other.kind()) return false;
  switch (subject.kind()) {
    case Value::Kind::kList: return subject.as_list() == other.as_list();
    case Value::Kind::kDict: return subject.as_dict() == other.as_dict();
    case Value::Kind::kString: return &subject.as_string() == &other.as_string() || subject.as_string() == other.as_string();
    default: return values_equal(subject, other);  // None, bools and small ints are singletons in Python
  }
}

StatusOr<bool> test_divisibleby(Interpreter&, const Value& subject, CallArgs& call_args) {
  ArgReader args("divisibleby", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value divisor, args.take_required("num"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  PAGODA_ASSIGN_OR_RETURN(Value remainder, apply_binary_operator("%", subject, divisor, 1 << 20));
  return values_equal(remainder, Value(0));
}

StatusOr<bool> test_filter(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("filter", call_args).finish());
  return subject.is_string() && find_filter(subject.as_string()) != nullptr;
}

StatusOr<bool> test_test(Interpreter&, const Value& subject, CallArgs& call_args) {
  PAGODA_RETURN_IF_ERROR(ArgReader("test", call_args).finish());
  return subject.is_string() && find_test(subject.as_string()) != nullptr;
}

struct TestEntry {
  std::string_view name;
  TestFunction function;
};

constexpr std::array kTests = {
    TestEntry{"defined", unary_test<is_defined>},
    TestEntry{"undefined", unary_test<is_undefined>},
    TestEntry{"none", unary_test<is_none>},
    TestEntry{"true", unary_test<is_true>},
    TestEntry{"false", unary_test<is_false>},
    TestEntry{"boolean", unary_test<is_boolean>},
    TestEntry{"integer", unary_test<is_integer>},
    TestEntry{"float", unary_test<is_float>},
    TestEntry{"number", unary_test<is_number>},
    TestEntry{"string", unary_test<is_string>},
    TestEntry{"mapping", unary_test<is_mapping>},
    TestEntry{"iterable", unary_test<is_iterable>},
    TestEntry{"sequence", unary_test<is_sequence>},
    TestEntry{"callable", unary_test<is_callable>},
    TestEntry{"escaped", unary_test<is_escaped>},
    TestEntry{"lower", unary_test<is_lower>},
    TestEntry{"upper", unary_test<is_upper>},
    TestEntry{"odd", test_odd},
    TestEntry{"even", test_even},
    TestEntry{"divisibleby", test_divisibleby},
    TestEntry{"sameas", test_sameas},
    TestEntry{"in", test_in},
    TestEntry{"eq", compare_test<kEq>},
    TestEntry{"equalto", compare_test<kEq>},
    TestEntry{"==", compare_test<kEq>},
    TestEntry{"ne", compare_test<kNe>},
    TestEntry{"!=", compare_test<kNe>},
    TestEntry{"lt", compare_test<kLt>},
    TestEntry{"lessthan", compare_test<kLt>},
    TestEntry{"<", compare_test<kLt>},
    TestEntry{"le", compare_test<kLe>},
    TestEntry{"<=", compare_test<kLe>},
    TestEntry{"gt", compare_test<kGt>},
    TestEntry{"greaterthan", compare_test<kGt>},
    TestEntry{">", compare_test<kGt>},
    TestEntry{"ge", compare_test<kGe>},
    TestEntry{">=", compare_test<kGe>},
    TestEntry{"filter", test_filter},
    TestEntry{"test", test_test},
};

}  // namespace

TestFunction find_test(std::string_view name) {
  for (const TestEntry& entry : kTests) {
    if (entry.name == name) return entry.function;
  }
  return nullptr;
}

}  // namespace pagoda::chat
