#include "pagoda/server/openai_server.h"

#include <chrono>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/server/kv_event_feed.h"
#include "pagoda/server/kv_routes.h"
#include "pagoda/server/peer_connection.h"

namespace pagoda::server {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr auto kPollInterval = 50ms;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// State shared between the handler and httplib's content provider calls.
struct StreamState {
  std::shared_ptr<engine::RequestStream> stream;
  std::unique_ptr<ResponseBuilder> builder;
  bool include_usage = false;
  bool done = false;
};

}  // namespace

OpenAiServer::OpenAiServer(ServerConfig config, engine::Engine& engine, TextCodec codec)
    : config_(std::move(config)), engine_(engine), codec_(std::move(codec)), http_(std::make_unique<httplib::Server>()) {
  if (config_.publish_kv_events) kv_feed_ = std::make_unique<KvEventFeed>(engine_);
  install_routes();
}

OpenAiServer::~OpenAiServer() { stop(); }

HttpCounters OpenAiServer::http_counters() const {
  std::lock_guard lock(counters_mutex_);
  return counters_;
}

void OpenAiServer::send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.http_status == 429) res.set_header("Retry-After", std::to_string(config_.retry_after_seconds));
  res.set_content(error.body(), "application/json");
}

std::optional<std::string> OpenAiServer::authenticate(const httplib::Request& req, httplib::Response& res) {
  auto tenant = config_.api_keys.tenant_for_authorization(req.get_header_value("Authorization"));
  if (!tenant) {
    ApiError e;
    e.http_status = 401;
    e.type = "authentication_error";
    e.code = "invalid_api_key";
    e.message = req.has_header("Authorization") ? "invalid api key"
                                                : "missing api key: send 'Authorization: Bearer <key>'";
    send_error(res, e);
    return std::nullopt;
  }
  return tenant;
}

std::string OpenAiServer::token_text(int32_t token) const {
  if (codec_.token_text) return codec_.token_text(token);
  return fmt::format("<{}>", token);
}

StatusOr<std::vector<int32_t>> OpenAiServer::tokens_for_text(const std::string& text, bool add_special_tokens) const {
  if (!codec_.encode)
    return invalid_argument_error("model '{}' has no tokenizer: send the prompt as an array of token ids",
                                  config_.model_name);
  return codec_.encode(text, add_special_tokens);
}

StatusOr<std::vector<int32_t>> OpenAiServer::tokens_for_chat(const ChatPrompt& prompt) const {
  if (!codec_.encode || !codec_.render_chat)
    return invalid_argument_error("model '{}' has no tokenizer or chat template: use /v1/completions with token ids",
                                  config_.model_name);
  PAGODA_ASSIGN_OR_RETURN(std::string text, codec_.render_chat(prompt));
  // Templates write their own BOS.
  return codec_.encode(text, false);
}

void OpenAiServer::install_routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(config_.max_body_bytes);
  s.set_keep_alive_timeout(1);  // so shutdown is not held up by idle keep-alive connections
  s.set_read_timeout(30, 0);
  const int threads = std::max(4, config_.http_threads);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  s.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard lock(counters_mutex_);
    ++counters_.responses_by_status[res.status];
  });
  s.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.code = "internal_error";
    e.message = "internal error";
    send_error(res, e);
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error body
    ApiError e;
    e.http_status = res.status;
    e.code = res.status == 404 ? "not_found" : "http_error";
    e.message = res.status == 404 ? fmt::format("no route for {} {}", req.method, req.path)
                : res.status == 413 ? fmt::format("request body over {} bytes", config_.max_body_bytes)
                                    : fmt::format("HTTP error {}", res.status);
    send_error(res, e);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_json(res, 503, {{"status", "draining"}});
    send_json(res, 200, {{"status", "ok"}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_prometheus_metrics(engine_.stats(), http_counters()), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authenticate(req, res)) return;
    json model = {{"id", config_.model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "pagoda"},
                  {"max_model_len", engine_.max_context_length()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Endpoint::kCompletions);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Endpoint::kChatCompletions);
  });
  s.Post("/v1/cache/drop", [this](const httplib::Request& req, httplib::Response& res) { handle_cache_drop(req, res); });
  int32_t block_size = 0;
  engine_.visit_kv_cache([&](kv::KvCacheManager& kv) { block_size = kv.block_size(); });
  install_kv_routes(s, KvRoutesContext{&config_.api_keys, &engine_, kv_feed_.get(), block_size, &draining_});
}

