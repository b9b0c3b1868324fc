#pragma once
// Tool calls a model wrote in its chat template's own syntax, turned into
// OpenAI's message.tool_calls, so that clients running an agent loop get
// structured calls back. Recognized syntax (the template decides):
//   kHermes: Qwen2.5 / Qwen3 / Hermes templates, one block per call,
//     <tool_call>
//     {"name": "get_weather", "arguments": {"city": "Paris"}}
//     </tool_call>
// Anything else (or a template that writes no such block) is left as text.
// The parse is all or nothing, as vLLM's hermes parser: one malformed or
// unterminated block (a generation cut by max_tokens) leaves the whole text as
// content.
//
// Thread safety: pure functions.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::server {

enum class ToolCallSyntax { kNone, kHermes };

// The syntax a chat template writes assistant tool calls in (from its source).
ToolCallSyntax tool_call_syntax_of(std::string_view template_source);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object, as OpenAI sends it
};

struct ParsedToolCalls {
  std::string content;  // the text outside the blocks, trimmed (may be empty)
  std::vector<ParsedToolCall> calls;
};

// nullopt when the text holds no tool-call block, or a block is malformed.
std::optional<ParsedToolCalls> parse_tool_calls(std::string_view text, ToolCallSyntax syntax);

}  // namespace pagoda::server
