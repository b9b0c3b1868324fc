#include "pagoda/server/openai_server.h"

#include <algorithm>
#include <chrono>

#include <nlohmann/json.hpp>

#include "pagoda/server/generation_reply.h"
#include "pagoda/server/kv_event_feed.h"
#include "pagoda/server/kv_routes.h"
#include "pagoda/server/user_salt.h"

namespace pagoda::server {

using json = nlohmann::json;

namespace {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

HttpReply json_reply(int status, const json& body) {
  HttpReply r;
  r.response.status = status;
  r.response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpFrontConfig front_config(const ServerConfig& c) {
  HttpFrontConfig f = c.http;
  f.host = c.host;
  f.port = c.port;
  f.worker_threads = std::max(1, c.http_threads);
  f.limits.max_body_bytes = c.max_body_bytes;
  f.retry_after_seconds = c.retry_after_seconds;
  return f;
}

}  // namespace

OpenAiServer::OpenAiServer(ServerConfig config, engine::Engine& engine, TextCodec codec)
    : config_(std::move(config)), engine_(engine), codec_(std::move(codec)), front_(front_config(config_)) {
  if (codec_.vocabulary) {
    StructuredOutputCompiler::Options options;
    options.max_memory_bytes = config_.grammar_cache_memory_bytes;
    options.warm_json_object = config_.warm_json_object_grammar;
    if (codec_.encode) options.encode = [encode = codec_.encode](std::string_view text) { return encode(text, false); };
    options.jump_forward = config_.jump_forward;
    structured_ = std::make_unique<StructuredOutputCompiler>(codec_.vocabulary, std::move(options));
  }
  if (config_.publish_kv_events) kv_feed_ = std::make_unique<KvEventFeed>(engine_);
  if (config_.first_token_floor.count() > 0) wake_timer_ = std::make_unique<WakeTimer>();
  install_routes();
}

OpenAiServer::~OpenAiServer() { stop(); }

HttpCounters OpenAiServer::http_counters() const {
  const HttpFrontCounters f = front_.counters();
  HttpCounters c;
  c.responses_by_status = f.responses_by_status;
  c.client_disconnects = f.client_disconnects;
  return c;
}

HttpReply OpenAiServer::error_reply(const ApiError& error) const {
  return HttpReply{api_error_response(error, config_.retry_after_seconds), nullptr};
}

std::variant<KeyIdentity, HttpReply> OpenAiServer::authenticate(const HttpRequest& req) const {
  auto identity = config_.api_keys.identify(req.header("Authorization"));
  if (identity) return std::move(*identity);
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message =
      req.has_header("Authorization") ? "invalid api key" : "missing api key: send 'Authorization: Bearer <key>'";
  return error_reply(e);
}

std::variant<OpenAiServer::Caller, HttpReply> OpenAiServer::authenticate_with_namespace(const HttpRequest& req) const {
  auto identity = authenticate(req);
  if (auto* refused = std::get_if<HttpReply>(&identity)) return std::move(*refused);
  auto ns = request_namespace(std::get<KeyIdentity>(identity), req);
  if (auto* e = std::get_if<ApiError>(&ns)) return error_reply(*e);
  RequestNamespace& n = std::get<RequestNamespace>(ns);
  return Caller{std::get<KeyIdentity>(std::move(identity)), std::move(n.cache_namespace), std::move(n.user)};
}

std::optional<ApiError> OpenAiServer::check_vocabulary(std::span<const int32_t> tokens, const std::string& what,
                                                       const std::string& param) const {
  const int32_t vocab = engine_.vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return invalid_request(
          fmt::format("{} {} at index {} is outside the vocabulary [0, {})", what, tokens[i], i, vocab), param);
  return std::nullopt;
}

std::string OpenAiServer::text_of(std::span<const int32_t> tokens) const {
  if (codec_.decode) return codec_.decode(tokens);
  std::string text;
  for (int32_t t : tokens) text += token_text(t);
  return text;
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

std::variant<int32_t, ApiError> OpenAiServer::priority_for(std::optional<int32_t> asked,
                                                           const TenantLimits& limits) const {
  if (!config_.priority_scheduling) {
    if (asked.value_or(0) != 0)
      return invalid_request("'priority' other than 0 needs the server started with --scheduling-policy priority",
                             "priority", "unsupported");
    return 0;  // first come, first served: priorities (and min_priority) play no part
  }
  const int32_t priority = asked.value_or(std::max(0, limits.min_priority.value_or(0)));
  if (limits.min_priority && priority < *limits.min_priority) {
    ApiError e = invalid_request(fmt::format("priority {} is more urgent than this tenant may ask (its api key's "
                                             "limits.min_priority is {})",
                                             priority, *limits.min_priority),
                                 "priority", "priority_not_allowed");
    e.http_status = 403;
    return e;
  }
  return priority;
}

// vLLM's bad_words: each word with its leading blanks dropped, tokenized alone and after a space (how
// it reads mid-text), without special tokens; the distinct sequences go to the sampler.
std::optional<ApiError> OpenAiServer::tokenize_bad_words(OpenAiRequest& req) const {
  auto& ids = req.sampling.bad_words_ids;
  if (!req.bad_words.empty() && !codec_.encode)
    return invalid_request(fmt::format("bad_words needs a tokenizer and model '{}' has none", config_.model_name),
                           "bad_words");
  for (size_t i = 0; i < req.bad_words.size(); ++i) {
    const std::string& word = req.bad_words[i];
    const std::string bare = word.substr(word.find_first_not_of(" \t\n\r"));
    for (const std::string& text : {bare, " " + bare}) {
      StatusOr<std::vector<int32_t>> tokens = tokens_for_text(text, false);
      if (!tokens.ok()) return api_error_from_status(tokens.status(), "bad_words");
      if (tokens->empty() || std::find(ids.begin(), ids.end(), *tokens) != ids.end()) continue;
      if (tokens->size() > engine::kMaxBadWordTokens)
        return invalid_request(fmt::format("bad_words: word {} is {} tokens, more than {}", i, tokens->size(),
                                           engine::kMaxBadWordTokens),
                               "bad_words");
      ids.push_back(std::move(*tokens));
    }
  }
  return std::nullopt;
}

StatusOr<std::vector<int32_t>> OpenAiServer::tokens_for_chat(const ChatPrompt& prompt, bool add_special_tokens) const {
  if (!codec_.encode || !codec_.render_chat)
    return invalid_argument_error("model '{}' has no tokenizer or chat template: use /v1/completions with token ids",
                                  config_.model_name);
  PAGODA_ASSIGN_OR_RETURN(std::string text, codec_.render_chat(prompt));
  return codec_.encode(text, add_special_tokens);
}

void OpenAiServer::install_routes() {
  // /health answers on the event loop, so it stays quick however busy the workers are.
  front_.route("GET", "/health", RouteRuns::kOnLoop, [this](HttpRequest&) {
    if (draining_) return json_reply(503, {{"status", "draining"}});
    return json_reply(200, {{"status", "ok"}});
  });
  front_.route("GET", "/metrics", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_metrics(r); });
  front_.route("GET", "/v1/usage", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_usage(r); });
  front_.route("GET", "/v1/models", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_models(r); });
  front_.route("POST", "/v1/completions", RouteRuns::kOnWorker,
               [this](HttpRequest& r) { return handle_generate(r, Endpoint::kCompletions); });
  front_.route("POST", "/v1/chat/completions", RouteRuns::kOnWorker,
               [this](HttpRequest& r) { return handle_generate(r, Endpoint::kChatCompletions); });
  front_.route("POST", "/v1/cache/drop", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_cache_drop(r); });
  front_.route("POST", "/tokenize", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_tokenize(r); });
  front_.route("POST", "/detokenize", RouteRuns::kOnWorker, [this](HttpRequest& r) { return handle_detokenize(r); });
  int32_t block_size = 0;
  engine_.visit_kv_cache([&](kv::KvCacheManager& kv) { block_size = kv.block_size(); });
  install_kv_routes(front_, KvRoutesContext{&config_.api_keys, &engine_, kv_feed_.get(), block_size, &draining_});
}

