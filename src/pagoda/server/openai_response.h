#pragma once
// JSON bodies of OpenAI responses: whole completions (non-streaming) and the
// chunks of a server-sent-event stream, for /v1/completions and
// /v1/chat/completions. Accumulates engine deltas per choice. With logprobs,
// the eos or stop token that ended a choice is its last logprobs entry (as in
// vLLM: lm-evaluation-harness reads the prompt's scores as all but the last).
//
// Thread safety: one builder per HTTP request.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/engine/request.h"
#include "pagoda/server/openai_request.h"
#include "pagoda/server/tool_call_parser.h"

namespace pagoda::server {

// Token id -> its text, for logprobs ("<id>" when the model has no tokenizer).
using TokenText = std::function<std::string(int32_t)>;

class ResponseBuilder {
 public:
  ResponseBuilder(Endpoint endpoint, std::string id, std::string model, int64_t created, int32_t n,
                  bool want_logprobs, TokenText token_text);

  // Chat: read tool calls written in `syntax` out of each choice's text into
  // message.tool_calls (finish_reason "tool_calls"); streamed, as
  // delta.tool_calls entries released as each call completes (ToolCallStream).
  // Off by default.
  void parse_tool_calls_as(ToolCallSyntax syntax) { tool_call_syntax_ = syntax; }

  // The "index" of this builder's first choice (0 by default): a batched completions request's
  // prompt p numbers its choices from p x n, as OpenAI and vLLM do. The deltas' indices stay 0..n-1.
  void number_choices_from(int32_t first_index) { first_index_ = first_index; }

  // vLLM's return_tokens_as_token_ids: the logprobs' tokens (and their alternatives) are named
  // "token_id:<id>", so that a token whose text is not whole characters stays identifiable. Offsets
  // (completions' text_offset) and chat's bytes stay those of the token's text.
  void name_tokens_by_id(bool on) { tokens_by_id_ = on; }

  // The prompt's part of the response, given before the first delta:
  //   echo (completions): each choice's text starts with `text`; with logprobs, its logprobs
  //     start with the prompt tokens' (the first one's logprob null: nothing predicts it), each
  //     with its echo_top_logprobs most likely alternatives;
  //   echo (chat, vLLM's): each choice's content starts with `text` (the final message's), nothing more;
  //   prompt_logprobs (vLLM): a list that starts with null, then per prompt token its logprob and
  //     rank and the prompt_logprobs most likely alternatives' ({"id": {"logprob", "rank",
  //     "decoded_token"}}); on each completion choice, or once beside a chat response's choices.
  // The scores come in the deltas (RequestOutput::prompt_logprobs).
  struct PromptReport {
    std::vector<int32_t> tokens;  // the prompt as the engine ran it
    std::string text;             // echo's text
    bool echo = false;
    int32_t echo_top_logprobs = 0;
    std::optional<int32_t> prompt_logprobs;
  };
  void report_prompt(PromptReport report) { prompt_ = std::move(report); }

  // Non-streaming: feed every delta, then build the final body.
  void accumulate(const engine::RequestOutput& delta);
  nlohmann::json final_response(const engine::Usage& usage) const;
  // Whether some accumulated choice ended with `reason`.
  bool any_choice_finished(engine::FinishReason reason) const;

  // Streaming: the chunk objects for one delta (one per changed choice; the
  // first chunk of a chat choice carries the assistant role).
  std::vector<nlohmann::json> chunks(const engine::RequestOutput& delta);
  // The final usage-only chunk of stream_options.include_usage.
  nlohmann::json usage_chunk(const engine::Usage& usage) const;

  static nlohmann::json usage_json(const engine::Usage& usage);
  // "data: <json>\n\n", never throwing on odd bytes.
  static std::string sse_event(const nlohmann::json& payload);
  static constexpr const char* kSseDone = "data: [DONE]\n\n";

 private:
  struct Choice {
    std::string text;
    std::vector<engine::SampledToken> logprobs;
    std::vector<int32_t> tokens;
    engine::FinishReason finish = engine::FinishReason::kNone;
    bool role_sent = false;
    std::optional<ToolCallStream> tool_stream;  // streamed chat with a tool-call syntax
    size_t tool_calls_sent = 0;
  };
  // with_prompt: echo's prompt tokens lead (completions only).
  nlohmann::json logprobs_json(const std::vector<engine::SampledToken>& tokens, size_t text_offset,
                               bool with_prompt = false) const;
  nlohmann::json prompt_logprobs_json() const;
  // How a logprobs entry names a token: its text, or "token_id:<id>" (name_tokens_by_id).
  std::string token_name(int32_t token, const std::string& text) const;
  nlohmann::json chunk_base() const;

  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  bool want_logprobs_;
  TokenText token_text_;
  std::vector<Choice> choices_;
  ToolCallSyntax tool_call_syntax_ = ToolCallSyntax::kNone;
  int32_t first_index_ = 0;
  bool tokens_by_id_ = false;
  PromptReport prompt_;
  std::vector<engine::SampledToken> prompt_scores_;  // prompt tokens 1, 2, .. as the deltas brought them
};

// OpenAI's finish_reason string (abort and error are reported as such).
const char* finish_reason_json(engine::FinishReason reason);

}  // namespace pagoda::server
