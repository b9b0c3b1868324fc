// Tool calls read back from a model's text in its template's syntax.

#include "pagoda/server/tool_call_parser.h"

#include <gtest/gtest.h>

namespace pagoda::server {
namespace {

TEST(ToolCallParserTest, HermesBlocksBecomeCalls) {
  auto parsed = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
      ToolCallSyntax::kHermes);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->content, "Let me check.");
  ASSERT_EQ(parsed->calls.size(), 2u);
  EXPECT_EQ(parsed->calls[0].name, "get_weather");
  EXPECT_EQ(parsed->calls[0].arguments, "{\"city\":\"Paris\",\"unit\":\"celsius\"}");  // key order kept
  EXPECT_EQ(parsed->calls[1].name, "get_time");
  EXPECT_EQ(parsed->calls[1].arguments, "{}");
}

TEST(ToolCallParserTest, ArgumentsAsTextOrMissing) {
  auto text_args = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
                                    ToolCallSyntax::kHermes);
  ASSERT_TRUE(text_args.has_value());
  EXPECT_EQ(text_args->calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(text_args->content, "");
  auto none = parse_tool_calls("<tool_call>{\"name\": \"f\"}</tool_call>", ToolCallSyntax::kHermes);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->calls[0].arguments, "{}");
}

TEST(ToolCallParserTest, AnythingMalformedStaysText) {
  for (const char* text : {
           "just an answer",
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}",  // cut by max_tokens
           "<tool_call>not json</tool_call>",
           "<tool_call>{\"arguments\": {}}</tool_call>",                 // no name
           "<tool_call>{\"name\": \"\"}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": \"oops\"}</tool_call>",
           "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": 3}</tool_call>",  // all or nothing
       }) {
    EXPECT_FALSE(parse_tool_calls(text, ToolCallSyntax::kHermes).has_value()) << text;
  }
  EXPECT_FALSE(parse_tool_calls("<tool_call>{\"name\": \"f\"}</tool_call>", ToolCallSyntax::kNone).has_value());
}

TEST(ToolCallParserTest, SyntaxComesFromTheTemplate) {
  EXPECT_EQ(tool_call_syntax_of("{{- '<tool_call>\\n{\"name\": \"' }}...{{- '}\\n</tool_call>' }}"),
            ToolCallSyntax::kHermes);
  EXPECT_EQ(tool_call_syntax_of("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolCallSyntax::kNone);
}

}  // namespace
}  // namespace pagoda::server
