#pragma once
// ChatTemplate: turns a list of chat messages into the model's prompt text exactly as
// transformers' tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=...) does, from the `chat_template` of a model's
// tokenizer_config.json (or its chat_template.jinja).
//
// What the template sees, as in transformers: messages, tools (None unless given), documents
// (None), add_generation_prompt, the special tokens bos_token / eos_token / unk_token /
// pad_token (those the config sets), then every extra variable (enable_thinking, tools,
// date_string, ...), which may override the rest.
//
//   PAGODA_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::load_from_model_dir(dir));
//   auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
//   PAGODA_ASSIGN_OR_RETURN(std::string prompt, chat.render(messages, /*add_generation_prompt=*/true));
//
// Parse the request with nlohmann::ordered_json: Python keeps JSON key order, and templates
// print tool schemas with tojson, so sorted keys (plain nlohmann::json) change the prompt.
//
// Errors: a missing file or template is kNotFound; bad JSON, bad messages or a template that
// fails (including the template's own raise_exception, whose message is kept and can be shown
// to the user) is kInvalidArgument; a construct pagoda does not implement is kUnimplemented;
// a runaway template is kResourceExhausted. Messages name the file/field and template line.
//
// Thread safety: immutable once built; render() may be called concurrently.

#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagoda/chat/template.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

// Special token strings from tokenizer_config.json (plain strings or {"content": ...}).
struct SpecialTokens {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> unk_token;
  std::optional<std::string> pad_token;
};

class ChatTemplate {
 public:
  // <dir>/tokenizer_config.json: its chat_template (a string, or a list of {name, template}
  // from which "default" is used, and "tool_use" when tools are given), falling back to
  // <dir>/chat_template.jinja; plus the special tokens.
  static StatusOr<ChatTemplate> load_from_model_dir(const std::filesystem::path& dir);
  // The same from an already-parsed tokenizer_config.json; origin names it in errors.
  static StatusOr<ChatTemplate> from_tokenizer_config(const nlohmann::ordered_json& config, std::string_view origin);
  // A bare template text.
  static StatusOr<ChatTemplate> from_string(std::string_view template_source, SpecialTokens tokens = {});

  // messages: a JSON array of message objects ({"role", "content", ...}); extra_variables: a
  // JSON object (or null) of more template variables.
  StatusOr<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra_variables = nullptr) const;
  // Convenience for plain nlohmann::json (object keys arrive sorted; see above).
  StatusOr<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                               const nlohmann::json& extra_variables = nullptr) const;

  const SpecialTokens& special_tokens() const { return tokens_; }
  // The text of the default template.
  const std::string& source() const { return sources_.at(default_name_); }

  // Pins what strftime_now() sees (tests); by default it is the local time of each render.
  void set_fixed_now(const std::tm& now) { options_.fixed_now = now; }
  void set_limits(const RenderLimits& limits) { options_.limits = limits; }

 private:
  ChatTemplate() = default;
  template <typename Json>
  StatusOr<std::string> render_json(const Json& messages, bool add_generation_prompt, const Json& extra_variables) const;
  static StatusOr<ChatTemplate> build(std::map<std::string, std::string> sources, SpecialTokens tokens,
                                      std::string_view origin);

  std::map<std::string, Template> templates_;  // by name; "default" unless the config names them
  std::map<std::string, std::string> sources_;
  std::string default_name_ = "default";
  SpecialTokens tokens_;
  RenderOptions options_;
};

// transformers' apply_chat_template(continue_final_message=True): `rendered`, a render of `messages` without
// the generation prompt, cut right after the final message's text, so that the model goes on with that
// message (an assistant reply it was given the start of) instead of starting a new one. The final message's
// text is its "content" string, or the "text" of the last content part that has one. Cut exactly as
// transformers cuts: after the last place the stripped text occurs, keeping its trailing whitespace only
// where the text has no leading whitespace and the template kept it. Errors (kInvalidArgument), as in
// transformers: no messages, a final message without text, or a template that does not write the text out.
StatusOr<std::string> cut_after_final_message(std::string rendered, const nlohmann::ordered_json& messages);

}  // namespace pagoda::chat