void OpenAiServer::handle_generate(const httplib::Request& http_req, httplib::Response& res, Endpoint endpoint) {
  auto tenant = authenticate(http_req, res);
  if (!tenant) return;
  if (draining_) return send_error(res, api_error_from_status(failed_precondition_error("the server is shutting down")));

  auto parsed = parse_openai_request(http_req.body, endpoint);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  OpenAiRequest& req = std::get<OpenAiRequest>(parsed);
  if (req.model != config_.model_name)
    return send_error(res, invalid_request(fmt::format("model '{}' does not exist; this server serves '{}'",
                                                       req.model, config_.model_name),
                                           "model", "model_not_found"));

  StatusOr<std::vector<int32_t>> tokens = std::vector<int32_t>{};
  if (endpoint == Endpoint::kChatCompletions)
    tokens = tokens_for_chat(req.chat);
  else if (req.prompt_text)
    tokens = tokens_for_text(*req.prompt_text, true);
  else
    tokens = req.prompt_tokens;
  const char* prompt_param = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (!tokens.ok()) return send_error(res, api_error_from_status(tokens.status(), prompt_param));
  if (tokens->empty()) return send_error(res, invalid_request("the prompt is empty", prompt_param));

  const int64_t context = engine_.max_context_length();
  const int64_t prompt_len = static_cast<int64_t>(tokens->size());
  if (!req.max_tokens_given) {
    const int64_t room = context - prompt_len;
    if (room < 1)
      return send_error(res, invalid_request(fmt::format("this model's maximum context length is {} tokens, but the "
                                                         "prompt has {} tokens",
                                                         context, prompt_len),
                                             prompt_param, "context_length_exceeded"));
    const int64_t wanted = endpoint == Endpoint::kCompletions ? 16 : config_.default_chat_max_tokens;
    req.sampling.max_tokens = static_cast<int32_t>(std::min(room, wanted));
  }

  // Vocabulary checks the engine repeats, made here because only here is it
  // known which field to name.
  const int32_t vocab = engine_.vocab_size();
  for (size_t i = 0; i < tokens->size(); ++i)
    if ((*tokens)[i] < 0 || (*tokens)[i] >= vocab)
      return send_error(res, invalid_request(fmt::format("prompt token {} at index {} is outside the vocabulary [0, {})",
                                                         (*tokens)[i], i, vocab),
                                             prompt_param));
  for (int32_t id : req.sampling.stop_token_ids)
    if (id < 0 || id >= vocab)
      return send_error(res, invalid_request(fmt::format("stop_token_ids: {} is outside the vocabulary [0, {})", id,
                                                         vocab),
                                             "stop_token_ids"));

  engine::GenerationRequest gen;
  gen.tenant_namespace = ApiKeyStore::cache_namespace(*tenant);
  gen.prompt_tokens = std::move(*tokens);
  gen.sampling = req.sampling;
  auto submitted = engine_.submit(std::move(gen));
  if (!submitted.ok()) {
    // By code, never by the message (engine.h): kOutOfRange is the prompt plus
    // max_tokens past the context length or the whole KV cache.
    ApiError e = api_error_from_status(submitted.status());
    if (submitted.status().code() == StatusCode::kOutOfRange) {
      e.code = "context_length_exceeded";
      e.param = prompt_param;
    }
    return send_error(res, e);
  }

  const std::string id = fmt::format("{}-{:x}{:06x}", endpoint == Endpoint::kCompletions ? "cmpl" : "chatcmpl",
                                     unix_seconds(), next_response_id_++);
  auto builder = std::make_unique<ResponseBuilder>(endpoint, id, config_.model_name, unix_seconds(), req.sampling.n,
                                                   req.sampling.logprobs.has_value(),
                                                   [this](int32_t t) { return token_text(t); });
  // Tool calls are read back only from whole responses, and only when the
  // template was shown tools (streamed deltas stay text).
  if (endpoint == Endpoint::kChatCompletions && !req.stream && req.chat.tools.is_array())
    builder->parse_tool_calls_as(codec_.render_chat.tool_call_syntax);
  if (req.stream) return stream_response(http_req, res, *submitted, std::move(builder), req.include_usage);
  whole_response(http_req, res, **submitted, *builder);
}

