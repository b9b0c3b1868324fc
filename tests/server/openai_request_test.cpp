#include "pagoda/server/openai_request.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/server/api_keys.h"
#include "pagoda/server/openai_response.h"
#include "pagoda/server/prometheus_metrics.h"

namespace pagoda::server {
namespace {

ApiError error_of(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  auto r = parse_openai_request(body, e);
  if (auto* err = std::get_if<ApiError>(&r)) return *err;
  ADD_FAILURE() << "expected an error for " << body;
  return {};
}

OpenAiRequest ok_of(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  auto r = parse_openai_request(body, e);
  if (auto* err = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << err->message;
    return {};
  }
  return std::get<OpenAiRequest>(r);
}

TEST(OpenAiRequestTest, ParsesACompletionWithEveryField) {
  OpenAiRequest r = ok_of(R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0.5,
    "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "frequency_penalty": 0.2,
    "presence_penalty": -0.3, "seed": 9, "n": 2, "stop": ["x", "y"], "stop_token_ids": [4],
    "logprobs": 3, "stream": true, "stream_options": {"include_usage": true}, "user": "u", "extra": 1})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(r.prompts[0].text);
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(*r.sampling.seed, 9u);
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_EQ(r.sampling.stop.size(), 2u);
  EXPECT_EQ(*r.sampling.logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequestTest, PromptForms) {
  EXPECT_EQ(*ok_of(R"({"model": "m", "prompt": "hi"})").prompts.at(0).text, "hi");
  EXPECT_EQ(*ok_of(R"({"model": "m", "prompt": ["hi"]})").prompts.at(0).text, "hi");
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": [[5, 6]]})").prompts.at(0).tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": [[]]})").param, "prompt");
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": []})").param, "prompt");
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": [1.5]})").param, "prompt");
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": [true]})").param, "prompt");
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": [4294967296]})").param, "prompt");
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": {}})").param, "prompt");
}

TEST(OpenAiRequestTest, BatchedPrompts) {
  // Strings, token-id arrays, or both, in order.
  const OpenAiRequest r = ok_of(R"({"model": "m", "prompt": ["a", [5, 6], "b c"], "n": 2})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(*r.prompts[0].text, "a");
  EXPECT_FALSE(r.prompts[1].text);
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(*r.prompts[2].text, "b c");
  // An empty or malformed item is named by its index.
  for (const char* bad : {R"(["a", []])", R"(["a", [1.5]])", R"(["a", 7])", R"(["a", [[1]]])", R"(["a", null])"}) {
    const ApiError e = error_of(fmt::format(R"({{"model": "m", "prompt": {}}})", bad));
    EXPECT_EQ(e.param, "prompt") << bad;
  }
  EXPECT_NE(error_of(R"({"model": "m", "prompt": ["a", []]})").message.find("item 1"), std::string::npos);
  // At most kMaxBatchedPrompts.
  std::string many = R"({"model": "m", "prompt": [)";
  for (size_t i = 0; i <= kMaxBatchedPrompts; ++i) many += i == 0 ? "\"x\"" : ", \"x\"";
  const ApiError too_many = error_of(many + "]}");
  EXPECT_EQ(too_many.param, "prompt");
  EXPECT_EQ(too_many.code, "unsupported");
  EXPECT_EQ(ok_of(many.substr(0, many.rfind(',')) + "]}").prompts.size(), kMaxBatchedPrompts);
  // /v1/cache/drop names one conversation.
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_cache_drop_request(R"({"prompt": ["a", "b"]})")));
  const auto one = parse_cache_drop_request(R"({"prompt": [[3, 4]]})");
  ASSERT_TRUE(std::holds_alternative<CacheDropRequest>(one));
  EXPECT_EQ(std::get<CacheDropRequest>(one).prompt.tokens, (std::vector<int32_t>{3, 4}));
}

