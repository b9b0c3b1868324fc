#include "pagoda/server/chat_prompt.h"

#include <memory>
#include <utility>
#include <vector>

namespace pagoda::server {
namespace {

using Json = nlohmann::ordered_json;

// Set by the server itself; a client may not override them through chat_template_kwargs.
// Tool-call arguments arrive as JSON text, past the request body's nesting check.
constexpr int kMaxArgumentsNesting = 48;

constexpr const char* kReservedTemplateVariables[] = {"messages", "tools", "documents", "add_generation_prompt"};
// The tokenizer's special tokens as templates see them (transformers' names):
// a request that renamed one could forge BOS/EOS text the template writes.
constexpr const char* kSpecialTokenVariables[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                                  "sep_token", "cls_token", "mask_token", "additional_special_tokens"};

std::optional<ApiError> check_optional_string(const Json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null() || it->is_string()) return std::nullopt;
  return invalid_request(fmt::format("{}.{} must be a string", where, key), where + "." + key);
}

// content -> a string: text parts joined.
std::optional<ApiError> normalize_content(Json& message, const std::string& where, bool may_be_null) {
  const std::string param = where + ".content";
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    if (!may_be_null) return invalid_request(param + " is required", param, "missing_required_parameter");
    message["content"] = "";
    return std::nullopt;
  }
  if (it->is_string()) return std::nullopt;
  if (!it->is_array())
    return invalid_request(param + " must be a string or an array of text parts", param);
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const Json& part = (*it)[j];
    const std::string part_param = fmt::format("{}[{}]", param, j);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return invalid_request(part_param + " must be an object with a string \"type\"", part_param);
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      return invalid_request(fmt::format("{}.type '{}' is not supported: only text parts", part_param, type),
                             part_param + ".type", "unsupported");
    if (!part.contains("text") || !part["text"].is_string())
      return invalid_request(part_param + ".text must be a string", part_param + ".text");
    text += part["text"].get<std::string>();
  }
  *it = std::move(text);
  return std::nullopt;
}

std::optional<ApiError> normalize_tool_calls(Json& tool_calls, const std::string& where) {
  if (!tool_calls.is_array()) return invalid_request(where + " must be an array", where);
  for (size_t j = 0; j < tool_calls.size(); ++j) {
    Json& call = tool_calls[j];
    const std::string param = fmt::format("{}[{}]", where, j);
    if (!call.is_object()) return invalid_request(param + " must be an object", param);
    if (auto e = check_optional_string(call, "id", param)) return e;
    if (auto type = call.find("type"); type != call.end() && !type->is_null() && *type != "function")
      return invalid_request(param + ".type must be \"function\"", param + ".type");
    auto function = call.find("function");
    if (function == call.end() || !function->is_object())
      return invalid_request(param + ".function must be an object", param + ".function");
    auto name = function->find("name");
    if (name == function->end() || !name->is_string())
      return invalid_request(param + ".function.name must be a string", param + ".function.name");
    const std::string args_param = param + ".function.arguments";
    auto arguments = function->find("arguments");
    if (arguments == function->end() || arguments->is_null()) {
      (*function)["arguments"] = Json::object();
    } else if (arguments->is_string()) {
      // OpenAI sends the arguments as JSON text; HF templates expect the object (and print it with tojson).
      Json parsed = Json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !parsed.is_object())
        return invalid_request(args_param + " must be a JSON object or a string holding one", args_param);
      if (nests_deeper_than(parsed, kMaxArgumentsNesting))
        return invalid_request(fmt::format("{} nests deeper than {} levels", args_param, kMaxArgumentsNesting),
                               args_param);
      *arguments = std::move(parsed);
    } else if (!arguments->is_object()) {
      return invalid_request(args_param + " must be a JSON object or a string holding one", args_param);
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_messages(const Json& body, Json& out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null())
    return invalid_request("'messages' is required", "messages", "missing_required_parameter");
  if (!it->is_array()) return invalid_request("'messages' must be an array", "messages");
  if (it->empty()) return invalid_request("'messages' must not be empty", "messages");
  if (it->size() > kMaxChatMessages)
    return invalid_request(fmt::format("'messages' holds more than {} messages", kMaxChatMessages), "messages");
  out = Json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string param = fmt::format("messages[{}]", i);
    if (!(*it)[i].is_object()) return invalid_request(param + " must be an object", param);
    Json message = (*it)[i];
    auto role = message.find("role");
    if (role == message.end() || !role->is_string())
      return invalid_request(param + ".role must be a string", param + ".role");
    std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      return invalid_request(fmt::format("{}.role must be one of system, developer, user, assistant, tool; got '{}'",
                                         param, r),
                             param + ".role");
    if (r == "developer") *role = r = "system";
    for (const char* key : {"name", "tool_call_id", "reasoning_content"})
      if (auto e = check_optional_string(message, key, param)) return e;
    bool has_tool_calls = false;
    if (auto calls = message.find("tool_calls"); calls != message.end() && !calls->is_null()) {
      if (r != "assistant")
        return invalid_request(param + ".tool_calls is only allowed on assistant messages", param + ".tool_calls");
      if (auto e = normalize_tool_calls(*calls, param + ".tool_calls")) return e;
      has_tool_calls = !calls->empty();
    }
    if (auto e = normalize_content(message, param, has_tool_calls)) return e;
    out.push_back(std::move(message));
  }
  return std::nullopt;
}

