// The chat-template engine (chat/chat_template.h): any bytes, as a Jinja
// template (first byte even) or as tokenizer_config.json (odd), rendered over
// a fixed conversation. Rendering is sandboxed: bounded steps and output.

#include <nlohmann/json.hpp>

#include "fuzz_target.h"
#include "pagoda/chat/chat_template.h"

namespace pagoda::fuzz {

int fuzz_chat_template(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text = as_text(data + 1, size - 1);
  StatusOr<chat::ChatTemplate> chat = invalid_argument_error("unset");
  if (data[0] % 2 == 0) {
    chat = chat::ChatTemplate::from_string(text);
  } else {
    const auto config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return 0;
    chat = chat::ChatTemplate::from_tokenizer_config(config, "fuzz_config.json");
  }
  if (!chat.ok()) return 0;
  // Tighter limits than a server's: the same checks fire, at sizes a sanitized build gets
  // through well inside the fuzzer's per-input timeout (the defaults bound a render by the
  // same rules at larger sizes).
  chat::RenderLimits limits;
  limits.max_output_bytes = 1u << 20;
  limits.max_loop_iterations = 20000;
  limits.max_work_bytes = 16u << 20;
  chat->set_limits(limits);
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi {{ 1 }}"},
          {"role": "assistant", "content": "hello", "tool_calls": [{"type": "function",
           "function": {"name": "f", "arguments": {"x": [1, 2]}}}]}, {"role": "tool", "content": "3"}])");
  (void)chat->render(messages, true);
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_chat_template)
