#pragma once
// Tool calls a model wrote in its chat template's own syntax, turned into
// OpenAI's message.tool_calls, so that clients running an agent loop get
// structured calls back. Recognized syntaxes (the template decides):
//   kHermes: Qwen2.5 / Qwen3 / Hermes templates, one block per call,
//     <tool_call>
//     {"name": "get_weather", "arguments": {"city": "Paris"}}
//     </tool_call>
//   kLlama3Json: Llama 3.1 / 3.2 / 3.3 templates ("respond with JSON for a
//     function call"): the whole message is one JSON object
//     {"name": "get_weather", "parameters": {"city": "Paris"}}, optionally after
//     <|python_tag|>; several calls are separated by ";".
//   kMistral: Mistral v0.3-style templates, [TOOL_CALLS] followed by a JSON
//     array [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...].
// Anything else (or a template that writes no such syntax) is left as text.
// The parse is all or nothing, as vLLM's parsers: one malformed or
// unterminated call (a generation cut by max_tokens) leaves the whole text as
// content.
//
// ToolCallStream does the same over streamed text: content is passed on as it
// comes except what may still turn out to be tool-call syntax, and every call
// is released as soon as it is complete (Hermes: its closing tag; the JSON
// syntaxes: the end of the message).
//
// Thread safety: pure functions; a ToolCallStream belongs to one choice.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::server {

enum class ToolCallSyntax { kNone, kHermes, kLlama3Json, kMistral };

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

// nullopt when the text holds no tool call, or a call is malformed.
std::optional<ParsedToolCalls> parse_tool_calls(std::string_view text, ToolCallSyntax syntax);

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallSyntax syntax) : syntax_(syntax) {}

  struct Delta {
    std::string content;               // text to send as content now
    std::vector<ParsedToolCall> calls;  // calls completed now
  };
  // More text of the message.
  Delta feed(std::string_view text);
  // The message ended: calls still held, or the held text as content when it is not a call.
  Delta finish();
  // Whether any call was released.
  bool saw_calls() const { return calls_released_ > 0; }

 private:
  ToolCallSyntax syntax_;
  std::string held_;      // text not yet released
  bool in_json_ = false;  // Llama 3 / Mistral: the message is (so far) a tool call
  bool decided_ = false;  // Llama 3 / Mistral: whether the message is a call is known
  size_t calls_released_ = 0;
};

}  // namespace pagoda::server
