#pragma once
// The OpenAI-compatible HTTP server in front of an Engine, on the event-driven
// HTTP front (http_front.h).
//
// Routes: POST /v1/completions, POST /v1/chat/completions (both with
// "stream": true as server-sent events ending in "data: [DONE]"),
// GET /v1/models, POST /v1/cache/drop (pagoda: drop a conversation's or the
// tenant's cached blocks), POST /tokenize and /detokenize (vLLM's: the served
// model's tokenizer and chat template, nothing cached), GET /v1/usage (pagoda: the caller's own tenant
// figures), GET /health, GET /metrics (Prometheus; with api keys, only for a
// key marked "admin"), and for a KV-aware router GET /v1/kv/events,
// /v1/kv/namespace, /v1/load (kv_routes.h). No endpoint honours Range: every
// answer is whole.
//
// Request path: JSON media type (415) -> auth (api key -> tenant; with a
// salting key, X-Pagoda-User -> the user's own cache namespace, user_salt.h) -> parse and validate (400 + OpenAI error object) -> model name
// -> chat template -> tokens -> cost cap -> tenant quotas (requests in flight,
// tokens per minute, KV blocks: 429 + Retry-After, or 400 when the request
// alone is over a whole quota) -> engine submit (400 too long, 429 +
// Retry-After queue full: all decided before any byte of the response) ->
// response.
//
// A batched completions prompt (a list of prompts) is one engine request per
// prompt, prepared, capped and admitted together (prepare_prompt), answered as
// one response (generation_reply.h).
//
// Non-streamed responses hold their status until the generation has finished:
// 200 with the completion, or the OpenAI error object with 500 (the model
// failed), 503 (the request can never fit the KV cache, or the server shut
// down under it). Streamed responses send 200 with the first byte; a later
// failure is an error event ({"error": {...}}) followed by [DONE]. No thread
// waits on a generation: the engine's pushes wake the connection
// (generation_reply.h).
//
// Chat with tools: the messages, tools and chat_template_kwargs reach the chat
// template whole (chat_prompt.h). Tool calls the model writes in its
// template's syntax (tool_call_parser.h: Hermes blocks, Llama 3 JSON, Mistral
// [TOOL_CALLS]) come back as message.tool_calls with finish_reason
// "tool_calls", or streamed as delta.tool_calls.
//
// Structured outputs (structured_output.h): response_format json_object /
// json_schema, tool_choice "required" or a named function, and the guided_*
// extensions constrain decoding; docs/API.md lists every supported field.
//
// A client that disconnects is noticed from its socket by the front and its
// request aborted, which frees its KV blocks at the next engine step.
//
// Thread safety: handlers run on the front's worker threads; the engine API
// they call is thread-safe. stop() may be called from any thread (signal
// handler thread).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/engine/engine.h"
#include "pagoda/server/api_keys.h"
#include "pagoda/server/first_token_floor.h"
#include "pagoda/server/http_front.h"
#include "pagoda/server/openai_request.h"
#include "pagoda/server/openai_response.h"
#include "pagoda/server/prometheus_metrics.h"
#include "pagoda/server/request_limits.h"
#include "pagoda/server/tenant_quotas.h"
#include "pagoda/server/tenant_usage.h"
#include "pagoda/server/structured_output.h"

namespace pagoda::server {

class KvEventFeed;

// What the server needs from a tokenizer and chat template; any may be empty
// (fixture models without tokenizer accept token-id prompts only).
struct TextCodec {
  // Text -> token ids (with the model's BOS etc. when add_special_tokens).
  std::function<std::vector<int32_t>(std::string_view text, bool add_special_tokens)> encode;
  // Chat prompt -> prompt text, ending with the assistant generation prompt
  // (make_chat_renderer(ChatTemplate) in chat_prompt.h).
  ChatRenderer render_chat;
  // Token -> text, for logprobs.
  TokenText token_text;
  // Token ids -> text, decoded as a whole (pieces that join without spaces, characters split across
  // tokens): echo's prompt when it came as ids or was truncated. Empty: token_text joined.
  std::function<std::string(std::span<const int32_t>)> decode;
  // The vocabulary as structured outputs see it (grammar::TokenVocabulary::from_tokenizer);
  // null: requests for structured outputs get a 400.
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;
};

struct ServerConfig {
  std::string model_name;  // the only accepted "model"
  // server/tokenizer_fingerprint.h of the model directory, advertised in
  // /v1/models for routers to check; empty: not advertised.
  std::string tokenizer_fingerprint;
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port (bind() returns it)
  ApiKeyStore api_keys;
  int http_threads = 2;    // handler threads (parse, tokenize, template, submit)
  size_t max_body_bytes = 8u << 20;
  int retry_after_seconds = 1;
  int32_t default_chat_max_tokens = 1024;  // when the request gives none (capped by the context)
  // Most n x max_tokens x (1 + logprobs) one request may ask for (request_limits.h); <= 0: no cap.
  int64_t max_request_cost = kDefaultMaxRequestCost;
  // Quotas of tenants whose api-keys entry sets none (tenant_quotas.h). The
  // KV block caps must also be set on the KV manager (the CLI does both).
  TenantLimits default_tenant_limits;
  // The HTTP front's limits and deadlines (http_front.h); host, port,
  // worker_threads, limits.max_body_bytes and retry_after_seconds come from
  // the fields above.
  HttpFrontConfig http;
  // After stop(), how long replies in progress may go on before every
  // connection is closed.
  std::chrono::milliseconds shutdown_grace{10'000};
  // Serve GET /v1/kv/events (the KV manager must record events: KvCacheConfig::record_events).
  bool publish_kv_events = true;
  // No generation sends its first token (or, not streamed, its answer) earlier
  // than this after it arrived (first_token_floor.h); 0: no floor. With
  // first_token_floor_hits_only, only requests whose prompt hit the cache wait.
  std::chrono::milliseconds first_token_floor{0};
  bool first_token_floor_hits_only = false;
  // vLLM's priority scheduling (--scheduling-policy priority): requests may carry "priority" (lower runs
  // first, engine::GenerationRequest::priority); off, a priority other than 0 is a 400.
  bool priority_scheduling = false;
  // Structured outputs (structured_output.h): the compiled-grammar cache's memory bound; the
  // json_object grammar compiled at start; jump-forward (text a grammar forces is appended as
  // its canonical tokens without a forward pass each; needs TextCodec::encode).
  size_t grammar_cache_memory_bytes = size_t{256} << 20;
  bool warm_json_object_grammar = true;
  bool jump_forward = true;
};

class OpenAiServer {
 public:
  OpenAiServer(ServerConfig config, engine::Engine& engine, TextCodec codec);
  ~OpenAiServer();

