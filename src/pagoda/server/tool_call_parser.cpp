#include "pagoda/server/tool_call_parser.h"

#include <nlohmann/json.hpp>

namespace pagoda::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::optional<ParsedToolCall> parse_hermes_block(std::string_view body) {
  // Ordered, so the arguments text keeps the model's key order.
  const auto call = nlohmann::ordered_json::parse(trim(body), nullptr, /*allow_exceptions=*/false);
  if (call.is_discarded() || !call.is_object()) return std::nullopt;
  auto name = call.find("name");
  if (name == call.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  ParsedToolCall out{name->get<std::string>(), "{}"};
  auto arguments = call.find("arguments");
  if (arguments == call.end() || arguments->is_null()) return out;
  if (arguments->is_object()) {
    out.arguments = arguments->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } else if (arguments->is_string()) {  // some models write the arguments as JSON text
    const auto parsed = nlohmann::ordered_json::parse(arguments->get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
    out.arguments = parsed.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } else {
    return std::nullopt;
  }
  return out;
}

}  // namespace

ToolCallSyntax tool_call_syntax_of(std::string_view template_source) {
  if (template_source.find(kOpen) != std::string_view::npos && template_source.find(kClose) != std::string_view::npos)
    return ToolCallSyntax::kHermes;
  return ToolCallSyntax::kNone;
}

std::optional<ParsedToolCalls> parse_tool_calls(std::string_view text, ToolCallSyntax syntax) {
  if (syntax != ToolCallSyntax::kHermes) return std::nullopt;
  ParsedToolCalls out;
  std::string content;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find(kOpen, pos);
    if (open == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    if (close == std::string_view::npos) return std::nullopt;  // unterminated: cut by max_tokens
    auto call = parse_hermes_block(text.substr(body, close - body));
    if (!call) return std::nullopt;
    content += text.substr(pos, open - pos);
    out.calls.push_back(std::move(*call));
    pos = close + kClose.size();
  }
  if (out.calls.empty()) return std::nullopt;
  out.content = std::string(trim(content));
  return out;
}

}  // namespace pagoda::server