TEST(OpenAiRequestTest, RejectsWrongTypesAndRangesNamingTheParam) {
  const std::string p = R"("model": "m", "prompt": [1])";
  struct Case {
    std::string fields, param;
  };
  for (const Case& c : std::vector<Case>{{R"("temperature": -0.1)", "temperature"},
                                         {R"("temperature": 2.5)", "temperature"},
                                         {R"("temperature": "hot")", "temperature"},
                                         {R"("temperature": true)", "temperature"},
                                         {R"("top_p": 0)", "top_p"},
                                         {R"("top_p": 1.5)", "top_p"},
                                         {R"("min_p": -1)", "min_p"},
                                         {R"("max_tokens": 0)", "max_tokens"},
                                         {R"("max_tokens": 1.5)", "max_tokens"},
                                         {R"("max_tokens": 18446744073709551615)", "max_tokens"},
                                         {R"("n": 17)", "n"},
                                         {R"("logprobs": 21)", "logprobs"},
                                         {R"("stop": 5)", "stop"},
                                         {R"("stop": [""])", "stop"},
                                         {R"("stop_token_ids": [-1])", "stop_token_ids"},
                                         {R"("seed": "x")", "seed"},
                                         {R"("stream": 1)", "stream"},
                                         {R"("stream_options": 3)", "stream_options"},
                                         {R"("frequency_penalty": 9)", "frequency_penalty"},
                                         {R"("repetition_penalty": 0)", "repetition_penalty"},
                                         {R"("logit_bias": {"x": 10})", "logit_bias"},
                                         {R"("logit_bias": {"-1": 10})", "logit_bias"},
                                         {R"("logit_bias": {"5": 101})", "logit_bias"},
                                         {R"("logit_bias": {"5": "up"})", "logit_bias"},
                                         {R"("logit_bias": {"5": 1, "05": 2})", "logit_bias"},
                                         {R"("logit_bias": [5])", "logit_bias"},
                                         {R"("allowed_token_ids": [])", "allowed_token_ids"},
                                         {R"("allowed_token_ids": [-1])", "allowed_token_ids"},
                                         {R"("bad_words": "x")", "bad_words"},
                                         {R"("bad_words": [" "])", "bad_words"},
                                         {R"("min_tokens": -1)", "min_tokens"},
                                         {R"("min_tokens": 17, "max_tokens": 16)", "min_tokens"},
                                         {R"("echo": 1)", "echo"},
                                         {R"("max_tokens": -1, "echo": true)", "max_tokens"},
                                         {R"("max_tokens": 0, "echo": true, "n": 2)", "n"},
                                         {R"("prompt_logprobs": 21)", "prompt_logprobs"},
                                         {R"("prompt_logprobs": 1, "stream": true)", "prompt_logprobs"},
                                         {R"("truncate_prompt_tokens": 0)", "truncate_prompt_tokens"},
                                         {R"("truncate_prompt_tokens": -2)", "truncate_prompt_tokens"},
                                         {R"("include_stop_str_in_output": 1)", "include_stop_str_in_output"},
                                         {R"("skip_special_tokens": "no")", "skip_special_tokens"},
                                         {R"("spaces_between_special_tokens": false)", "spaces_between_special_tokens"},
                                         {R"("return_tokens_as_token_ids": 1)", "return_tokens_as_token_ids"},
                                         {R"("add_special_tokens": "yes")", "add_special_tokens"},
                                         {R"("priority": 1.5)", "priority"},
                                         {R"("priority": 2147483648)", "priority"},
                                         {R"("best_of": 3)", "best_of"}}) {
    ApiError e = error_of("{" + p + ", " + c.fields + "}");
    EXPECT_EQ(e.http_status, 400) << c.fields;
    EXPECT_EQ(e.param, c.param) << c.fields << " -> " << e.message;
  }
}