void OpenAiServer::whole_response(const httplib::Request& http_req, httplib::Response& res,
                                  engine::RequestStream& stream, ResponseBuilder& builder) {
  // Nothing is sent until the result is known, so a failure is a real 5xx status
  // rather than a 200 with an error body. The client may leave meanwhile: its
  // socket is looked up once the request outlives one poll interval.
  std::optional<PeerConnection> peer;
  bool peer_searched = false;
  auto next_check = std::chrono::steady_clock::now() + kPollInterval;
  while (true) {
    auto out = stream.next(kPollInterval);
    // Deltas may arrive faster than the poll interval: check the client by the clock.
    if (const auto now = std::chrono::steady_clock::now(); now >= next_check) {
      next_check = now + kPollInterval;
      if (!peer_searched) {
        peer_searched = true;
        peer = PeerConnection::find(http_req.local_addr, http_req.local_port, http_req.remote_addr,
                                    http_req.remote_port);
      }
      if (peer && peer->closed()) {
        engine_.abort(stream.id());
        {
          std::lock_guard lock(counters_mutex_);
          ++counters_.client_disconnects;
        }
        res.status = 499;  // nginx's "client closed request": only the access counters see it
        return;
      }
    }
    if (!out) continue;
    builder.accumulate(*out);
    if (!out->finished) continue;
    if (out->failed()) return send_error(res, api_error_from_engine_failure(out->failure()));
    // An abort without a failure is not one this handler asked for: never a 200 with a cut-short text.
    if (builder.any_choice_finished(engine::FinishReason::kAbort))
      return send_error(res, api_error_from_status(failed_precondition_error(
                                 "the request was aborted before it finished; retry")));
    return send_json(res, 200, builder.final_response(out->usage));
  }
}

void OpenAiServer::stream_response(const httplib::Request&, httplib::Response& res,
                                   std::shared_ptr<engine::RequestStream> stream,
                                   std::unique_ptr<ResponseBuilder> builder, bool include_usage) {
  // Server-sent events: the 200 goes out with the first byte; a failure later
  // is an error event in the stream, then [DONE].
  auto state = std::make_shared<StreamState>();
  state->stream = std::move(stream);
  state->builder = std::move(builder);
  state->include_usage = include_usage;
  const engine::RequestId request_id = state->stream->id();

  auto provider = [state](size_t, httplib::DataSink& sink) -> bool {
    while (!state->done) {
      if (!sink.is_writable()) return false;  // the client left: the releaser aborts
      auto out = state->stream->next(kPollInterval);
      if (!out) continue;
      std::string payload;
      for (const json& chunk : state->builder->chunks(*out)) {
        json c = chunk;
        if (state->include_usage) c["usage"] = nullptr;
        payload += ResponseBuilder::sse_event(c);
      }
      if (out->finished) {
        if (out->failed()) payload += "data: " + api_error_from_engine_failure(out->failure()).body() + "\n\n";
        if (state->include_usage) payload += ResponseBuilder::sse_event(state->builder->usage_chunk(out->usage));
        payload += ResponseBuilder::kSseDone;
        state->done = true;
      }
      if (!payload.empty() && !sink.write(payload.data(), payload.size())) return false;
    }
    sink.done();
    return true;
  };
  auto releaser = [this, state, request_id](bool success) {
    if (!success || !state->done) {
      engine_.abort(request_id);
      std::lock_guard lock(counters_mutex_);
      ++counters_.client_disconnects;
    }
  };
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", provider, releaser);
}

void OpenAiServer::handle_cache_drop(const httplib::Request& http_req, httplib::Response& res) {
  auto tenant = authenticate(http_req, res);
  if (!tenant) return;
  auto parsed = parse_cache_drop_request(http_req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  const CacheDropRequest& req = std::get<CacheDropRequest>(parsed);
  const std::string ns = ApiKeyStore::cache_namespace(*tenant);
  StatusOr<int32_t> dropped = 0;
  if (req.all) {
    dropped = engine_.drop_namespace(ns);
  } else {
    StatusOr<std::vector<int32_t>> tokens = req.prompt_tokens;
    if (req.chat)
      tokens = tokens_for_chat(*req.chat);
    else if (req.prompt_text)
      tokens = tokens_for_text(*req.prompt_text, true);
    if (!tokens.ok()) return send_error(res, api_error_from_status(tokens.status(), "prompt"));
    dropped = engine_.drop_conversation(ns, std::move(*tokens), req.keep_prefix_tokens);
  }
  if (!dropped.ok()) return send_error(res, api_error_from_status(dropped.status()));
  send_json(res, 200, {{"object", "cache.drop"}, {"dropped_blocks", *dropped}});
}

StatusOr<int> OpenAiServer::bind() {
  if (config_.port == 0) {
    int port = http_->bind_to_any_port(config_.host);
    if (port <= 0) return io_error("cannot bind {} on any port", config_.host);
    config_.port = port;
    return port;
  }
  if (!http_->bind_to_port(config_.host, config_.port))
    return io_error("cannot bind {}:{} (in use, or not permitted)", config_.host, config_.port);
  return config_.port;
}

Status OpenAiServer::serve() {
  if (!http_->listen_after_bind()) {
    if (draining_) return ok_status();
    return io_error("the HTTP server stopped unexpectedly");
  }
  return ok_status();
}

void OpenAiServer::stop() {
  draining_ = true;
  if (http_) http_->stop();
}

}  // namespace pagoda::server
