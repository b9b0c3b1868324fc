// Python semantics of template values: repr of floats and strings, json.dumps as transformers'
// tojson calls it, equality/ordering/hashing across int/float/bool, and str methods on UTF-8
// (expected strings are what CPython 3.11 prints).

#include <cmath>
#include <limits>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/chat/operators.h"
#include "pagoda/chat/python_json.h"
#include "pagoda/chat/unicode_text.h"
#include "pagoda/chat/value.h"

namespace pagoda::chat {
namespace {

TEST(PythonFloatTest, FormatsLikeRepr) {
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456789.123, "123456789.123"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {-2.5, "-2.5"},
      {100.0, "100.0"},
      {1e22, "1e+22"},
      {0.1 + 0.2, "0.30000000000000004"},
      {12345678901234567.0, "1.2345678901234568e+16"},
      {-0.0, "-0.0"},
      {std::numeric_limits<double>::infinity(), "inf"},
      {std::nan(""), "nan"},
  };
  for (const auto& [value, expected] : cases) EXPECT_EQ(format_python_float(value), expected) << value;
}

TEST(PythonReprTest, EscapesLikePython) {
  const Value strings = Value::list({Value(std::string("\0", 1)), Value("\x7f"), Value("\xc2\xa0"), Value("\xe2\x80\xa8"),
                                     Value("\xf0\x9f\x98\x80"), Value("it's \"q\""), Value("\\")});
  EXPECT_EQ(to_python_repr(strings), "['\\x00', '\\x7f', '\\xa0', '\\u2028', '\xf0\x9f\x98\x80', 'it\\'s \"q\"', '\\\\']");
  EXPECT_EQ(to_python_repr(Value("it's")), "\"it's\"");
  EXPECT_EQ(to_python_str(Value::tuple({Value(1)})), "(1,)");
  EXPECT_EQ(to_python_str(Value::none()), "None");
  EXPECT_EQ(to_python_str(Value(true)), "True");
  EXPECT_EQ(to_python_str(Value()), "");
}

TEST(PythonJsonTest, DumpsLikeJsonDumps) {
  const Value value = value_from_json(nlohmann::ordered_json::parse(
      R"({"a": [1, {"b": null}], "c": "\u0000\u001f\u007f\u2028é😀\"\\"})"));
  EXPECT_EQ(python_json_dumps(value, {}).value(),
            "{\"a\": [1, {\"b\": null}], \"c\": \"\\u0000\\u001f\x7f\xe2\x80\xa8\xc3\xa9\xf0\x9f\x98\x80\\\"\\\\\"}");

  PythonJsonOptions ascii_tab;
  ascii_tab.ensure_ascii = true;
  ascii_tab.indent = "\t";
  const Value small = value_from_json(nlohmann::ordered_json::parse(R"({"a": [1, {"b": null}], "c": "é😀"})"));
  EXPECT_EQ(python_json_dumps(small, ascii_tab).value(),
            "{\n\t\"a\": [\n\t\t1,\n\t\t{\n\t\t\t\"b\": null\n\t\t}\n\t],\n\t\"c\": \"\\u00e9\\ud83d\\ude00\"\n}");

  Dict mixed_keys;  // 1 and True are one key in Python; keys become strings
  ASSERT_TRUE(mixed_keys.set_item(Value(1), Value("x")).ok());
  ASSERT_TRUE(mixed_keys.set_item(Value(true), Value("y")).ok());
  ASSERT_TRUE(mixed_keys.set_item(Value::none(), Value("z")).ok());
  ASSERT_TRUE(mixed_keys.set_item(Value(1.5), Value("w")).ok());
  EXPECT_EQ(python_json_dumps(Value(std::make_shared<Dict>(mixed_keys)), {}).value(),
            R"({"1": "y", "null": "z", "1.5": "w"})");

  EXPECT_EQ(python_json_dumps(Value(std::nan("")), {}).value(), "NaN");
  EXPECT_EQ(python_json_dumps(Value(-std::numeric_limits<double>::infinity()), {}).value(), "-Infinity");
  EXPECT_EQ(python_json_dumps(Value(2.0), {}).value(), "2.0");
  EXPECT_FALSE(python_json_dumps(Value(), {}).ok());
}

TEST(ValueSemanticsTest, EqualityOrderingAndHashingFollowPython) {
  EXPECT_TRUE(values_equal(Value(1), Value(1.0)));
  EXPECT_TRUE(values_equal(Value(true), Value(1)));
  EXPECT_FALSE(values_equal(Value("1"), Value(1)));
  EXPECT_FALSE(values_equal(Value::list({Value(1)}), Value::tuple({Value(1)})));
  EXPECT_TRUE(values_equal(Value(), Value()));
  EXPECT_FALSE(values_equal(Value(), Value::none()));
  EXPECT_EQ(compare_values(Value("a"), Value("b")).value(), -1);
  EXPECT_EQ(compare_values(Value("\xc3\xa9"), Value("z")).value(), 1);  // by code point
  EXPECT_EQ(compare_values(Value::list({Value(1), Value(2)}), Value::list({Value(1)})).value(), 1);
  EXPECT_FALSE(compare_values(Value(1), Value("a")).ok());
  EXPECT_EQ(hash_key(Value(1)), hash_key(Value(1.0)));
  EXPECT_EQ(hash_key(Value(1)), hash_key(Value(true)));
  EXPECT_FALSE(hash_key(Value::list({})).has_value());
  EXPECT_FALSE(is_truthy(Value(0.0)));
  EXPECT_FALSE(is_truthy(Value::dict()));
  EXPECT_TRUE(is_truthy(Value(" ")));
}

TEST(ValueSemanticsTest, JsonKeepsKeyOrderAndNumberKinds) {
  const Value value = value_from_json(nlohmann::ordered_json::parse(R"({"z": 1, "a": 2.0, "m": 18446744073709551615})"));
  ASSERT_TRUE(value.is_dict());
  const auto& entries = value.as_dict()->entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].first.as_string(), "z");
  EXPECT_TRUE(entries[0].second.is_int());
  EXPECT_TRUE(entries[1].second.is_float());
  EXPECT_TRUE(entries[2].second.is_float());  // beyond int64
}