TEST(OpenAiRequestTest, LogitRules) {
  OpenAiRequest r = ok_of(R"({"model": "m", "prompt": [1], "logit_bias": {"7": -100, "12": 2.5},
      "allowed_token_ids": [3, 7, 12], "bad_words": ["  bad word", "x"], "min_tokens": 4})");
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {12, 2.5f}}));
  EXPECT_EQ(r.sampling.allowed_token_ids, (std::vector<int32_t>{3, 7, 12}));
  EXPECT_EQ(r.bad_words, (std::vector<std::string>{"  bad word", "x"}));
  EXPECT_TRUE(r.sampling.bad_words_ids.empty()) << "the server tokenizes them";
  EXPECT_EQ(r.sampling.min_tokens, 4);
  EXPECT_EQ(r.sampling.max_tokens, 16) << "the server picks max_tokens later (at least min_tokens)";
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": [1], "min_tokens": 40})").sampling.min_tokens, 40);
  EXPECT_TRUE(ok_of(R"({"model": "m", "prompt": [1], "logit_bias": {}})").sampling.logit_bias.empty());
  const OpenAiRequest t = ok_of(R"({"model": "m", "prompt": [1], "truncate_prompt_tokens": 5,
      "include_stop_str_in_output": true})");
  EXPECT_EQ(t.truncate_prompt_tokens, 5);
  EXPECT_TRUE(t.sampling.include_stop_str_in_output);
  EXPECT_TRUE(t.sampling.skip_special_tokens);
  EXPECT_FALSE(ok_of(R"({"model": "m", "prompt": [1], "skip_special_tokens": false})").sampling.skip_special_tokens);
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": [1], "truncate_prompt_tokens": -1})").truncate_prompt_tokens, -1);
  EXPECT_TRUE(ok_of(R"({"model": "m", "prompt": [1], "logit_bias": null})").sampling.logit_bias.empty());
}

TEST(OpenAiRequestTest, EchoAndPromptLogprobs) {
  // What the engine scores: prompt_logprobs' alternatives, or echo's logprobs', the larger.
  const OpenAiRequest e = ok_of(R"({"model": "m", "prompt": [1, 2], "echo": true, "logprobs": 3})");
  EXPECT_TRUE(e.echo);
  EXPECT_FALSE(e.prompt_logprobs);
  EXPECT_EQ(e.sampling.prompt_logprobs, 3);
  const OpenAiRequest both = ok_of(R"({"model": "m", "prompt": [1], "echo": true, "logprobs": 2,
      "prompt_logprobs": 5})");
  EXPECT_EQ(both.prompt_logprobs, 5);
  EXPECT_EQ(both.sampling.prompt_logprobs, 5);
  EXPECT_FALSE(ok_of(R"({"model": "m", "prompt": [1], "echo": true})").sampling.prompt_logprobs)
      << "echo without logprobs scores nothing";
  // max_tokens 0 scores the prompt alone: with echo (OpenAI's legacy scoring) or prompt_logprobs.
  const OpenAiRequest zero = ok_of(R"({"model": "m", "prompt": [1, 2], "echo": true, "max_tokens": 0})");
  EXPECT_EQ(zero.sampling.max_tokens, 0);
  EXPECT_EQ(zero.sampling.prompt_logprobs, 0);
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": [1], "prompt_logprobs": 0, "max_tokens": 0})").sampling.max_tokens, 0);
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": [1], "max_tokens": 0})").param, "max_tokens");
  // Chat: prompt_logprobs yes; echo is vLLM's (the final message's text leads the reply), scoring nothing.
  const std::string chat = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(ok_of("{" + chat + R"(, "prompt_logprobs": 2})", Endpoint::kChatCompletions).sampling.prompt_logprobs, 2);
  const OpenAiRequest chat_echo = ok_of("{" + chat + R"(, "echo": true, "logprobs": true})", Endpoint::kChatCompletions);
  EXPECT_TRUE(chat_echo.echo_final_message);
  EXPECT_FALSE(chat_echo.echo);
  EXPECT_FALSE(chat_echo.sampling.prompt_logprobs);
  EXPECT_EQ(ok_of("{" + chat + R"(, "max_completion_tokens": 0, "prompt_logprobs": 0})", Endpoint::kChatCompletions)
                .sampling.max_tokens,
            0);
}

