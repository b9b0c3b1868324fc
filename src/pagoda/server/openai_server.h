#pragma once
// The OpenAI-compatible HTTP server (cpp-httplib) in front of an Engine.
//
// Routes: POST /v1/completions, POST /v1/chat/completions (both with
// "stream": true as server-sent events ending in "data: [DONE]"),
// GET /v1/models, POST /v1/cache/drop (pagoda: drop a conversation's or the
// tenant's cached blocks), GET /health, GET /metrics (Prometheus), and for a
// KV-aware router GET /v1/kv/events, /v1/kv/namespace, /v1/load (kv_routes.h).
//
// Request path: auth (api key -> tenant -> cache namespace) -> parse and
// validate (400 + OpenAI error object) -> model name -> chat template ->
// tokens -> engine submit (400 too long, 429 + Retry-After queue full: all
// decided before any byte of the response) -> response.
//
// Non-streamed responses hold their status until the generation has finished:
// 200 with the completion, or the OpenAI error object with 500 (the model
// failed), 503 (the request can never fit the KV cache, or the server shut
// down under it). Streamed responses send 200 with the first byte; a later
// failure is an error event ({"error": {...}}) followed by [DONE].
//
// Chat with tools: the messages, tools and chat_template_kwargs reach the chat
// template whole (chat_prompt.h). In non-streamed responses, tool calls the
// model writes in its template's syntax (tool_call_parser.h: Hermes blocks of
// Qwen2.5 / Qwen3 / Hermes) come back as message.tool_calls with finish_reason
// "tool_calls"; streamed responses carry them as plain text.
//
// A client that disconnects is noticed within one poll interval (50 ms) and
// its request aborted, which frees its KV blocks at the next engine step.
//
// Thread safety: handlers run on httplib's worker threads; the engine API they
// call is thread-safe. stop() may be called from any thread (signal handler
// thread).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/engine/engine.h"
#include "pagoda/server/api_keys.h"
#include "pagoda/server/openai_request.h"
#include "pagoda/server/openai_response.h"
#include "pagoda/server/prometheus_metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

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
};

struct ServerConfig {
  std::string model_name;  // the only accepted "model"
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port (bind() returns it)
  ApiKeyStore api_keys;
  int http_threads = 64;
  size_t max_body_bytes = 8u << 20;
  int retry_after_seconds = 1;
  int32_t default_chat_max_tokens = 1024;  // when the request gives none (capped by the context)
  // Serve GET /v1/kv/events (the KV manager must record events: KvCacheConfig::record_events).
  bool publish_kv_events = true;
};

class OpenAiServer {
 public:
  OpenAiServer(ServerConfig config, engine::Engine& engine, TextCodec codec);
  ~OpenAiServer();

  // Binds the socket; returns the port (useful with port 0).
  StatusOr<int> bind();
  // Serves until stop(); returns when every in-flight handler has returned.
  Status serve();
  // New requests get 503; /health reports draining. In-flight ones continue.
  void begin_drain() { draining_ = true; }
  // Closes the listening socket; serve() returns once handlers finish.
  void stop();

  HttpCounters http_counters() const;

 private:
  void install_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // Non-streamed: waits for the whole result, then answers 200 or the error's status.
  void whole_response(const httplib::Request& req, httplib::Response& res, engine::RequestStream& stream,
                      ResponseBuilder& builder);
  // Streamed: 200 at once, deltas as server-sent events.
  void stream_response(const httplib::Request& req, httplib::Response& res,
                       std::shared_ptr<engine::RequestStream> stream, std::unique_ptr<ResponseBuilder> builder,
                       bool include_usage);
  void handle_cache_drop(const httplib::Request& req, httplib::Response& res);
  std::optional<std::string> authenticate(const httplib::Request& req, httplib::Response& res);
  void send_error(httplib::Response& res, const ApiError& error);
  StatusOr<std::vector<int32_t>> tokens_for_text(const std::string& text, bool add_special_tokens) const;
  StatusOr<std::vector<int32_t>> tokens_for_chat(const ChatPrompt& prompt) const;
  std::string token_text(int32_t token) const;

  ServerConfig config_;
  engine::Engine& engine_;
  TextCodec codec_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<KvEventFeed> kv_feed_;  // null unless config_.publish_kv_events
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_response_id_{1};
  mutable std::mutex counters_mutex_;
  HttpCounters counters_;
};

}  // namespace pagoda::server
