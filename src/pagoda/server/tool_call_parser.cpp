#include "pagoda/server/tool_call_parser.h"

#include <nlohmann/json.hpp>

namespace pagoda::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::optional<ParsedToolCall> parse_call_object(const nlohmann::ordered_json& call) {
  if (!call.is_object()) return std::nullopt;
  auto name = call.find("name");
  if (name == call.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  ParsedToolCall out{name->get<std::string>(), "{}"};
  auto arguments = call.find("arguments");
  if (arguments == call.end()) arguments = call.find("parameters");  // Llama 3's key
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

std::optional<ParsedToolCall> parse_hermes_block(std::string_view body) {
  // Ordered, so the arguments text keeps the model's key order.
  const auto call = nlohmann::ordered_json::parse(trim(body), nullptr, /*allow_exceptions=*/false);
  if (call.is_discarded()) return std::nullopt;
  return parse_call_object(call);
}

std::optional<ParsedToolCalls> parse_hermes(std::string_view text) {
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

std::optional<ParsedToolCalls> parse_llama3_json(std::string_view text) {
  std::string_view t = trim(text);
  if (t.starts_with(kPythonTag)) t = trim(t.substr(kPythonTag.size()));
  if (!t.starts_with("{")) return std::nullopt;
  ParsedToolCalls out;
  const auto whole = nlohmann::ordered_json::parse(t, nullptr, false);
  if (!whole.is_discarded()) {
    auto call = parse_call_object(whole);
    if (!call) return std::nullopt;
    out.calls.push_back(std::move(*call));
    return out;
  }
  // Several calls: {...}; {...}
  size_t pos = 0;
  while (pos < t.size()) {
    size_t end = t.find(';', pos);
    while (true) {
      const std::string_view piece = trim(t.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
      const auto value = nlohmann::ordered_json::parse(piece, nullptr, false);
      if (!value.is_discarded()) {
        auto call = parse_call_object(value);
        if (!call) return std::nullopt;
        out.calls.push_back(std::move(*call));
        break;
      }
      if (end == std::string_view::npos) return std::nullopt;
      end = t.find(';', end + 1);  // the ';' was inside a string: extend the piece
    }
    pos = end == std::string_view::npos ? t.size() : end + 1;
  }
  if (out.calls.empty()) return std::nullopt;
  return out;
}

std::optional<ParsedToolCalls> parse_mistral(std::string_view text) {
  const size_t marker = text.find(kMistralCalls);
  if (marker == std::string_view::npos) return std::nullopt;
  const auto value = nlohmann::ordered_json::parse(trim(text.substr(marker + kMistralCalls.size())), nullptr, false);
  if (value.is_discarded()) return std::nullopt;
  ParsedToolCalls out;
  for (const auto& item : value.is_array() ? value : nlohmann::ordered_json::array({value})) {
    auto call = parse_call_object(item);
    if (!call) return std::nullopt;
    out.calls.push_back(std::move(*call));
  }
  if (out.calls.empty()) return std::nullopt;
  out.content = std::string(trim(text.substr(0, marker)));
  return out;
}

bool is_space_only(std::string_view s) { return trim(s).empty(); }

}  // namespace

ToolCallSyntax tool_call_syntax_of(std::string_view template_source) {
  if (template_source.find(kOpen) != std::string_view::npos && template_source.find(kClose) != std::string_view::npos)
    return ToolCallSyntax::kHermes;
  if (template_source.find(kMistralCalls) != std::string_view::npos) return ToolCallSyntax::kMistral;
  if (template_source.find("\"parameters\": dictionary of argument name") != std::string_view::npos)
    return ToolCallSyntax::kLlama3Json;
  return ToolCallSyntax::kNone;
}

std::optional<ParsedToolCalls> parse_tool_calls(std::string_view text, ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kHermes: return parse_hermes(text);
    case ToolCallSyntax::kLlama3Json: return parse_llama3_json(text);
    case ToolCallSyntax::kMistral: return parse_mistral(text);
    case ToolCallSyntax::kNone: return std::nullopt;
  }
  return std::nullopt;
}

ToolCallStream::Delta ToolCallStream::feed(std::string_view text) {
  Delta out;
  held_ += text;
  if (syntax_ == ToolCallSyntax::kNone) {
    out.content = std::move(held_);
    held_.clear();
    return out;
  }
  if (syntax_ == ToolCallSyntax::kHermes) {
    while (true) {
      const size_t open = held_.find(kOpen);
      if (open == std::string::npos) {
        // Hold a tail that may still become "<tool_call>", and whitespace that may sit between calls.
        size_t keep = 0;
        for (size_t k = std::min(held_.size(), kOpen.size() - 1); k > 0; --k) {
          if (std::string_view(held_).substr(held_.size() - k) == kOpen.substr(0, k)) {
            keep = k;
            break;
          }
        }
        std::string release = held_.substr(0, held_.size() - keep);
        if (!is_space_only(release)) {
          out.content += release;
          held_.erase(0, held_.size() - keep);
        }
        return out;
      }
      const size_t close = held_.find(kClose, open + kOpen.size());
      if (close == std::string::npos) {
        if (!is_space_only(held_.substr(0, open))) out.content += held_.substr(0, open);
        held_.erase(0, open);
        return out;
      }
      const std::string_view prefix = std::string_view(held_).substr(0, open);
      if (!is_space_only(prefix)) out.content += prefix;
      if (auto call = parse_hermes_block(std::string_view(held_).substr(open + kOpen.size(), close - open - kOpen.size()))) {
        out.calls.push_back(std::move(*call));
        ++calls_released_;
      } else {
        out.content += held_.substr(open, close + kClose.size() - open);
      }
      held_.erase(0, close + kClose.size());
    }
  }
  // The JSON syntaxes: a message is a call when it starts like one.
  if (!decided_) {
    const std::string_view t = trim(held_);
    if (t.empty()) return out;
    const std::string_view marker = syntax_ == ToolCallSyntax::kMistral ? kMistralCalls : kPythonTag;
    const bool maybe_marker = marker.starts_with(t.substr(0, std::min(t.size(), marker.size())));
    if (maybe_marker && t.size() < marker.size()) return out;  // too short to tell
    in_json_ = maybe_marker || (syntax_ == ToolCallSyntax::kLlama3Json && t.starts_with("{"));
    decided_ = true;
  }
  if (!in_json_) {
    out.content = std::move(held_);
    held_.clear();
  }
  return out;
}

ToolCallStream::Delta ToolCallStream::finish() {
  Delta out;
  if (syntax_ != ToolCallSyntax::kHermes && in_json_) {
    if (auto parsed = parse_tool_calls(held_, syntax_)) {
      out.content = parsed->content;
      out.calls = std::move(parsed->calls);
      calls_released_ += out.calls.size();
      held_.clear();
      return out;
    }
  }
  if (!(calls_released_ > 0 && is_space_only(held_))) out.content = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace pagoda::server