// vLLM's add_special_tokens (completions default true, chat default false), add_generation_prompt,
// continue_final_message and return_tokens_as_token_ids.
TEST(OpenAiRequestTest, PromptRenderingAndTokenNamingFields) {
  EXPECT_TRUE(ok_of(R"({"model": "m", "prompt": "x"})").add_special_tokens);
  EXPECT_FALSE(ok_of(R"({"model": "m", "prompt": "x", "add_special_tokens": false})").add_special_tokens);
  EXPECT_FALSE(ok_of(R"({"model": "m", "prompt": "x"})").return_tokens_as_token_ids);
  EXPECT_TRUE(ok_of(R"({"model": "m", "prompt": "x", "return_tokens_as_token_ids": true})").return_tokens_as_token_ids);
  EXPECT_FALSE(ok_of(R"({"model": "m", "prompt": "x"})").priority.has_value());
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": "x", "priority": -7})").priority, -7);
  const std::string chat = R"("model": "m", "messages": [{"role": "assistant", "content": "Once upon"}])";
  const OpenAiRequest plain = ok_of("{" + chat + "}", Endpoint::kChatCompletions);
  EXPECT_FALSE(plain.add_special_tokens);
  EXPECT_TRUE(plain.chat.add_generation_prompt);
  EXPECT_FALSE(plain.chat.continue_final_message);
  EXPECT_TRUE(ok_of("{" + chat + R"(, "add_special_tokens": true})", Endpoint::kChatCompletions).add_special_tokens);
  const OpenAiRequest continued = ok_of(
      "{" + chat + R"(, "add_generation_prompt": false, "continue_final_message": true})", Endpoint::kChatCompletions);
  EXPECT_FALSE(continued.chat.add_generation_prompt);
  EXPECT_TRUE(continued.chat.continue_final_message);
  EXPECT_EQ(error_of("{" + chat + R"(, "continue_final_message": true})", Endpoint::kChatCompletions).param,
            "continue_final_message");
}

TEST(OpenAiRequestTest, BadJsonAndBadUtf8) {
  EXPECT_EQ(error_of("").code, "invalid_json");
  EXPECT_EQ(error_of("{").code, "invalid_json");
  EXPECT_EQ(error_of("42").code, "invalid_json");
  EXPECT_EQ(error_of("{\"model\": \"m\", \"prompt\": \"\xc3\x28\"}").code, "invalid_json");
  EXPECT_EQ(error_of(R"({"model": "m", "prompt": "\udc00"})").code, "invalid_json");
  EXPECT_EQ(error_of(R"({"model": 5, "prompt": [1]})").param, "model");
}

TEST(OpenAiRequestTest, ChatMessages) {
  OpenAiRequest r = ok_of(R"({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
      "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2})",
                          Endpoint::kChatCompletions);
  ASSERT_EQ(r.chat.messages.size(), 2u);
  EXPECT_EQ(r.chat.messages[0]["role"], "system");
  EXPECT_EQ(r.chat.messages[1]["content"], "ab");
  EXPECT_EQ(r.sampling.max_tokens, 5);
  EXPECT_EQ(*r.sampling.logprobs, 2);
  EXPECT_EQ(error_of(R"({"model": "m", "messages": []})", Endpoint::kChatCompletions).param, "messages");
  EXPECT_EQ(error_of(R"({"model": "m"})", Endpoint::kChatCompletions).param, "messages");
  EXPECT_EQ(error_of(R"({"model": "m", "messages": [{"role": "user"}]})", Endpoint::kChatCompletions).param,
            "messages[0].content");
  EXPECT_EQ(error_of(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
                     Endpoint::kChatCompletions)
                .param,
            "top_logprobs");
  EXPECT_EQ(error_of(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]})",
                     Endpoint::kChatCompletions)
                .param,
            "tools[0].type");
}

TEST(ApiErrorTest, BodyIsBoundedAndValidJson) {
  ApiError e = invalid_request(std::string(100000, 'x') + "\xff", "prompt");
  std::string body = e.body();
  EXPECT_LT(body.size(), 2 * ApiError::kMaxMessageBytes);
  auto j = nlohmann::json::parse(body);
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"].contains("code"));
  EXPECT_EQ(api_error_from_status(resource_exhausted_error("full")).http_status, 429);
  EXPECT_EQ(api_error_from_status(invalid_argument_error("bad")).http_status, 400);
  EXPECT_EQ(api_error_from_status(internal_error("bug")).http_status, 500);
}

