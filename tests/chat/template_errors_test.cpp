// What the template engine does with bad and hostile templates: every failure is a Status
// that names the construct and the line (never a crash), and loops, recursion, nesting and
// memory are bounded so a template cannot hang or exhaust the server.

#include <chrono>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/chat/template.h"

namespace pagoda::chat {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

Status parse_error(const std::string& source) {
  auto parsed = Template::parse(source);
  return parsed.ok() ? Status() : parsed.status();
}

StatusOr<std::string> render(const std::string& source, const char* variables_json = "{}",
                             const RenderOptions& options = {}) {
  PAGODA_ASSIGN_OR_RETURN(Template parsed, Template::parse(source));
  const Value variables = value_from_json(nlohmann::ordered_json::parse(variables_json));
  return parsed.render(*variables.as_dict(), options);
}

Status render_error(const std::string& source, const char* variables_json = "{}", const RenderOptions& options = {}) {
  auto rendered = render(source, variables_json, options);
  return rendered.ok() ? Status() : rendered.status();
}

TEST(TemplateErrorsTest, UnsupportedConstructsAreNamedWithTheirLine) {
  const Status include = parse_error("a\nb\n{% include 'other.jinja' %}");
  EXPECT_EQ(include.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(include.message(), AllOf(HasSubstr("line 3"), HasSubstr("{% include %}")));

  const Status recursive = parse_error("{% for x in xs recursive %}{{ loop(x) }}{% endfor %}");
  EXPECT_EQ(recursive.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(recursive.message(), HasSubstr("recursive for loops"));

  EXPECT_EQ(parse_error("{% extends 'base' %}").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(parse_error("{% call m() %}x{% endcall %}").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(parse_error("{{ f(*args) }}").code(), StatusCode::kUnimplemented);
}

TEST(TemplateErrorsTest, UnknownTagsFiltersAndTestsAreSyntaxErrors) {
  EXPECT_THAT(parse_error("{% frobnicate %}").message(), AllOf(HasSubstr("line 1"), HasSubstr("unknown tag")));
  EXPECT_THAT(parse_error("x\n{{ a | frobnicate }}").message(), AllOf(HasSubstr("line 2"), HasSubstr("unknown filter 'frobnicate'")));
  EXPECT_THAT(parse_error("{{ a is frobnicated }}").message(), HasSubstr("unknown test 'is frobnicated'"));
  EXPECT_EQ(parse_error("{% do x %}").code(), StatusCode::kUnimplemented);  // transformers does not enable `do` either
}

TEST(TemplateErrorsTest, MalformedTemplatesSayWhatWasExpected) {
  EXPECT_THAT(parse_error("{% if x %}never closed").message(), HasSubstr("expected '{% endif %}'"));
  EXPECT_THAT(parse_error("{% for x in y %}{% endif %}").message(), HasSubstr("unexpected '{% endif %}'"));
  EXPECT_THAT(parse_error("text {% endfor %}").message(), HasSubstr("unexpected '{% endfor %}'"));
  EXPECT_THAT(parse_error("{{ 'unterminated }}").message(), HasSubstr("unterminated string"));
  EXPECT_THAT(parse_error("{# no end").message(), HasSubstr("missing end of comment"));
  EXPECT_THAT(parse_error("{{ x ").message(), HasSubstr("never closed"));
  EXPECT_THAT(parse_error("{{ (1 + 2 }}").message(), HasSubstr("unexpected '}', expected ')'"));
  EXPECT_THAT(parse_error("{{ 1 + }}").message(), HasSubstr("expected an expression"));
  EXPECT_THAT(parse_error("{{ x $ y }}").message(), HasSubstr("unexpected character '$'"));
  EXPECT_THAT(parse_error("{% break %}").message(), HasSubstr("outside of a for loop"));
  EXPECT_THAT(parse_error("{% raw %}no end").message(), HasSubstr("endraw"));
}

TEST(TemplateErrorsTest, RuntimeErrorsNameTheValueAndLine) {
  EXPECT_THAT(render_error("ok\n{{ missing.attr }}").message(), AllOf(HasSubstr("line 2"), HasSubstr("'missing' is undefined")));
  EXPECT_THAT(render_error("{{ m.nope.deeper }}", R"({"m": {}})").message(), HasSubstr("'dict object' has no attribute 'nope'"));
  EXPECT_THAT(render_error("{{ 'a' + 1 }}").message(), HasSubstr("can only concatenate str (not \"int\") to str"));
  EXPECT_THAT(render_error("{{ 1 + none }}").message(), HasSubstr("unsupported operand type(s) for +: 'int' and 'NoneType'"));
  EXPECT_THAT(render_error("{{ nothing() }}").message(), HasSubstr("'nothing' is undefined"));
  EXPECT_THAT(render_error("{{ 'abc'() }}").message(), HasSubstr("'str' object is not callable"));
  EXPECT_THAT(render_error("{{ missing | tojson }}").message(), HasSubstr("Object of type Undefined is not JSON serializable"));
  EXPECT_THAT(render_error("{{ 1 / 0 }}").message(), HasSubstr("division by zero"));
  EXPECT_THAT(render_error("{{ 1 < 'a' }}").message(), HasSubstr("'<' not supported between instances of 'int' and 'str'"));
  EXPECT_THAT(render_error("{{ {[1]: 2} }}").message(), HasSubstr("unhashable type: 'list'"));
  EXPECT_THAT(render_error("{{ 9223372036854775807 + 1 }}").message(), HasSubstr("integer overflow"));
  EXPECT_THAT(render_error("{{ xs.append(1) }}", R"({"xs": []})").message(), HasSubstr("unsafe"));
  EXPECT_THAT(render_error("{% set a, b = [1] %}").message(), HasSubstr("not enough values to unpack"));
  EXPECT_THAT(render_error("{% set x = 1 %}{% set x.y = 2 %}").message(), HasSubstr("not a namespace()"));
  EXPECT_THAT(render_error("{{ 'a'.split('') }}").message(), HasSubstr("empty separator"));
  EXPECT_THAT(render_error("{{ 'a'.startswith() }}").message(), HasSubstr("missing required argument 'prefix'"));
  EXPECT_THAT(render_error("{{ [1] | join(x=1) }}").message(), HasSubstr("unexpected keyword argument 'x'"));
  EXPECT_THAT(render_error("{{ raise_exception('custom message') }}").message(), HasSubstr("custom message"));
  EXPECT_THAT(render_error("{{ xs[::0] }}", R"({"xs": [1]})").message(), HasSubstr("slice step cannot be zero"));
}

TEST(TemplateErrorsTest, LenientWhereJinjaIsLenient) {
  // Undefined prints as nothing, iterates as empty, is falsy and has length 0; missing list
  // items and dict keys are Undefined, not errors.
  EXPECT_EQ(render("[{{ a }}]{% for x in a %}x{% endfor %}{{ a | length }}{{ a is defined }}").value(), "[]0False");
  EXPECT_EQ(render("[{{ xs[9] }}][{{ d.k }}][{{ d['k'] }}]", R"({"xs": [], "d": {}})").value(), "[][][]");
  EXPECT_EQ(render("{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}").value(), "[1|]");
}

// ---- hostile templates ----

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(TemplateLimitsTest, RunawayLoopsStopAtTheIterationLimit) {
  const auto start = std::chrono::steady_clock::now();
  const Status status =
      render_error("{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_THAT(status.message(), HasSubstr("loop iterations"));
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(TemplateLimitsTest, RangeIsCappedLikeJinjasSandbox) {
  EXPECT_EQ(render_error("{{ range(100001) | length }}").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(render("{{ range(100000) | length }}").value(), "100000");
}

TEST(TemplateLimitsTest, RunawayRecursionStopsAtTheCallDepth) {
  const Status status = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_THAT(status.message(), HasSubstr("macro 'f'"));
}

TEST(TemplateLimitsTest, ExponentialStringsStopAtTheSizeLimit) {
  const auto start = std::chrono::steady_clock::now();
  RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  const Status doubling = render_error(
      "{% set ns = namespace(s='xy') %}{% for i in range(200) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
      "{}", options);
  EXPECT_EQ(doubling.code(), StatusCode::kResourceExhausted) << doubling.to_string();
  EXPECT_EQ(render_error("{% set ns = namespace(s='xy') %}{% for i in range(200) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                         "{}", options).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(render_error("{{ 'x' * 10000000000 }}").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(render_error("{{ [1, 2] * 10000000000 }}").code(), StatusCode::kResourceExhausted);
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(TemplateLimitsTest, OutputIsCapped) {
  RenderOptions options;
  options.limits.max_output_bytes = 1000;
  EXPECT_EQ(render_error("{% for i in range(2000) %}x{% endfor %}", "{}", options).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(render("{% for i in range(999) %}x{% endfor %}", "{}", options).ok());
}

TEST(TemplateLimitsTest, DeepNestingIsAnErrorNotAStackOverflow) {
  const std::string parens = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_THAT(parse_error(parens).message(), HasSubstr("nests deeper"));
  std::string lists = "{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}";
  EXPECT_THAT(parse_error(lists).message(), HasSubstr("nests deeper"));
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_THAT(parse_error(ifs).message(), HasSubstr("nests deeper"));
  std::string nots = "{{ " ;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_THAT(parse_error(nots + "x }}").message(), HasSubstr("nests deeper"));
  std::string minus = "{{ " + std::string(100000, '-') + "1 }}";
  EXPECT_THAT(parse_error(minus).message(), HasSubstr("nests deeper"));
}

TEST(TemplateLimitsTest, SelfContainingNamespacePrintsWithoutRecursingForever) {
  auto text = render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_THAT(*text, HasSubstr("..."));
  EXPECT_FALSE(render("{% set ns = namespace() %}{% set ns.l = [ns] %}{{ ns.l | tojson }}").ok());
}

// Limits a hostile template reaches through work, not through any one value: each case ran
// for minutes, or overflowed the stack, before the work meter, macro step counting and value
// nesting depth. Each must fail with kResourceExhausted, fast.
RenderOptions small_limits() {
  RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_work_bytes = 16 << 20;
  return options;
}

void expect_exhausted_quickly(const std::string& source, const RenderOptions& options = small_limits()) {
  const auto start = std::chrono::steady_clock::now();
  const Status status = render_error(source, "{}", options);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << source << "\n" << status.to_string();
  EXPECT_LT(seconds_since(start), 5.0) << source;
}

TEST(TemplateLimitsTest, RebuildingALargeValueInALoopStopsAtTheWorkLimit) {
  expect_exhausted_quickly("{% for i in range(99999) %}{% set x = 'a' * 1000000 %}{% endfor %}");
  expect_exhausted_quickly("{% set s = 'a' * 1000000 %}{% for i in range(99999) %}{% if s == s ~ '' %}{% endif %}{% endfor %}");
  expect_exhausted_quickly("{% set s = 'a' * 1000000 %}{% for i in range(99999) %}{{ s.count('b') }}{% endfor %}");
  expect_exhausted_quickly("{% macro m() %}" + std::string(60000, 'x') + "{% endmacro %}"
                           "{% for i in range(99999) %}{% set y = m() %}{% endfor %}");
  // the message names the limit
  const Status status = render_error("{% for i in range(99999) %}{% set x = 'a' * 1000000 %}{% endfor %}", "{}",
                                     small_limits());
  EXPECT_THAT(status.message(), HasSubstr("bytes of work"));
}

TEST(TemplateLimitsTest, ContainersHeldUntilTheRenderEndsAreCharged) {
  // empty containers hold no bytes, but each lives until the render ends
  expect_exhausted_quickly("{% for i in range(99999) %}{% set x = [[], [], [], {}, {}, {}] %}{% endfor %}");
  EXPECT_TRUE(render("{% for i in range(999) %}{% set x = [[], [], [], {}, {}, {}] %}{% endfor %}", "{}",
                     small_limits()).ok());
}

TEST(TemplateLimitsTest, SharedItemsAreChargedForEveryVisit) {
  // [s] * n holds one string n times: comparing, sorting, hashing or printing it visits s n times
  const std::string shared = "{% set s = 'ab' * 500000 %}{% set xs = [s] * 60000 %}{% set ys = [s ~ ''] * 60000 %}";
  expect_exhausted_quickly(shared + "{{ xs == ys }}");
  expect_exhausted_quickly(shared + "{{ (xs + ys) | sort | length }}");
  expect_exhausted_quickly(shared + "{{ (xs + ys) | unique | list | length }}");
  expect_exhausted_quickly(shared + "{{ xs | string | length }}");
  expect_exhausted_quickly(shared + "{{ xs | tojson | length }}");
  expect_exhausted_quickly(shared + "{{ xs | map('upper') | list | length }}");
  expect_exhausted_quickly(shared + "{{ ('ab' * 499999) ~ 'ac' in xs }}");
  expect_exhausted_quickly("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(16) %}{% set ns.a = [ns.a] * 64 %}"
                           "{% set ns.b = [ns.b] * 64 %}{% endfor %}{{ ns.a == ns.b }}");
  // identical values compare without a scan, as Python's identity shortcut does
  EXPECT_TRUE(render(shared + "{{ xs == xs }}{{ s == s }}", "{}", small_limits()).ok());
}

TEST(TemplateLimitsTest, IteratingALongStringIsChargedPerCharacter) {
  expect_exhausted_quickly("{% for c in 'a' * 1000000 %}{% endfor %}");
  expect_exhausted_quickly("{{ ('a' * 1000000) | list | length }}");
  expect_exhausted_quickly("{{ ('a ' * 500000).split() | length }}");
  expect_exhausted_quickly("{{ ('a\n' * 500000).splitlines() | length }}");
}

TEST(TemplateLimitsTest, MacroCallsCountAsLoopSteps) {
  // twice per level: 2^40 calls within the depth limit
  const Status status = render_error(
      "{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_THAT(status.message(), HasSubstr("loop iterations"));
}

TEST(TemplateLimitsTest, ValuesNestNoDeeperThanTheLimit) {
  const Status status = render_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(99999) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x == ns.x }}");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_THAT(status.message(), HasSubstr("nest deeper than"));
  EXPECT_TRUE(render("{% set ns = namespace(x=[]) %}{% for i in range(200) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x == ns.x[:] }}").ok());
  // a chain of namespaces needs no nesting check: dropping it mid-render destroys nothing yet
  auto chain = render("{% set ns = namespace(head=none) %}{% for i in range(99999) %}"
                      "{% set ns.head = namespace(prev=ns.head) %}{% endfor %}{% set ns.head = none %}done");
  ASSERT_TRUE(chain.ok()) << chain.status().to_string();
  EXPECT_EQ(*chain, "done");
}

TEST(TemplateLimitsTest, FormatWidthsArePaddedOnlyWithinTheSizeLimit) {
  expect_exhausted_quickly("{{ '%999999999d' % 1 }}");
  expect_exhausted_quickly("{{ '%.999999999f' % 1.5 }}");
  expect_exhausted_quickly("{{ '%99999999999999999999999s' % 'x' }}");
  auto wide = render("{{ '%600d|%-600s|%.3f' % (7, 'x', 2.0) }}");
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  EXPECT_EQ(*wide, std::string(599, ' ') + "7|x" + std::string(599, ' ') + "|2.000");
}

TEST(TemplateLimitsTest, UniqueIsLinearInDistinctHashableItems) {
  auto text = render("{{ ((range(1000) | list) * 100) | unique | list | length }}");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "1000");
  auto mixed = render("{{ [1, 1.0, true, 'a', 'A', (1,), (1,)] | unique | list }}");
  ASSERT_TRUE(mixed.ok()) << mixed.status().to_string();
  EXPECT_EQ(*mixed, "[1, 'a', (1,)]");
}

TEST(TemplateLimitsTest, BinaryGarbageNeverCrashes) {
  // a deterministic stream of template-ish fragments: every outcome must be a Status
  const char* pieces[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "if", "for", "x", " in ", "'", "\"", "(",
                          ")", "[", "]", "{", "}", "|", "~", "endif", "endfor", "set", "=", ".", ",", "\n", "\xff",
                          "loop", "raw", "endraw", "macro", "not", "is", "defined", "1", "::", "-1"};
  uint64_t seed = 12345;
  for (int round = 0; round < 3000; ++round) {
    std::string source;
    const int length = 1 + static_cast<int>(seed % 24);
    for (int i = 0; i < length; ++i) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      source += pieces[(seed >> 33) % (sizeof(pieces) / sizeof(pieces[0]))];
    }
    auto parsed = Template::parse(source);
    if (parsed.ok()) {
      Dict variables;
      variables.set("x", Value::list({Value(1), Value("a")}));
      (void)parsed->render(variables);
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace pagoda::chat