HttpReply OpenAiServer::handle_models(const HttpRequest& http_req) {
  auto identity = authenticate(http_req);
  if (auto* refused = std::get_if<HttpReply>(&identity)) return std::move(*refused);
  json model = {{"id", config_.model_name},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "pagoda"},
                {"max_model_len", engine_.max_context_length()}};
  if (!config_.tokenizer_fingerprint.empty()) model["tokenizer_fingerprint"] = config_.tokenizer_fingerprint;
  return json_reply(200, {{"object", "list"}, {"data", json::array({model})}});
}

std::optional<ApiError> OpenAiServer::check_model(const std::string& model) const {
  if (model == config_.model_name) return std::nullopt;
  return invalid_request(fmt::format("model '{}' does not exist; this server serves '{}'", model, config_.model_name),
                         "model", "model_not_found");
}

HttpReply OpenAiServer::handle_tokenize(const HttpRequest& http_req) {
  if (auto e = check_json_content_type(http_req.header("Content-Type"))) return error_reply(*e);
  auto identity = authenticate(http_req);
  if (auto* refused = std::get_if<HttpReply>(&identity)) return std::move(*refused);
  auto parsed = parse_tokenize_request(http_req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_reply(*e);
  const TokenizeRequest& req = std::get<TokenizeRequest>(parsed);
  if (auto e = check_model(req.model)) return error_reply(*e);
  StatusOr<std::vector<int32_t>> tokens = std::vector<int32_t>{};
  if (req.prompt)
    tokens = tokens_for_text(*req.prompt, req.add_special_tokens);
  else
    tokens = tokens_for_chat(req.chat, req.add_special_tokens);
  if (!tokens.ok()) return error_reply(api_error_from_status(tokens.status(), req.prompt ? "prompt" : "messages"));
  json body = {{"count", tokens->size()},
               {"max_model_len", engine_.max_context_length()},
               {"tokens", *tokens},
               {"token_strs", nullptr}};
  if (req.return_token_strs) {
    json strs = json::array();
    for (int32_t t : *tokens) strs.push_back(token_text(t));
    body["token_strs"] = std::move(strs);
  }
  return json_reply(200, body);
}

HttpReply OpenAiServer::handle_detokenize(const HttpRequest& http_req) {
  if (auto e = check_json_content_type(http_req.header("Content-Type"))) return error_reply(*e);
  auto identity = authenticate(http_req);
  if (auto* refused = std::get_if<HttpReply>(&identity)) return std::move(*refused);
  auto parsed = parse_detokenize_request(http_req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_reply(*e);
  const DetokenizeRequest& req = std::get<DetokenizeRequest>(parsed);
  if (auto e = check_model(req.model)) return error_reply(*e);
  if (auto e = check_vocabulary(req.tokens, "token", "tokens")) return error_reply(*e);
  return json_reply(200, {{"prompt", text_of(req.tokens)}});
}

HttpReply OpenAiServer::handle_generate(const HttpRequest& http_req, Endpoint endpoint) {
  const auto arrived = std::chrono::steady_clock::now();
  if (auto e = check_json_content_type(http_req.header("Content-Type"))) return error_reply(*e);
  auto authenticated = authenticate_with_namespace(http_req);
  if (auto* refused = std::get_if<HttpReply>(&authenticated)) return std::move(*refused);
  const Caller& caller = std::get<Caller>(authenticated);
  const std::string tenant = caller.identity.tenant;
  const TenantLimits limits = caller.identity.limits.value_or(config_.default_tenant_limits);
  if (draining_) return error_reply(api_error_from_status(failed_precondition_error("the server is shutting down")));

  auto parsed = parse_openai_request(http_req.body, endpoint);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_reply(*e);
  OpenAiRequest& req = std::get<OpenAiRequest>(parsed);
  if (auto e = check_model(req.model)) return error_reply(*e);
  const auto priority = priority_for(req.priority, limits);
  if (auto* e = std::get_if<ApiError>(&priority)) return error_reply(*e);

  if (auto e = tokenize_bad_words(req)) return error_reply(*e);
  // Each prompt's tokens, sampling and report (a batched completions request has several).
  std::vector<PreparedPrompt> prompts;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const size_t count = chat ? 1 : req.prompts.size();
  for (size_t i = 0; i < count; ++i) {
    auto prepared = prepare_prompt(req, chat ? nullptr : &req.prompts[i], count == 1 ? "" : fmt::format("prompt {}: ", i));
    if (auto* e = std::get_if<ApiError>(&prepared)) {
      if (e->code == "request_too_costly") tenant_usage_.record_refused(tenant, Refusal::kRequestCost);
      return error_reply(*e);
    }
    prompts.push_back(std::get<PreparedPrompt>(std::move(prepared)));
  }
  const char* prompt_param = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (prompts.size() > 1) {
    // A batch is one engine request per prompt: all of them must fit the engine's queue at once.
    if (static_cast<int64_t>(prompts.size()) > engine_.max_queued_requests())
      return error_reply(invalid_request(fmt::format("'prompt' batches {} prompts; this server queues at most {} "
                                                     "requests, so send at most {} prompts per request",
                                                     prompts.size(), engine_.max_queued_requests(),
                                                     engine_.max_queued_requests()),
                                         "prompt", "batch_too_large"));
    // The cost cap holds for the batch as for one prompt: generation and prompt scoring, each summed.
    int64_t generated = 0, scored = 0;
    for (const PreparedPrompt& p : prompts) {
      generated += request_cost(p.sampling);
      if (p.sampling.prompt_logprobs) scored += static_cast<int64_t>(p.tokens.size()) * (1 + *p.sampling.prompt_logprobs);
    }
    if (config_.max_request_cost > 0 && std::max(generated, scored) > config_.max_request_cost) {
      tenant_usage_.record_refused(tenant, Refusal::kRequestCost);
      return error_reply(invalid_request(
          fmt::format("these {} prompts may cost {} token-units of generation and {} of prompt scoring together, "
                      "over this server's limit of {} per request; send fewer prompts per request",
                      prompts.size(), generated, scored, config_.max_request_cost),
          prompt_param, "request_too_costly"));
    }
  }

  // The messages start with the field they name (stop_token_ids, allowed_token_ids, bad_words, logit_bias);
  // the prompts' sampling differs only in max_tokens.
  for (const PreparedPrompt& p : prompts) {
    Status valid = engine::validate_sampling_params(p.sampling, engine_.vocab_size());
    if (!valid.ok())
      return error_reply(
          invalid_request(valid.message(), valid.message().substr(0, valid.message().find_first_of(" :"))));
  }

  // Structured outputs: the constraint is compiled before any quota is taken.
  auto constraint = constraint_for(req);
  if (auto* e = std::get_if<ApiError>(&constraint)) return error_reply(*e);

  // The tenant's quotas, for all the prompts at once. Worst case for its KV
  // cap: each prompt and every token of every choice, each fork's last block
  // its own.
  const int64_t n = req.sampling.n;
  int64_t blocks = 0, reserved_tokens = 0;
  for (const PreparedPrompt& p : prompts) {
    const int64_t bs = engine_.kv_block_size(), prompt_len = static_cast<int64_t>(p.tokens.size());
    const int64_t max_tokens = p.sampling.max_tokens;
    blocks += (prompt_len + max_tokens + bs - 1) / bs + (n - 1) * ((max_tokens + bs - 1) / bs + 1);
    reserved_tokens += prompt_len + n * max_tokens;
  }
  if (limits.max_kv_blocks > 0 && blocks > limits.max_kv_blocks) {
    tenant_usage_.record_refused(tenant, Refusal::kKvBlocks);
    return error_reply(invalid_request(
        fmt::format("this request may need {} KV blocks of {} tokens (prompt, max_tokens, n), over your tenant's "
                    "cap of {} blocks; lower max_tokens or n, or shorten the prompt",
                    blocks, engine_.kv_block_size(), limits.max_kv_blocks),
        "max_tokens", "tenant_kv_limit"));
  }
  const auto num_prompts = static_cast<int32_t>(prompts.size());
  if (auto refused = quotas_.admit(tenant, limits, reserved_tokens, num_prompts)) {
    tenant_usage_.record_refused(tenant, refused->reason);
    if (!refused->ever_possible)
      return error_reply(invalid_request(refused->message, "max_tokens", "tenant_quota_exceeded"));
    ApiError e;
    e.http_status = 429;
    e.type = "rate_limit_error";
    e.code = refusal_name(refused->reason);
    e.message = refused->message;
    HttpReply reply = error_reply(e);
    for (auto& [name, value] : reply.response.headers)
      if (name == "Retry-After") value = std::to_string(refused->retry_after_seconds);
    return reply;
  }

  const std::string id = fmt::format("{}-{:x}{:06x}", endpoint == Endpoint::kCompletions ? "cmpl" : "chatcmpl",
                                     unix_seconds(), next_response_id_++);
  const int64_t created = unix_seconds();
  GenerationReplyParts parts;
  parts.engine = &engine_;
  for (size_t i = 0; i < prompts.size(); ++i) {
    PreparedPrompt& p = prompts[i];
    engine::GenerationRequest gen;
    gen.tenant_namespace = caller.cache_namespace;
    gen.prompt_tokens = std::move(p.tokens);
    gen.sampling = std::move(p.sampling);
    gen.kv_compression = req.kv_compression;
    gen.priority = std::get<int32_t>(priority);
    gen.constraint = std::get<std::shared_ptr<const engine::TokenConstraint>>(constraint);
    auto submitted = engine_.submit(std::move(gen));
    if (!submitted.ok()) {
      // All or nothing: the prompts already submitted go back.
      for (const PromptGeneration& done : parts.prompts) engine_.abort(done.stream->id());
      quotas_.release(tenant, limits, reserved_tokens, 0, num_prompts);
      if (submitted.status().code() == StatusCode::kResourceExhausted)
        tenant_usage_.record_refused(tenant, Refusal::kQueueFull);
      // By code, never by the message (engine.h): kOutOfRange is the prompt plus
      // max_tokens past the context length or the whole KV cache.
      ApiError e = api_error_from_status(submitted.status());
      if (prompts.size() > 1) e.message = fmt::format("prompt {}: {}", i, e.message);
      if (submitted.status().code() == StatusCode::kOutOfRange) {
        e.code = "context_length_exceeded";
        e.param = prompt_param;
      }
      return error_reply(e);
    }
    auto builder = std::make_unique<ResponseBuilder>(endpoint, id, config_.model_name, created, req.sampling.n,
                                                     req.sampling.logprobs.has_value(),
                                                     [this](int32_t t) { return token_text(t); });
    builder->number_choices_from(static_cast<int32_t>(i) * req.sampling.n);
    builder->name_tokens_by_id(req.return_tokens_as_token_ids);
    if (p.report.echo || p.report.prompt_logprobs) builder->report_prompt(std::move(p.report));
    // Tool calls are read back only when the template was shown tools; forced
    // calls are written in the syntax the constraint used.
    if (endpoint == Endpoint::kChatCompletions && req.chat.tools.is_array()) {
      const bool forced = req.chat.tool_choice == ToolChoice::kRequired || req.chat.tool_choice == ToolChoice::kNamed;
      const ToolCallSyntax syntax = codec_.render_chat.tool_call_syntax;
      builder->parse_tool_calls_as(forced ? StructuredOutputCompiler::forced_tool_syntax(syntax) : syntax);
    }
    parts.prompts.push_back(PromptGeneration{std::move(*submitted), std::move(builder)});
  }
  tenant_usage_.record_accepted(tenant);

  parts.on_ended = [this, tenant, limits, reserved_tokens, num_prompts](std::optional<engine::Usage> usage) {
    // A client that left keeps its whole reservation charged.
    quotas_.release(tenant, limits, reserved_tokens,
                    usage ? int64_t{usage->prompt_tokens} + usage->completion_tokens : reserved_tokens, num_prompts);
    tenant_usage_.record_finished(tenant, usage.value_or(engine::Usage{}));
  };
  parts.retry_after_seconds = config_.retry_after_seconds;
  if (wake_timer_) {
    parts.floor.timer = wake_timer_.get();
    parts.floor.not_before = arrived + config_.first_token_floor;
    parts.floor.hits_only = config_.first_token_floor_hits_only;
  }
  if (req.stream) return HttpReply::deferred(make_streamed_generation_reply(std::move(parts), req.include_usage));
  return HttpReply::deferred(make_whole_generation_reply(std::move(parts)));
}

std::variant<OpenAiServer::PreparedPrompt, ApiError> OpenAiServer::prepare_prompt(const OpenAiRequest& req,
                                                                                  const PromptInput* input,
                                                                                  const std::string& where) const {
  const bool chat = input == nullptr;
  const char* prompt_param = chat ? "messages" : "prompt";
  // `where` ("prompt 3: ") leads the messages of a batched request's prompts.
  auto refuse = [&](ApiError e) {
    e.message = where + e.message;
    return e;
  };
  StatusOr<std::vector<int32_t>> tokens = std::vector<int32_t>{};
  if (chat)
    tokens = tokens_for_chat(req.chat, req.add_special_tokens);
  else if (input->text)
    tokens = tokens_for_text(*input->text, req.add_special_tokens);
  else
    tokens = input->tokens;
  if (!tokens.ok()) return refuse(api_error_from_status(tokens.status(), prompt_param));
  if (tokens->empty()) return refuse(invalid_request("the prompt is empty", prompt_param));

  PreparedPrompt p;
  p.sampling = req.sampling;
  const int64_t context = engine_.max_context_length();
  bool truncated = false;
  if (req.truncate_prompt_tokens) {  // the prompt's last k tokens (the start of a chat's template goes too)
    const int64_t keep = *req.truncate_prompt_tokens < 0 ? context : *req.truncate_prompt_tokens;
    truncated = static_cast<int64_t>(tokens->size()) > keep;
    if (truncated) tokens->erase(tokens->begin(), tokens->end() - static_cast<std::ptrdiff_t>(keep));
  }
  const int64_t prompt_len = static_cast<int64_t>(tokens->size());
  // The engine refuses this too, at submission; checked here so that a batch refuses it before any
  // of its prompts is queued.
  if (req.max_tokens_given && prompt_len + p.sampling.max_tokens > context)
    return refuse(invalid_request(fmt::format("this model's maximum context length is {} tokens, but the prompt has {} "
                                              "tokens and max_tokens is {}",
                                              context, prompt_len, p.sampling.max_tokens),
                                  prompt_param, "context_length_exceeded"));
  if (!req.max_tokens_given) {
    const int64_t room = context - prompt_len;
    if (room < 1)
      return refuse(invalid_request(fmt::format("this model's maximum context length is {} tokens, but the prompt "
                                                "has {} tokens",
                                                context, prompt_len),
                                    prompt_param, "context_length_exceeded"));
    const int64_t wanted = chat ? config_.default_chat_max_tokens : 16;
    p.sampling.max_tokens = static_cast<int32_t>(std::min(room, std::max<int64_t>(wanted, p.sampling.min_tokens)));
    if (p.sampling.min_tokens > p.sampling.max_tokens)
      return refuse(invalid_request(fmt::format("min_tokens {} is more than the {} tokens the context has room for "
                                                "after the prompt",
                                                p.sampling.min_tokens, room),
                                    "min_tokens"));
  }
  for (auto e : {check_request_cost(p.sampling, config_.max_request_cost),
                 check_prompt_scoring_cost(p.sampling, prompt_len, config_.max_request_cost,
                                           req.prompt_logprobs ? "prompt_logprobs" : "echo")}) {
    if (e) return refuse(*e);
  }
  // Vocabulary checks the engine repeats, made here because only here is it
  // known which field to name.
  if (auto e = check_vocabulary(*tokens, "prompt token", prompt_param)) return refuse(*e);

  if (req.echo || req.prompt_logprobs) {
    p.report.tokens = *tokens;
    p.report.echo = req.echo;
    p.report.echo_top_logprobs = req.sampling.logprobs.value_or(0);
    p.report.prompt_logprobs = req.prompt_logprobs;
    // echo: the prompt as given, or as its tokens read when it came as ids or was truncated.
    if (req.echo) p.report.text = !chat && input->text && !truncated ? *input->text : text_of(*tokens);
  }
  // Chat's echo (vLLM): the reply starts with the final message's text when that message is the assistant's.
  if (chat && req.echo_final_message) {
    const nlohmann::ordered_json& last = req.chat.messages.back();
    const auto content = last.find("content");
    if (last.value("role", "") == "assistant" && content != last.end() && content->is_string()) {
      p.report.echo = true;
      p.report.text = content->get<std::string>();
    }
  }
  p.tokens = std::move(*tokens);
  return p;
}

std::variant<std::shared_ptr<const engine::TokenConstraint>, ApiError> OpenAiServer::constraint_for(
    const OpenAiRequest& req) {
  const ChatPrompt* chat = req.endpoint == Endpoint::kChatCompletions ? &req.chat : nullptr;
  const bool forced_tools =
      chat != nullptr && (chat->tool_choice == ToolChoice::kRequired || chat->tool_choice == ToolChoice::kNamed);
  if (req.structured.kind == StructuredOutputSpec::Kind::kNone && !forced_tools)
    return std::shared_ptr<const engine::TokenConstraint>();
  if (!structured_) {
    return invalid_request("structured outputs need the model's tokenizer, which this server has not loaded",
                           forced_tools ? std::string("tool_choice") : req.structured.param, "unsupported");
  }
  return structured_->constraint_for(req.structured, chat, codec_.render_chat.tool_call_syntax);
}

HttpReply OpenAiServer::handle_metrics(const HttpRequest& req) {
  // Server-wide figures (every tenant's traffic in sum) are for operators: with
  // api keys on, only a key marked "admin" reads them.
  auto identity = authenticate(req);
  if (auto* refused = std::get_if<HttpReply>(&identity)) return std::move(*refused);
  if (!std::get<KeyIdentity>(identity).admin) {
    ApiError e;
    e.http_status = 403;
    e.type = "permission_error";
    e.code = "admin_key_required";
    e.message = "/metrics needs an api key marked \"admin\"; a tenant's own figures are at /v1/usage";
    return error_reply(e);
  }
  HttpReply r;
  r.response.content_type = "text/plain; version=0.0.4";
  r.response.body = render_prometheus_metrics(engine_.stats(), http_counters(), tenant_usage_.all());
  if (structured_) r.response.body += render_grammar_cache_metrics(structured_->counters());
  return r;
}

HttpReply OpenAiServer::handle_usage(const HttpRequest& req) {
  auto authenticated = authenticate_with_namespace(req);
  if (auto* refused = std::get_if<HttpReply>(&authenticated)) return std::move(*refused);
  const Caller& caller = std::get<Caller>(authenticated);
  const std::string& tenant = caller.identity.tenant;
  const TenantLimits limits = caller.identity.limits.value_or(config_.default_tenant_limits);
  const TenantCounters c = tenant_usage_.counters(tenant);
  // The KV figures are the request's namespace's: with X-Pagoda-User, that user's.
  const kv::NamespaceKvUsage kv = engine_.namespace_usage(caller.cache_namespace);
  json refused = json::object();
  for (int r = 0; r < kNumRefusals; ++r) refused[refusal_name(static_cast<Refusal>(r))] = c.requests_refused[r];
  json misses = json::object();
  for (int r = 1; r < kv::kNumMissReasons; ++r)
    misses[std::string(kv::miss_reason_name(static_cast<kv::MissReason>(r)))] = kv.miss_tokens_by_reason[r];
  return json_reply(
      200, {{"object", "usage"},
            {"tenant", tenant},
            {"user", caller.user.empty() ? json(nullptr) : json(caller.user)},
            {"requests",
             {{"accepted", c.requests_accepted},
              {"finished", c.requests_finished},
              {"in_flight", quotas_.requests_in_flight(tenant)},
              {"refused", refused}}},
            {"limits",
             {{"max_requests_in_flight", limits.max_requests_in_flight},
              {"tokens_per_minute", limits.tokens_per_minute},
              {"max_kv_blocks", limits.max_kv_blocks}}},
            {"tokens", {{"prompt", c.prompt_tokens}, {"completion", c.completion_tokens}, {"cached", c.cached_prompt_tokens}}},
            {"prefix_cache",
             {{"hit_tokens", kv.hit_tokens}, {"miss_tokens", kv.miss_tokens}, {"miss_tokens_by_reason", misses}}},
            {"kv_blocks",
             {{"held", kv.blocks_held},
              {"cached", kv.blocks_cached},
              {"evictable", kv.blocks_evictable},
              {"tenant_held", kv.group_blocks_held},
              {"limit", kv.block_limit}}}});
}

HttpReply OpenAiServer::handle_cache_drop(const HttpRequest& http_req) {
  if (auto e = check_json_content_type(http_req.header("Content-Type"))) return error_reply(*e);
  auto authenticated = authenticate_with_namespace(http_req);
  if (auto* refused = std::get_if<HttpReply>(&authenticated)) return std::move(*refused);
  auto parsed = parse_cache_drop_request(http_req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_reply(*e);
  const CacheDropRequest& req = std::get<CacheDropRequest>(parsed);
  // A salting key drops inside the user's namespace it names (or the tenant's own without the header).
  const std::string ns = std::get<Caller>(authenticated).cache_namespace;
  StatusOr<int32_t> dropped = 0;
  if (req.all) {
    dropped = engine_.drop_namespace(ns);
  } else {
    StatusOr<std::vector<int32_t>> tokens = req.prompt.tokens;
    if (req.chat)
      tokens = tokens_for_chat(*req.chat, req.add_special_tokens);
    else if (req.prompt.text)
      tokens = tokens_for_text(*req.prompt.text, req.add_special_tokens);
    if (!tokens.ok()) return error_reply(api_error_from_status(tokens.status(), "prompt"));
    if (auto e = check_vocabulary(*tokens, "prompt token", "prompt")) return error_reply(*e);
    dropped = engine_.drop_conversation(ns, std::move(*tokens), req.keep_prefix_tokens);
  }
  if (!dropped.ok()) return error_reply(api_error_from_status(dropped.status()));
  return json_reply(200, {{"object", "cache.drop"}, {"dropped_blocks", *dropped}});
}

StatusOr<int> OpenAiServer::bind() { return front_.bind(); }

Status OpenAiServer::serve() { return front_.serve(); }

void OpenAiServer::stop() {
  draining_ = true;
  // The engine cancels what is still running when the grace ends
  // (Engine::shutdown, called with the same grace), and each cancelled stream
  // then gets its last events (`data: [DONE]`). Connections stay open a little
  // past the grace so those events reach their clients instead of racing the
  // front's forced close (they did lose that race under ASan on a loaded box);
  // a connection whose reply has ended closes at once, and when none is left
  // the front stops without waiting, so the margin is spent only on clients
  // that do not read.
  constexpr std::chrono::milliseconds kLastEventsMargin{1000};
  front_.stop(config_.shutdown_grace + kLastEventsMargin);
}

}  // namespace pagoda::server