TEST(ApiKeyStoreTest, LoadsKeysAndMapsBearerToTenant) {
  auto store = ApiKeyStore::parse(R"({"keys": [{"key": "sk-a", "tenant": "alice"}, {"key": "sk-b", "tenant": "bob"}]})",
                                  "keys.json");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ(*store->tenant_for_authorization("Bearer sk-a"), "alice");
  EXPECT_EQ(*store->tenant_for_authorization("Bearer sk-b"), "bob");
  EXPECT_FALSE(store->tenant_for_authorization("Bearer sk-c"));
  EXPECT_FALSE(store->tenant_for_authorization("sk-a"));
  EXPECT_FALSE(store->tenant_for_authorization(""));
  EXPECT_FALSE(store->tenant_for_authorization("Bearer sk-"));
  EXPECT_EQ(*ApiKeyStore().tenant_for_authorization(""), "default");
  EXPECT_NE(ApiKeyStore::cache_namespace("ab"), ApiKeyStore::cache_namespace("a"));
  for (const char* bad : {"{", R"({"keys": []})", R"({"keys": [{"key": "", "tenant": "a"}]})",
                          R"({"keys": [{"key": "k"}]})", R"({"keys": [{"key": "k", "tenant": "a"}, {"key": "k", "tenant": "b"}]})"}) {
    auto s = ApiKeyStore::parse(bad, "keys.json");
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) EXPECT_NE(s.status().message().find("keys.json"), std::string::npos);
  }
}