  // Binds the socket; returns the port (useful with port 0).
  StatusOr<int> bind();
  // Serves until stop() and every connection has closed.
  Status serve();
  // New requests get 503; /health reports draining. In-flight ones continue.
  void begin_drain() { draining_ = true; }
  // Stops accepting; replies in progress get config.shutdown_grace (the engine
  // cancels what is left then), and up to 1 s more for the cancelled streams'
  // last events to be written; then every connection closes and serve() returns.
  void stop();

  HttpCounters http_counters() const;
  HttpFrontCounters front_counters() const { return front_.counters(); }

 private:
  void install_routes();
  HttpReply handle_generate(const HttpRequest& req, Endpoint endpoint);
  // One prompt of a request made ready to submit: its tokens (truncated as asked, checked against
  // the vocabulary), its sampling with max_tokens picked for it when the request gave none (the
  // context's room decides), its cost checked, and what echo / prompt_logprobs report of it.
  struct PreparedPrompt {
    std::vector<int32_t> tokens;
    engine::SamplingParams sampling;
    ResponseBuilder::PromptReport report;
  };
  // `input` null: the chat's messages. `where` leads error messages ("prompt 3: " in a batch).
  std::variant<PreparedPrompt, ApiError> prepare_prompt(const OpenAiRequest& req, const PromptInput* input,
                                                        const std::string& where) const;
  HttpReply handle_cache_drop(const HttpRequest& req);
  HttpReply handle_tokenize(const HttpRequest& req);
  HttpReply handle_detokenize(const HttpRequest& req);
  // 400 model_not_found unless `model` is the served model's name.
  std::optional<ApiError> check_model(const std::string& model) const;
  HttpReply handle_usage(const HttpRequest& req);
  HttpReply handle_metrics(const HttpRequest& req);
  HttpReply handle_models(const HttpRequest& req);
  // The caller's identity, or the 401 to answer.
  std::variant<KeyIdentity, HttpReply> authenticate(const HttpRequest& req) const;
  // The identity and its request's cache namespace (user_salt.h), or the reply refusing it.
  struct Caller {
    KeyIdentity identity;
    std::string cache_namespace;
    std::string user;  // empty: the tenant's own namespace
  };
  std::variant<Caller, HttpReply> authenticate_with_namespace(const HttpRequest& req) const;
  HttpReply error_reply(const ApiError& error) const;
  StatusOr<std::vector<int32_t>> tokens_for_text(const std::string& text, bool add_special_tokens) const;
  // req.bad_words into req.sampling.bad_words_ids (an error names bad_words).
  std::optional<ApiError> tokenize_bad_words(OpenAiRequest& req) const;
  // The request's scheduling priority: "priority" only with priority scheduling (else 0), and no more urgent
  // than the tenant's min_priority (absent: 0, or min_priority when that is larger).
  std::variant<int32_t, ApiError> priority_for(std::optional<int32_t> asked, const TenantLimits& limits) const;
  // The chat template's text, encoded without special tokens by default (templates write their own BOS).
  StatusOr<std::vector<int32_t>> tokens_for_chat(const ChatPrompt& prompt, bool add_special_tokens = false) const;
  std::string token_text(int32_t token) const;
  // Token ids as text, decoded as a whole (token_text joined when the model has no decoder).
  std::string text_of(std::span<const int32_t> tokens) const;
  // A 400 naming `param` for the first id outside the vocabulary ("<what> <id> at index <i> ...").
  std::optional<ApiError> check_vocabulary(std::span<const int32_t> tokens, const std::string& what,
                                           const std::string& param) const;
  // The request's structured-output constraint (null when it asks for none).
  std::variant<std::shared_ptr<const engine::TokenConstraint>, ApiError> constraint_for(const OpenAiRequest& req);

  ServerConfig config_;
  engine::Engine& engine_;
  TextCodec codec_;
  std::unique_ptr<StructuredOutputCompiler> structured_;
  std::unique_ptr<KvEventFeed> kv_feed_;  // null unless config_.publish_kv_events
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_response_id_{1};
  TenantUsageBook tenant_usage_;
  TenantQuotas quotas_;
  std::unique_ptr<WakeTimer> wake_timer_;  // only with a first-token floor; outlives the front's replies
  // Last: destroyed first, so no handler runs while the members above go away.
  HttpFront front_;
};

}  // namespace pagoda::server