std::optional<ApiError> read_tools(const Json& body, Json& out) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return invalid_request("'tools' must be an array", "tools");
  if (it->size() > kMaxChatTools)
    return invalid_request(fmt::format("'tools' holds more than {} tools", kMaxChatTools), "tools");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& tool = (*it)[i];
    const std::string param = fmt::format("tools[{}]", i);
    if (!tool.is_object()) return invalid_request(param + " must be an object", param);
    if (tool.value("type", Json()) != "function")
      return invalid_request(param + ".type must be \"function\"", param + ".type");
    auto function = tool.find("function");
    if (function == tool.end() || !function->is_object())
      return invalid_request(param + ".function must be an object", param + ".function");
    auto name = function->find("name");
    if (name == function->end() || !name->is_string() || name->get<std::string>().empty())
      return invalid_request(param + ".function.name must be a non-empty string", param + ".function.name");
    if (auto e = check_optional_string(*function, "description", param + ".function")) return e;
    if (auto params = function->find("parameters"); params != function->end() && !params->is_null() &&
                                                    !params->is_object())
      return invalid_request(param + ".function.parameters must be an object (a JSON schema)",
                             param + ".function.parameters");
  }
  if (!it->empty()) out = *it;
  return std::nullopt;
}

// tool_choice: "auto" / "none" / "required" / {"type": "function", "function": {"name": ...}}.
std::optional<ApiError> read_tool_choice(const Json& body, const Json& tools, ChatPrompt& out) {
  out.tool_choice = ToolChoice::kAuto;
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const bool has_tools = tools.is_array() && !tools.empty();
  if (it->is_string()) {
    const std::string choice = it->get<std::string>();
    if (choice == "auto") return std::nullopt;
    if (choice == "none") {
      out.tool_choice = ToolChoice::kNone;
      return std::nullopt;
    }
    if (choice == "required") {
      if (!has_tools) return invalid_request("tool_choice \"required\" needs 'tools'", "tool_choice");
      out.tool_choice = ToolChoice::kRequired;
      return std::nullopt;
    }
    return invalid_request(
        fmt::format("'tool_choice' must be \"auto\", \"none\", \"required\" or a named function, got \"{}\"", choice),
        "tool_choice");
  }
  if (it->is_object()) {
    auto type = it->find("type");
    auto function = it->find("function");
    if (type == it->end() || *type != "function" || function == it->end() || !function->is_object() ||
        !function->contains("name") || !(*function)["name"].is_string())
      return invalid_request("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                             "tool_choice");
    const std::string name = (*function)["name"].get<std::string>();
    bool found = false;
    for (const auto& tool : has_tools ? tools : Json::array())
      found = found || tool["function"].value("name", std::string()) == name;
    if (!found) return invalid_request(fmt::format("tool_choice names '{}', which is not in 'tools'", name), "tool_choice");
    out.tool_choice = ToolChoice::kNamed;
    out.tool_choice_name = name;
    return std::nullopt;
  }
  return invalid_request("'tool_choice' must be a string or an object", "tool_choice");
}

std::optional<ApiError> read_template_kwargs(const Json& body, Json& out) {
  auto it = body.find("chat_template_kwargs");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return invalid_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  for (const char* reserved : kReservedTemplateVariables)
    if (it->contains(reserved))
      return invalid_request(fmt::format("chat_template_kwargs.{} is set by the server, not the request", reserved),
                             fmt::format("chat_template_kwargs.{}", reserved));
  for (const char* special : kSpecialTokenVariables)
    if (it->contains(special))
      return invalid_request(
          fmt::format("chat_template_kwargs.{} would rename one of the model's special tokens; it comes from the "
                      "tokenizer, not the request",
                      special),
          fmt::format("chat_template_kwargs.{}", special));
  out = *it;
  return std::nullopt;
}

}  // namespace

bool nests_deeper_than(const Json& value, int levels) {
  std::vector<std::pair<const Json*, int>> stack{{&value, 0}};
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    if (depth + 1 > levels) return true;
    for (const Json& child : *node) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

Json ChatPrompt::template_variables() const {
  Json variables = template_kwargs.is_object() ? template_kwargs : Json::object();
  if (tools.is_array() && !tools.empty()) variables["tools"] = tools;
  return variables;
}

std::optional<ApiError> read_chat_prompt(const Json& body, ChatPrompt& out) {
  if (auto e = read_messages(body, out.messages)) return e;
  Json tools;
  if (auto e = read_tools(body, tools)) return e;
  if (auto e = read_tool_choice(body, tools, out)) return e;
  for (auto [name, flag] : {std::pair{"parallel_tool_calls", &out.parallel_tool_calls},
                             std::pair{"add_generation_prompt", &out.add_generation_prompt},
                             std::pair{"continue_final_message", &out.continue_final_message}}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_boolean()) return invalid_request(fmt::format("'{}' must be a boolean", name), name);
    *flag = it->get<bool>();
  }
  if (out.continue_final_message && out.add_generation_prompt)
    return invalid_request(
        "'continue_final_message' and 'add_generation_prompt' cannot both be true: send \"add_generation_prompt\": "
        "false to continue the final message",
        "continue_final_message");
  out.tools = out.tool_choice != ToolChoice::kNone ? std::move(tools) : Json();
  return read_template_kwargs(body, out.template_kwargs);
}

ChatRenderer make_chat_renderer(chat::ChatTemplate chat_template) {
  auto shared = std::make_shared<const chat::ChatTemplate>(std::move(chat_template));
  ChatRenderer renderer;
  renderer.tool_call_syntax = tool_call_syntax_of(shared->source());
  renderer.render = [shared](const ChatPrompt& prompt) -> StatusOr<std::string> {
    PAGODA_ASSIGN_OR_RETURN(std::string text,
                            shared->render(prompt.messages, prompt.add_generation_prompt, prompt.template_variables()));
    if (!prompt.continue_final_message) return text;
    return chat::cut_after_final_message(std::move(text), prompt.messages);
  };
  return renderer;
}

}  // namespace pagoda::server
