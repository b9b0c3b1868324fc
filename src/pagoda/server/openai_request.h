#pragma once
// Parsing and strict validation of the bodies of POST /v1/completions and
// POST /v1/chat/completions: everything that can be checked without the model
// (JSON shape, field types, ranges, unsupported options). Anything wrong is an
// ApiError naming the field (`param`), never an exception. Checks that need the
// model (known model name, tokenization, context length) happen in the server.
//
// Unknown fields are ignored, as OpenAI clients send extras; known fields with
// unsupported values (suffix, functions, chat's echo, ...) are rejected
// rather than silently ignored (docs/API.md lists them). Chat messages, tools,
// tool_choice and chat_template_kwargs are read by chat_prompt.h; the
// structured-output fields (response_format, guided_json, guided_regex,
// guided_grammar, guided_choice) into OpenAiRequest::structured, at most one.
//
// Thread safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pagoda/engine/sampling_params.h"
#include "pagoda/runtime/kv_compression.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/chat_prompt.h"
#include "pagoda/server/structured_output.h"

namespace pagoda::server {

enum class Endpoint { kCompletions, kChatCompletions };

// One completions prompt as sent: its text, or its token ids (exactly one of the two).
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> tokens;
};

// The most prompts one batched completions request may list ("prompt": ["a", "b", ...] or
// [[1, 2], [3], ...]): each is an engine request, all admitted together or not at all.
inline constexpr size_t kMaxBatchedPrompts = 256;

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Completions: one prompt, or a batch; prompt p's choice j is the response's choice p x n + j.
  std::vector<PromptInput> prompts;
  // Chat: messages, tools, chat_template_kwargs.
  ChatPrompt chat;

  engine::SamplingParams sampling;
  // vLLM's bad_words as given; the server tokenizes them into sampling.bad_words_ids.
  std::vector<std::string> bad_words;
  // vLLM's truncate_prompt_tokens: keep the prompt's last k tokens (-1: the model's context length).
  std::optional<int64_t> truncate_prompt_tokens;
  bool max_tokens_given = false;  // else the server picks (16 / rest of context)
  // Completions' echo: each choice's text (and, with logprobs, its logprobs) starts with the prompt's.
  bool echo = false;
  // Chat's echo (vLLM): the reply's text starts with the final message's when that message is the assistant's
  // (with continue_final_message: the whole message).
  bool echo_final_message = false;
  // vLLM's add_special_tokens: the tokenizer's own special tokens (BOS) on the prompt text; default true for
  // completions, false for chat (whose template writes them).
  bool add_special_tokens = true;
  // vLLM's return_tokens_as_token_ids: logprobs name each token "token_id:<id>" (texts that are not whole
  // characters stay identifiable).
  bool return_tokens_as_token_ids = false;
  // vLLM's priority (lower runs first; the server's --scheduling-policy priority, else only 0). Absent: 0, or
  // the tenant's min_priority when that is larger (OpenAiServer::priority_for).
  std::optional<int32_t> priority;
  // vLLM's prompt_logprobs as asked (0..20 alternatives per prompt token). sampling.prompt_logprobs,
  // what the engine computes, is the larger of it and echo's logprobs.
  std::optional<int32_t> prompt_logprobs;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  StructuredOutputSpec structured;  // response_format / guided_*; kind kNone when absent
  // pagoda extension "kv_compression": {"policy", "budget", "sink_tokens",
  // "window", "span"} (docs/API.md): token eviction for this request; absent: the
  // server's --kv-compression settings.
  std::optional<runtime::KvCompressionConfig> kv_compression;
};

// The largest max_tokens accepted before the context check (anything larger is
// "absurd" and rejected early).
inline constexpr int64_t kMaxTokensLimit = 1 << 20;
// The deepest nesting of arrays/objects a body may have (the body itself is
// level 0): the chat template engine converts values recursively.
inline constexpr int kMaxJsonNesting = 64;

std::variant<OpenAiRequest, ApiError> parse_openai_request(std::string_view body, Endpoint endpoint);

// Body of POST /v1/cache/drop (pagoda extension): drop the cached blocks of a
// conversation (prompt text or ids, or chat messages) below keep_prefix_tokens,
// or of the whole tenant namespace with "all": true.
struct CacheDropRequest {
  PromptInput prompt;  // empty without "prompt"
  std::optional<ChatPrompt> chat;
  int64_t keep_prefix_tokens = 0;
  bool all = false;
  // As the generation request that made the conversation encoded it (default true for a prompt, false for chat).
  bool add_special_tokens = true;
};
std::variant<CacheDropRequest, ApiError> parse_cache_drop_request(std::string_view body);

// Bodies of vLLM's POST /tokenize and POST /detokenize (docs/API.md, "Tokenizing"):
//   /tokenize   {"model", "prompt": "text"} (encoded with the model's special tokens unless
//               "add_special_tokens": false), or {"model", "messages", "tools", "chat_template_kwargs",
//               "add_generation_prompt", "continue_final_message"} (the chat template's text, encoded
//               without special tokens unless "add_special_tokens": true, as /v1/chat/completions encodes it);
//               "return_token_strs": true adds each token's text;
//   /detokenize {"model", "tokens": [ids]}.
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;  // else `chat`
  ChatPrompt chat;
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body);

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body);

}  // namespace pagoda::server
