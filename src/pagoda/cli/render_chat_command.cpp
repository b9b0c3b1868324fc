// pagoda render-chat: prints the prompt a model's chat template makes of a conversation,
// exactly as transformers' apply_chat_template(messages, tokenize=False) would.
//
//   echo '[{"role": "user", "content": "Hi"}]' | pagoda render-chat --model DIR --add-generation-prompt
//   echo '[..., {"role": "assistant", "content": "Sure:"}]' | pagoda render-chat --model DIR --continue-final-message
//
// stdin: a JSON array of messages. stdout: the prompt, byte for byte (no newline added).

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/chat/chat_template.h"
#include "pagoda/cli/commands.h"

namespace pagoda::cli {
namespace {

struct RenderChatOptions {
  std::string model_dir;
  bool add_generation_prompt = false;
  bool continue_final_message = false;
  std::string variables_json;
};

void run_render_chat(const RenderChatOptions& options) {
  auto chat = chat::ChatTemplate::load_from_model_dir(options.model_dir);
  if (!chat.ok()) fail(chat.status().message());

  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  // ordered_json keeps the key order of the input, as Python's json does
  const auto messages = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded()) fail("stdin is not valid JSON (expected a JSON array of messages)");

  nlohmann::ordered_json variables = nullptr;
  if (!options.variables_json.empty()) {
    variables = nlohmann::ordered_json::parse(options.variables_json, nullptr, /*allow_exceptions=*/false);
    if (variables.is_discarded() || !variables.is_object()) {
      fail(fmt::format("--vars must be a JSON object, like '{{\"enable_thinking\": false}}', got: {}", options.variables_json));
    }
  }

  if (options.continue_final_message && options.add_generation_prompt)
    fail("--continue-final-message and --add-generation-prompt do not go together: the one continues the final "
         "message, the other starts a new assistant message after it");
  auto prompt = chat->render(messages, options.add_generation_prompt, variables);
  if (prompt.ok() && options.continue_final_message)
    prompt = chat::cut_after_final_message(std::move(*prompt), messages);
  if (!prompt.ok()) fail(prompt.status().message());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void add_render_chat_command(CLI::App& app) {
  auto options = std::make_shared<RenderChatOptions>();
  CLI::App* command = app.add_subcommand(
      "render-chat",
      "Render a conversation with the model's chat template (tokenizer_config.json), exactly as\n"
      "transformers' apply_chat_template(tokenize=False) does. Reads a JSON array of messages\n"
      "from stdin and prints the prompt with no newline added.");
  command->add_option("--model", options->model_dir, "Model directory holding tokenizer_config.json")->required();
  command->add_flag("--add-generation-prompt", options->add_generation_prompt,
                    "End with the header that starts the assistant's reply");
  command->add_flag("--continue-final-message", options->continue_final_message,
                    "End right after the final message's text (no end-of-turn), so that the model continues it: "
                    "an assistant reply given its start (transformers' continue_final_message)");
  command->add_option("--vars", options->variables_json,
                      "Extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}' or "
                      "'{\"tools\": [...]}'");
  command->callback([options] { run_render_chat(*options); });
}

}  // namespace pagoda::cli