TEST(ApiKeyStoreTest, AdminIsOptInPerKeyAndEveryoneWithoutKeys) {
  auto store = ApiKeyStore::parse(
      R"({"keys": [{"key": "sk-a", "tenant": "alice"}, {"key": "sk-ops", "tenant": "ops", "admin": true}]})",
      "keys.json");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_FALSE(store->caller_for_authorization("Bearer sk-a")->admin);
  EXPECT_EQ(store->caller_for_authorization("Bearer sk-ops")->tenant, "ops");
  EXPECT_TRUE(store->caller_for_authorization("Bearer sk-ops")->admin);
  EXPECT_FALSE(store->caller_for_authorization("Bearer sk-x"));
  EXPECT_TRUE(ApiKeyStore().caller_for_authorization("")->admin);
  auto bad = ApiKeyStore::parse(R"({"keys": [{"key": "k", "tenant": "a", "admin": "yes"}]})", "keys.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("keys[0].admin"), std::string::npos);
}

TEST(ResponseBuilderTest, ChatStreamChunksCarryRoleOnceAndUsage) {
  ResponseBuilder b(Endpoint::kChatCompletions, "id", "m", 1, 1, false, [](int32_t t) { return std::to_string(t); });
  engine::RequestOutput d1;
  d1.choices.push_back({0, {5}, "Hel", {}, engine::FinishReason::kNone});
  auto c1 = b.chunks(d1);
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c1[0]["choices"][0]["delta"]["content"], "Hel");
  engine::RequestOutput d2;
  d2.choices.push_back({0, {6}, "lo", {}, engine::FinishReason::kLength});
  auto c2 = b.chunks(d2);
  EXPECT_FALSE(c2[0]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(c2[0]["choices"][0]["finish_reason"], "length");
  engine::Usage u{3, 2, 1};
  auto usage = b.usage_chunk(u);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(ResponseBuilder::sse_event(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(PrometheusMetricsTest, RendersHistogramsAndLabels) {
  engine::EngineStats s;
  s.time_to_first_token.observe(0.02);
  s.time_to_first_token.observe(3.0);
  s.kv.blocks_total = 10;
  s.kv.blocks_in_use = 4;
  HttpCounters http;
  http.responses_by_status[429] = 2;
  std::string text = render_prometheus_metrics(s, http);
  EXPECT_NE(text.find("pagoda_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("pagoda_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("pagoda_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("pagoda_kv_usage_ratio 0.4\n"), std::string::npos);
  EXPECT_NE(text.find("pagoda_http_responses_total{code=\"429\"} 2\n"), std::string::npos);
  // Every sample line belongs to a declared family.
  EXPECT_EQ(text.back(), '\n');
}

TEST(PrometheusMetricsTest, HostTierHitsGaugesAndTransfersCarryTheirLabels) {
  engine::EngineStats s;
  s.kv.hit_tokens = 48;
  s.kv.hit_tokens_by_tier = {16, 32};
  s.kv.blocks_total = 10;
  s.kv.blocks_free = 4;
  s.kv.host_blocks_total = 40;
  s.kv.host_blocks_free = 30;
  s.kv.blocks_promoted = 2;
  s.transfers.blocks[0] = 5;
  s.transfers.bytes[1] = 4096;
  s.transfers.seconds[1] = 0.25;
  s.preemptions = 3;
  s.swap_preemptions = 2;
  s.steps = 9;
  s.overlapped_steps = 7;
  const std::string text = render_prometheus_metrics(s, HttpCounters{});
  for (const char* line :
       {"pagoda_prefix_cache_hit_tokens_total{tier=\"device\"} 16\n",
        "pagoda_prefix_cache_hit_tokens_total{tier=\"host\"} 32\n",
        "pagoda_kv_tier_blocks_capacity{tier=\"host\"} 40\n", "pagoda_kv_tier_blocks_used{tier=\"device\"} 6\n",
        "pagoda_kv_tier_blocks_used{tier=\"host\"} 10\n", "pagoda_kv_blocks_promoted_total 2\n",
        "pagoda_kv_transfer_blocks_total{direction=\"device_to_host\"} 5\n",
        "pagoda_kv_transfer_bytes_total{direction=\"host_to_device\"} 4096\n",
        "pagoda_kv_transfer_seconds_total{direction=\"host_to_device\"} 0.25\n", "pagoda_preemptions_total 3\n",
        "pagoda_swap_preemptions_total 2\n", "pagoda_engine_steps_total 9\n",
        "pagoda_engine_overlapped_steps_total 7\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
  EXPECT_EQ(text.find("pagoda_prefix_cache_hit_tokens_total 48"), std::string::npos) << "the total is the sum of tiers";
}

}  // namespace
}  // namespace pagoda::server

namespace pagoda::server {
namespace {

TEST(OpenAiRequestKvCompressionTest, ReadsTheExtensionFieldAndNamesBadMembers) {
  OpenAiRequest r = ok_of(R"({"model": "m", "prompt": "hi",
      "kv_compression": {"policy": "snapkv", "budget": 256, "sink_tokens": 2, "window": 16, "span": 5}})");
  ASSERT_TRUE(r.kv_compression.has_value());
  EXPECT_EQ(r.kv_compression->policy, runtime::KvCompressionPolicy::kSnapKV);
  EXPECT_EQ(r.kv_compression->budget, 256);
  EXPECT_EQ(r.kv_compression->sink_tokens, 2);
  EXPECT_EQ(r.kv_compression->window, 16);
  EXPECT_EQ(r.kv_compression->span, 5);
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": "hi", "kv_compression": {"policy": "h2o", "budget": 64}})")
                .kv_compression->span,
            runtime::KvCompressionConfig{}.span);
  EXPECT_FALSE(ok_of(R"({"model": "m", "prompt": "hi"})").kv_compression.has_value());
  EXPECT_EQ(ok_of(R"({"model": "m", "prompt": "hi", "kv_compression": {"policy": "none"}})").kv_compression->policy,
            runtime::KvCompressionPolicy::kNone);
  struct Case {
    const char* field;
    const char* param;
  };
  for (const Case& c : {Case{R"("kv_compression": 3)", "kv_compression"},
                        Case{R"("kv_compression": {"policy": "lru", "budget": 64})", "kv_compression.policy"},
                        Case{R"("kv_compression": {"policy": 7})", "kv_compression.policy"},
                        Case{R"("kv_compression": {"policy": "h2o", "budget": 20})", "kv_compression.budget"},
                        Case{R"("kv_compression": {"policy": "h2o", "budget": -1})", "kv_compression.budget"},
                        Case{R"("kv_compression": {"policy": "h2o", "budget": 64, "ratio": 2})",
                             "kv_compression.ratio"},
                        Case{R"("kv_compression": {"budget": 64})", "kv_compression.budget"},
                        Case{R"("kv_compression": {"policy": "snapkv", "budget": 64, "span": 257})",
                             "kv_compression.span"},
                        Case{R"("kv_compression": {"policy": "snapkv", "budget": 64, "span": -1})",
                             "kv_compression.span"}}) {
    const ApiError e = error_of(std::string(R"({"model": "m", "prompt": "hi", )") + c.field + "}");
    EXPECT_EQ(e.http_status, 400) << c.field;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.field << ": " << e.message;
  }
}

}  // namespace
}  // namespace pagoda::server