TEST(SliceTest, MatchesPythonSlicing) {
  const Value xs = Value::list({Value(0), Value(1), Value(2), Value(3), Value(4)});
  const auto slice = [&](Value start, Value stop, Value step) {
    return to_python_str(slice_sequence(xs, start, stop, step).value());
  };
  EXPECT_EQ(slice(Value(), Value(), Value(-1)), "[4, 3, 2, 1, 0]");
  EXPECT_EQ(slice(Value(-2), Value(), Value()), "[3, 4]");
  EXPECT_EQ(slice(Value(10), Value(), Value(-2)), "[4, 2, 0]");
  EXPECT_EQ(slice(Value(1), Value(-1), Value(2)), "[1, 3]");
  EXPECT_EQ(slice(Value(-100), Value(100), Value()), "[0, 1, 2, 3, 4]");
  EXPECT_EQ(slice(Value(3), Value(1), Value()), "[]");
  EXPECT_EQ(to_python_str(slice_sequence(Value("h\xc3\xa9llo"), Value(1), Value(3), Value()).value()), "\xc3\xa9l");
}

TEST(UnicodeTextTest, StripSplitAndCaseLikePython) {
  EXPECT_EQ(python_strip("\xe3\x80\x80 x \xc2\xa0\n", true, true), "x");  // U+3000 and NBSP are whitespace
  EXPECT_EQ(python_strip_chars("<<a>>", "<>", true, false), "a>>");
  EXPECT_EQ(python_split_whitespace("  a b\t\nc  ", -1), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(python_split_whitespace("  a b c  ", 1), (std::vector<std::string>{"a", "b c"}));
  EXPECT_EQ(python_split("a,,b", ",", -1), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(python_rsplit("a,b,c", ",", 1), (std::vector<std::string>{"a,b", "c"}));
  EXPECT_EQ(python_title("hello1world they're"), "Hello1World They'Re");
  EXPECT_EQ(python_upper("h\xc3\xa9llo"), "H\xc3\x89LLO");
  EXPECT_EQ(code_point_count("h\xc3\xa9\xf0\x9f\x98\x80"), 3u);
  EXPECT_EQ(code_point_count("\xff\xfe"), 2u);  // invalid bytes count one each and survive
  EXPECT_EQ(python_strip("\xff ", true, true), "\xff");
}

}  // namespace
}  // namespace pagoda::chat
