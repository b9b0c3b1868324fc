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

TEST(ToolCallParserTest, SyntaxOfTheTemplate) {
  EXPECT_EQ(tool_call_syntax_of("... <tool_call> ... </tool_call> ..."), ToolCallSyntax::kHermes);
  EXPECT_EQ(tool_call_syntax_of("{{ '[TOOL_CALLS]' }}"), ToolCallSyntax::kMistral);
  EXPECT_EQ(tool_call_syntax_of(R"(Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.)"),
            ToolCallSyntax::kLlama3Json);
  EXPECT_EQ(tool_call_syntax_of("{{ messages }}"), ToolCallSyntax::kNone);
}

TEST(ToolCallParserTest, Llama3JsonCalls) {
  auto one = parse_tool_calls(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", ToolCallSyntax::kLlama3Json);
  ASSERT_TRUE(one.has_value());
  ASSERT_EQ(one->calls.size(), 1u);
  EXPECT_EQ(one->calls[0].name, "get_weather");
  EXPECT_EQ(one->calls[0].arguments, "{\"city\":\"Paris\"}");
  auto tagged = parse_tool_calls("<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"x;y\"}}; {\"name\": \"b\", \"parameters\": {}}",
                                 ToolCallSyntax::kLlama3Json);
  ASSERT_TRUE(tagged.has_value());
  ASSERT_EQ(tagged->calls.size(), 2u);
  EXPECT_EQ(tagged->calls[0].arguments, "{\"s\":\"x;y\"}");  // a ';' inside a string does not split
  EXPECT_FALSE(parse_tool_calls("The weather is nice.", ToolCallSyntax::kLlama3Json).has_value());
  EXPECT_FALSE(parse_tool_calls("{\"city\": \"Paris\"}", ToolCallSyntax::kLlama3Json).has_value());
}

TEST(ToolCallParserTest, MistralToolCalls) {
  auto parsed = parse_tool_calls("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": \"{}\"}]",
                                 ToolCallSyntax::kMistral);
  ASSERT_TRUE(parsed.has_value());
  ASSERT_EQ(parsed->calls.size(), 2u);
  EXPECT_EQ(parsed->calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(parsed->calls[1].name, "g");
  EXPECT_FALSE(parse_tool_calls("[TOOL_CALLS] [{\"name\": \"f\"", ToolCallSyntax::kMistral).has_value());
  EXPECT_FALSE(parse_tool_calls("no calls here", ToolCallSyntax::kMistral).has_value());
}

// Feeds `text` in pieces of `step` bytes; returns the content and the calls in release order.
std::pair<std::string, std::vector<ParsedToolCall>> stream_through(ToolCallSyntax syntax, const std::string& text, size_t step) {
  ToolCallStream stream(syntax);
  std::string content;
  std::vector<ParsedToolCall> calls;
  for (size_t i = 0; i < text.size(); i += step) {
    auto d = stream.feed(std::string_view(text).substr(i, step));
    content += d.content;
    calls.insert(calls.end(), d.calls.begin(), d.calls.end());
  }
  auto d = stream.finish();
  content += d.content;
  calls.insert(calls.end(), d.calls.begin(), d.calls.end());
  return {content, calls};
}

TEST(ToolCallParserTest, StreamingReleasesCallsAndContentLikeTheWholeParse) {
  const std::string hermes = "Checking.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                             "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  const std::string llama = "{\"name\": \"f\", \"parameters\": {\"a\": 1}}";
  const std::string mistral = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]";
  for (size_t step : {1u, 3u, 7u, 1000u}) {
    for (auto [syntax, text] : {std::pair{ToolCallSyntax::kHermes, hermes}, std::pair{ToolCallSyntax::kLlama3Json, llama},
                                std::pair{ToolCallSyntax::kMistral, mistral}}) {
      auto [content, calls] = stream_through(syntax, text, step);
      auto whole = parse_tool_calls(text, syntax);
      ASSERT_TRUE(whole.has_value());
      EXPECT_EQ(content, whole->content) << text << " step " << step;
      ASSERT_EQ(calls.size(), whole->calls.size()) << text << " step " << step;
      for (size_t k = 0; k < calls.size(); ++k) {
        EXPECT_EQ(calls[k].name, whole->calls[k].name);
        EXPECT_EQ(calls[k].arguments, whole->calls[k].arguments);
      }
    }
    // Plain text streams through unchanged, also when it starts like a call but is not one.
    for (auto syntax : {ToolCallSyntax::kHermes, ToolCallSyntax::kLlama3Json, ToolCallSyntax::kMistral}) {
      auto [content, calls] = stream_through(syntax, "Hello <tool world {x}", step);
      EXPECT_EQ(content, "Hello <tool world {x}");
      EXPECT_TRUE(calls.empty());
    }
    auto [content, calls] = stream_through(ToolCallSyntax::kLlama3Json, "{not a call}", step);
    EXPECT_EQ(content, "{not a call}");
  }
}

}  // namespace
}  // namespace pagoda::server
