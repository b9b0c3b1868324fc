#include "pagoda/chat/chat_template.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {
namespace {

// JSON deeper than this is refused before conversion (the conversion recurses).
constexpr int kMaxJsonDepth = 64;

StatusOr<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return not_found_error("cannot open {}", path.string());
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return io_error("error reading {}", path.string());
  return text.str();
}

// A special token is a string or an AddedToken dict {"content": "<s>", ...}; null means unset.
StatusOr<std::optional<std::string>> read_token(const nlohmann::ordered_json& config, const char* key,
                                                std::string_view origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return std::optional<std::string>((*it)["content"].get<std::string>());
  }
  return invalid_argument_error("{}: field '{}' must be a string or an object with a string 'content'", origin, key);
}

template <typename Json>
int json_depth(const Json& json) {
  // iterative, so a hostile deeply nested document cannot overflow the stack here
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> stack{{&json, 1}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    if (depth > kMaxJsonDepth) return depth;
    if (node->is_structured()) {
      for (const auto& child : *node) stack.emplace_back(&child, depth + 1);
    }
  }
  return deepest;
}

template <typename Json>
Status validate_messages(const Json& messages) {
  if (!messages.is_array()) {
    return invalid_argument_error("messages must be a JSON array of message objects, got {}", messages.type_name());
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return invalid_argument_error("messages[{}] must be an object like {{\"role\": ..., \"content\": ...}}, got {}", i,
                                    messages[i].type_name());
    }
  }
  if (json_depth(messages) > kMaxJsonDepth) {
    return invalid_argument_error("messages nest deeper than {} levels", kMaxJsonDepth);
  }
  return ok_status();
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::build(std::map<std::string, std::string> sources, SpecialTokens tokens,
                                           std::string_view origin) {
  ChatTemplate chat;
  for (const auto& [name, source] : sources) {
    auto parsed = Template::parse(source);
    if (!parsed.ok()) {
      const std::string which = sources.size() > 1 ? fmt::format("chat template '{}'", name) : "chat template";
      return parsed.status().with_context(fmt::format("{}: {}", origin, which));
    }
    chat.templates_.emplace(name, std::move(parsed).value());
  }
  chat.sources_ = std::move(sources);
  chat.tokens_ = std::move(tokens);
  return chat;
}

StatusOr<ChatTemplate> ChatTemplate::from_string(std::string_view template_source, SpecialTokens tokens) {
  std::map<std::string, std::string> sources;
  sources.emplace("default", std::string(template_source));
  return build(std::move(sources), std::move(tokens), "template");
}

StatusOr<ChatTemplate> ChatTemplate::from_tokenizer_config(const nlohmann::ordered_json& config, std::string_view origin) {
  if (!config.is_object()) return invalid_argument_error("{}: expected a JSON object", origin);
  SpecialTokens tokens;
  PAGODA_ASSIGN_OR_RETURN(tokens.bos_token, read_token(config, "bos_token", origin));
  PAGODA_ASSIGN_OR_RETURN(tokens.eos_token, read_token(config, "eos_token", origin));
  PAGODA_ASSIGN_OR_RETURN(tokens.unk_token, read_token(config, "unk_token", origin));
  PAGODA_ASSIGN_OR_RETURN(tokens.pad_token, read_token(config, "pad_token", origin));

  std::map<std::string, std::string> sources;
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return not_found_error("{} has no chat_template (this model ships no chat template)", origin);
  }
  if (it->is_string()) {
    sources.emplace("default", it->get<std::string>());
  } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& entry = (*it)[i];
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
          !entry["template"].is_string()) {
        return invalid_argument_error("{}: chat_template[{}] must be an object with string 'name' and 'template'", origin, i);
      }
      sources.emplace(entry["name"].get<std::string>(), entry["template"].get<std::string>());
    }
    if (sources.count("default") == 0) {
      return invalid_argument_error("{}: chat_template lists no template named 'default'", origin);
    }
  } else {
    return invalid_argument_error("{}: chat_template must be a string or a list of named templates, got {}", origin,
                                  it->type_name());
  }
  return build(std::move(sources), std::move(tokens), origin);
}

