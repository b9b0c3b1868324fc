#pragma once
// What a chat request asks the model's chat template to render: the messages
// as the client sent them (order and key order kept, so templates that print
// tool schemas or arguments with tojson render byte-identically to
// transformers), the tools, and chat_template_kwargs (e.g. enable_thinking).
//
// Normalization, the same as vLLM's before apply_chat_template:
//   - content: a string, or OpenAI text parts {"type": "text", "text": ...}
//     joined without separator; null is allowed only on an assistant message
//     that carries tool_calls (it becomes "");
//   - role "developer" becomes "system" (templates know no developer role);
//   - tool_calls[].function.arguments given as a JSON string (OpenAI's wire
//     form) is parsed into the object HF templates expect;
//   - every other field (name, tool_call_id, reasoning_content, ...) passes
//     through unchanged after a type check.
// tool_choice: "auto" (default) shows the tools to the template; "none" hides
// them (the model is not told about tools, so it cannot call one); "required"
// and a named function show them too, and the server constrains the output to
// tool calls in the template's syntax whose arguments follow each tool's
// parameters schema (structured_output.h).
//
// Every problem is an ApiError naming the field, e.g. "messages[2].tool_calls[0].function.name".
//
// Thread safety: values and pure functions; a ChatRenderer may be called
// concurrently (ChatTemplate::render is).

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/chat/chat_template.h"
#include "pagoda/core/status.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/tool_call_parser.h"

namespace pagoda::server {

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct ChatPrompt {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // normalized message objects
  nlohmann::ordered_json tools;                                        // null, or the tools shown to the template
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;     // kNamed: the function
  bool parallel_tool_calls = true;  // kRequired: more than one call may be made
  // vLLM's add_generation_prompt (default true): end with the header that starts the assistant's reply.
  bool add_generation_prompt = true;
  // vLLM's continue_final_message (default false, with add_generation_prompt false): end right after the
  // final message's text, so that the model continues it (chat::cut_after_final_message).
  bool continue_final_message = false;

  // The extra variables of ChatTemplate::render: template_kwargs, plus tools
  // when there are any.
  nlohmann::ordered_json template_variables() const;
};

// The most messages / tools one request may carry.
inline constexpr size_t kMaxChatMessages = 4096;
inline constexpr size_t kMaxChatTools = 1024;

// Reads "messages" (required), "tools", "tool_choice", "parallel_tool_calls",
// "add_generation_prompt", "continue_final_message" and "chat_template_kwargs"
// of a request body (a JSON object).
std::optional<ApiError> read_chat_prompt(const nlohmann::ordered_json& body, ChatPrompt& out);

// Whether `value` has arrays/objects nested more than `levels` deep (a scalar
// is 0 levels, [1] is 1). Iterative: safe on any input. Request values reach
// the template engine, which converts them recursively, so they are bounded.
bool nests_deeper_than(const nlohmann::ordered_json& value, int levels);

// Prompt text of a chat prompt (ending with the assistant generation prompt, or
// within the final message it continues), and how the template writes tool
// calls (to read them back from the output).
struct ChatRenderer {
  std::function<StatusOr<std::string>(const ChatPrompt& prompt)> render;
  ToolCallSyntax tool_call_syntax = ToolCallSyntax::kNone;

  explicit operator bool() const { return static_cast<bool>(render); }
  StatusOr<std::string> operator()(const ChatPrompt& prompt) const { return render(prompt); }
};
ChatRenderer make_chat_renderer(chat::ChatTemplate chat_template);

}  // namespace pagoda::server