StatusOr<ChatTemplate> ChatTemplate::load_from_model_dir(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  const bool has_config = std::filesystem::exists(config_path);
  if (has_config) {
    PAGODA_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
    config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return invalid_argument_error("{}: not valid JSON", config_path.string());
    if (!config.is_object()) return invalid_argument_error("{}: expected a JSON object", config_path.string());
  }
  // newer checkpoints keep the template beside the config, in chat_template.jinja
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  const auto template_field = config.find("chat_template");
  if ((template_field == config.end() || template_field->is_null()) && std::filesystem::exists(jinja_path)) {
    PAGODA_ASSIGN_OR_RETURN(std::string text, read_file(jinja_path));
    config["chat_template"] = text;
  }
  if (!has_config && !config.contains("chat_template")) {
    return not_found_error("{} has neither tokenizer_config.json nor chat_template.jinja", dir.string());
  }
  return from_tokenizer_config(config, config_path.string());
}

template <typename Json>
StatusOr<std::string> ChatTemplate::render_json(const Json& messages, bool add_generation_prompt,
                                                const Json& extra_variables) const {
  PAGODA_RETURN_IF_ERROR(validate_messages(messages));
  if (!extra_variables.is_null() && !extra_variables.is_object()) {
    return invalid_argument_error("extra template variables must be a JSON object, got {}", extra_variables.type_name());
  }
  if (!extra_variables.is_null() && json_depth(extra_variables) > kMaxJsonDepth) {
    return invalid_argument_error("extra template variables nest deeper than {} levels", kMaxJsonDepth);
  }

  RenderArena arena;  // the variables' containers too (a template may mutate them into cycles)
  Dict variables;
  variables.set("messages", value_from_json(messages));
  variables.set("tools", Value::none());
  variables.set("documents", Value::none());
  variables.set("add_generation_prompt", Value(add_generation_prompt));
  const auto set_token = [&](const char* name, const std::optional<std::string>& token) {
    if (token) variables.set(name, Value(*token));
  };
  set_token("bos_token", tokens_.bos_token);
  set_token("eos_token", tokens_.eos_token);
  set_token("unk_token", tokens_.unk_token);
  set_token("pad_token", tokens_.pad_token);
  bool has_tools = false;
  if (extra_variables.is_object()) {
    for (auto it = extra_variables.begin(); it != extra_variables.end(); ++it) {
      if (it.key() == "messages" || it.key() == "add_generation_prompt") {
        return invalid_argument_error("extra template variable '{}' would replace an argument of render()", it.key());
      }
      if (it.key() == "tools") has_tools = !it.value().is_null();
      variables.set(it.key(), value_from_json(it.value()));
    }
  }

  const std::string name = has_tools && templates_.count("tool_use") != 0 ? "tool_use" : default_name_;
  auto rendered = templates_.at(name).render(variables, options_);
  if (!rendered.ok()) {
    return rendered.status().with_context(templates_.size() > 1 ? "chat template '" + name + "'" : "chat template");
  }
  return rendered;
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra_variables) const {
  return render_json(messages, add_generation_prompt, extra_variables);
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                           const nlohmann::json& extra_variables) const {
  return render_json(messages, add_generation_prompt, extra_variables);
}

StatusOr<std::string> cut_after_final_message(std::string rendered, const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty())
    return invalid_argument_error("continue_final_message: there is no final message to continue");
  const nlohmann::ordered_json& final_message = messages.back();
  const nlohmann::ordered_json* text = nullptr;
  if (final_message.is_object() && final_message.contains("content")) {
    const auto& content = final_message["content"];
    if (content.is_string()) text = &content;
    if (content.is_array())  // the last part with a text, as transformers picks it
      for (auto part = content.rbegin(); part != content.rend() && text == nullptr; ++part)
        if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) text = &(*part)["text"];
  }
  if (text == nullptr)
    return invalid_argument_error("continue_final_message: the final message has no text content to continue");
  const std::string& whole = text->get_ref<const std::string&>();
  const std::string stripped = python_strip(whole, /*left=*/true, /*right=*/true);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    return invalid_argument_error(
        "continue_final_message: the chat template does not write the final message's text out (it changes or "
        "drops part of it), so there is no place to continue from");
  const size_t left_stripped = python_strip(whole, /*left=*/true, /*right=*/false).size();
  rendered.resize(rendered.compare(at, left_stripped, whole) == 0 ? at + left_stripped : at + stripped.size());
  return rendered;
}

}  // namespace pagoda::chat
