// The HTTP server in process, over a scripted model runner that can fail or go
// slowly: a non-streamed completion whose model fails mid-generation is a 500
// with the OpenAI error object (never a 200 with an error body), a streamed one
// keeps its 200 and carries an error event before [DONE], and a client that
// leaves a non-streamed request gets its generation aborted.

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/engine/engine.h"
#include "pagoda/runtime/model_runner.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/chat/chat_template.h"
#include "pagoda/server/chat_prompt.h"
#include "pagoda/server/openai_server.h"
#include "../e2e/raw_http.h"

namespace pagoda::server {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::chrono_literals;
using Prompts = std::vector<std::vector<int32_t>>;  // a batched completions prompt

// Next token = last token + 1 (mod vocab), so outputs are predictable; every
// execute() may sleep, and from call `fail_from_call` on it fails.
class ScriptedRunner final : public runtime::ModelRunner {
 public:
  static constexpr int32_t kVocab = 64;

  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch, std::span<const runtime::RowSampling>) override {
    const int64_t call = ++calls;
    const int64_t fail_from = fail_from_call.load();
    if (fail_from > 0 && call >= fail_from) return internal_error("injected model failure at step {}", call);
    if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms.load()));
    std::vector<float> logits;
    for (const SequenceSlice& s : batch.sequences) {
      const int32_t rows = s.logits_for_all_new_tokens ? s.num_new_tokens : (s.logits_for_last_token ? 1 : 0);
      for (int32_t r = 0; r < rows; ++r) {
        const int32_t index = s.logits_for_all_new_tokens ? s.token_offset + r : s.token_offset + s.num_new_tokens - 1;
        std::vector<float> row(kVocab, 0.0f);
        row[(batch.token_ids[index] + 1) % kVocab] = 10.0f;
        logits.insert(logits.end(), row.begin(), row.end());
      }
    }
    runtime::StepResult out;
    out.host_logits = std::move(logits);
    out.tokens.assign(static_cast<size_t>(batch.num_logit_rows()), 0);
    out.logprobs.assign(static_cast<size_t>(batch.num_logit_rows()), 0.0f);
    return out;
  }
  Status copy_blocks(std::span<const runtime::BlockCopy>) override { return ok_status(); }
  // The engine here is built directly (not through Engine::create): the pool's
  // size is the test's KV manager's, whatever this says.
  const KvPoolShape& kv_geometry() const override { return geometry_; }
  int32_t vocab_size() const override { return kVocab; }
  int32_t max_context_length() const override { return 4096; }
  std::vector<int32_t> eos_token_ids() const override { return {}; }

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> fail_from_call{0};
  std::atomic<int32_t> step_delay_ms{0};

 private:
  KvPoolShape geometry_{};
};

class ServerTest : public ::testing::Test {
 protected:
  // No tokenizer: token-id prompts only.
  virtual TextCodec make_codec() { return {}; }
  virtual engine::EngineConfig make_engine_config() { return {}; }
  // Runs on the KV cache before the engine starts (the engine thread owns it after).
  virtual void prepare_kv(kv::KvCacheManager&) {}
  virtual int32_t kv_num_blocks() const { return 512; }  // of 16 tokens
  virtual void configure(ServerConfig&) {}

  void SetUp() override {
    kv::KvCacheConfig kc;
    kc.num_blocks = kv_num_blocks();
    kc.block_size = 16;
    kv_ = std::move(kv::KvCacheManager::create(kc)).value();
    prepare_kv(*kv_);
    engine_ = std::make_unique<engine::Engine>(make_engine_config(), runner_, *kv_);
    engine_->start();
    ServerConfig config;
    config.model_name = "scripted";
    config.port = 0;
    config.http_threads = 8;
    configure(config);
    server_ = std::make_unique<OpenAiServer>(config, *engine_, make_codec());
    auto port = server_->bind();
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    port_ = *port;
    serve_thread_ = std::thread([this] { (void)server_->serve(); });
  }
  void TearDown() override {
    server_->stop();
    if (serve_thread_.joinable()) serve_thread_.join();
    engine_->shutdown(0ms);
  }
  httplib::Result post(const json& body, const char* path = "/v1/completions") {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(30, 0);
    return client.Post(path, body.dump(), "application/json");
  }
  // The text of a completion that must succeed (model "scripted", greedy, merged into `body`).
  std::string completion_text(json body) {
    body["model"] = "scripted";
    body["temperature"] = 0;
    auto res = post(body);
    EXPECT_TRUE(res);
    if (!res) return {};
    EXPECT_EQ(res->status, 200) << res->body;
    return res->status == 200 ? json::parse(res->body)["choices"][0]["text"].get<std::string>() : std::string();
  }
  // POSTs `body` to /v1/completions on a plain socket the test closes itself (a client that
  // leaves); -1 when it could not be sent.
  int post_on_raw_socket(const std::string& body) const {
    const int fd = e2e::connect_loopback(port_);
    if (fd < 0) return -1;
    if (!e2e::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body)) {
      close(fd);
      return -1;
    }
    return fd;
  }
  // Nothing running and no KV block held.
  bool idle() {
    const engine::EngineStats s = engine_->stats();
    return s.num_running == 0 && s.kv.blocks_in_use == 0;
  }
  // Waits up to 5 s for `condition`.
  template <typename Condition>
  bool eventually(Condition condition) {
    for (int i = 0; i < 500; ++i) {
      if (condition()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return condition();
  }

  ScriptedRunner runner_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<OpenAiServer> server_;
  std::thread serve_thread_;
  int port_ = 0;
};

TEST_F(ServerTest, NonStreamedCompletionSucceedsWith200) {
  auto res = post({{"model", "scripted"}, {"prompt", {5, 6}}, {"max_tokens", 4}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
}

// The scripted model's next token is the last one + 1: the rules steer its greedy decode.
TEST_F(ServerTest, LogitRulesSteerTheCompletion) {
  auto tokens_of = [&](json body) {
    body["prompt"] = {1, 2};
    return completion_text(body);
  };
  EXPECT_EQ(tokens_of({{"max_tokens", 3}}), " <3> <4> <5>");
  // The model's pick (3) banned: every other logit is 0, and the greedy tie goes to the lowest id.
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"logit_bias", {{"3", -100}}}}), " <0> <1> <2>");
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"logit_bias", {{"9", 11}}}}), " <9> <9> <9>");
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"allowed_token_ids", {7, 4, 5}}}), " <4> <5> <4>");
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"stop", " <4>"}}), " <3>");
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"stop", " <4>"}, {"include_stop_str_in_output", true}}), " <3> <4>");
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"stop_token_ids", {4}}}), " <3>");
  EXPECT_EQ(tokens_of({{"max_tokens", 3}, {"stop_token_ids", {4}}, {"include_stop_str_in_output", true}}), " <3> <4>");
  // truncate_prompt_tokens: the prompt's last tokens (the scripted model reads only the last one).
  auto truncated = post({{"model", "scripted"}, {"prompt", {9, 8, 7, 1, 2}}, {"max_tokens", 2},
                         {"truncate_prompt_tokens", 2}});
  ASSERT_TRUE(truncated);
  EXPECT_EQ(truncated->status, 200) << truncated->body;
  EXPECT_EQ(json::parse(truncated->body)["usage"]["prompt_tokens"], 2);
  // min_tokens above the default max_tokens (16 on completions) raises it.
  auto res = post({{"model", "scripted"}, {"prompt", {1, 2}}, {"min_tokens", 20}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 20);
}

// skip_special_tokens reaches the sequence's text decoder (here every token is "special": its text is "<s>").
class SpecialTokensServerTest : public ServerTest {
 protected:
  class SpecialText final : public engine::TextDecoder {
   public:
    explicit SpecialText(bool skip) : skip_(skip) {}
    std::string append(int32_t) override { return skip_ ? "" : "<s>"; }
    std::string finish() override { return {}; }

   private:
    bool skip_;
  };
  engine::EngineConfig make_engine_config() override {
    engine::EngineConfig config;
    config.text_decoder_factory = [](std::span<const int32_t>, bool skip) {
      return std::make_unique<SpecialText>(skip);
    };
    return config;
  }
};

TEST_F(SpecialTokensServerTest, SkipSpecialTokensIsPerRequest) {
  EXPECT_EQ(completion_text({{"prompt", {1}}, {"max_tokens", 2}}), "");
  EXPECT_EQ(completion_text({{"prompt", {1}}, {"max_tokens", 2}, {"skip_special_tokens", true}}), "");
  EXPECT_EQ(completion_text({{"prompt", {1}}, {"max_tokens", 2}, {"skip_special_tokens", false}}), "<s><s>");
}

// vLLM's return_tokens_as_token_ids: logprobs name each token (and alternative) "token_id:<id>"; the text and
// its offsets stay the tokens' text.
TEST_F(ServerTest, ReturnTokensAsTokenIds) {
  auto res = post({{"model", "scripted"}, {"prompt", {5, 6, 8}}, {"max_tokens", 2}, {"temperature", 0},
                   {"echo", true}, {"logprobs", 1}, {"return_tokens_as_token_ids", true}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json choice = json::parse(res->body)["choices"][0];
  EXPECT_EQ(choice["text"], "<5><6><8> <9> <10>");
  const json& lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"token_id:5", "token_id:6", "token_id:8", "token_id:9", "token_id:10"}));
  EXPECT_TRUE(lp["top_logprobs"][2].contains("token_id:7")) << lp["top_logprobs"].dump();
  EXPECT_EQ(lp["text_offset"], json({0, 3, 6, 9, 12}));
  // false is the default: texts.
  auto plain = post({{"model", "scripted"}, {"prompt", {5}}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 0},
                     {"return_tokens_as_token_ids", false}});
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  EXPECT_EQ(json::parse(plain->body)["choices"][0]["logprobs"]["tokens"], json({"<6>"}));
}

// The scripted model gives the next token (last + 1) a logit of 10 and every other token 0.
TEST_F(ServerTest, EchoAndPromptLogprobsScoreThePrompt) {
  const double hit = 10.0 - std::log(std::exp(10.0) + 63.0), miss = -std::log(std::exp(10.0) + 63.0);
  auto whole = post({{"model", "scripted"}, {"prompt", {5, 6, 8}}, {"max_tokens", 2}, {"temperature", 0},
                     {"echo", true}, {"logprobs", 1}});
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json choice = json::parse(whole->body)["choices"][0];
  EXPECT_EQ(choice["text"], "<5><6><8> <9> <10>") << "the prompt as its tokens read (it came as ids), then the output";
  const json& lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"<5>", "<6>", "<8>", "<9>", "<10>"}));
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << "nothing predicts the first prompt token";
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_NEAR(lp["token_logprobs"][1].get<double>(), hit, 1e-5);
  EXPECT_NEAR(lp["token_logprobs"][2].get<double>(), miss, 1e-5) << "8 after 6: the model said 7";
  EXPECT_NEAR(lp["top_logprobs"][2]["<7>"].get<double>(), hit, 1e-5);
  EXPECT_NEAR(lp["token_logprobs"][3].get<double>(), hit, 1e-5);
  EXPECT_EQ(lp["text_offset"], json({0, 3, 6, 9, 12})) << "the output's offsets start after the echoed prompt";
  EXPECT_FALSE(choice.contains("prompt_logprobs"));

  // The stop token that ends a choice is its last logprobs entry, not in the text (vLLM; lm-eval reads the
  // prompt's scores as all but the last entry).
  auto stopped = post({{"model", "scripted"}, {"prompt", {5, 6}}, {"max_tokens", 4}, {"temperature", 0},
                       {"echo", true}, {"logprobs", 0}, {"stop_token_ids", {8}}});
  ASSERT_TRUE(stopped);
  ASSERT_EQ(stopped->status, 200) << stopped->body;
  const json s = json::parse(stopped->body)["choices"][0];
  EXPECT_EQ(s["text"], "<5><6> <7>");
  EXPECT_EQ(s["logprobs"]["tokens"], json({"<5>", "<6>", "<7>", "<8>"}));
  EXPECT_EQ(s["finish_reason"], "stop");

  // vLLM's prompt_logprobs: null, then {id: {logprob, rank, decoded_token}} with the top alternatives.
  auto scored = post({{"model", "scripted"}, {"prompt", {5, 6, 8}}, {"max_tokens", 1}, {"prompt_logprobs", 1}});
  ASSERT_TRUE(scored);
  ASSERT_EQ(scored->status, 200) << scored->body;
  const json body = json::parse(scored->body);
  const json& pl = body["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 3u) << pl.dump();
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_EQ(pl[1].size(), 1u) << "the prompt token is the top alternative";
  EXPECT_EQ(pl[1]["6"]["rank"], 1);
  EXPECT_EQ(pl[1]["6"]["decoded_token"], "<6>");
  EXPECT_NEAR(pl[1]["6"]["logprob"].get<double>(), hit, 1e-5);
  EXPECT_EQ(pl[2]["8"]["rank"], 64) << "63 tokens tie with it below the model's pick: vLLM ranks a tie below";
  EXPECT_NEAR(pl[2]["8"]["logprob"].get<double>(), miss, 1e-5);
  EXPECT_EQ(pl[2]["7"]["rank"], 1);
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null()) << "no logprobs were asked for";
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // max_tokens 0 with echo: the prompt alone (OpenAI's legacy scoring request).
  auto zero = post({{"model", "scripted"}, {"prompt", {5, 6}}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}});
  ASSERT_TRUE(zero);
  ASSERT_EQ(zero->status, 200) << zero->body;
  const json z = json::parse(zero->body);
  EXPECT_EQ(z["choices"][0]["text"], "<5><6>");
  EXPECT_EQ(z["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(z["choices"][0]["logprobs"]["tokens"], json({"<5>", "<6>"}));
  EXPECT_EQ(z["usage"]["completion_tokens"], 0);

  // Streamed echo: a choice's first chunk carries the prompt and its logprobs.
  auto streamed = post({{"model", "scripted"}, {"prompt", {5, 6, 8}}, {"max_tokens", 2}, {"temperature", 0},
                        {"echo", true}, {"logprobs", 0}, {"stream", true}});
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::string text;
  std::vector<json> tokens;
  for (size_t at = streamed->body.find("data: {"); at != std::string::npos;
       at = streamed->body.find("data: {", at + 1)) {
    const json chunk = json::parse(streamed->body.substr(at + 6, streamed->body.find("\n\n", at) - at - 6));
    text += chunk["choices"][0]["text"].get<std::string>();
    if (chunk["choices"][0]["logprobs"].is_object())
      for (const json& t : chunk["choices"][0]["logprobs"]["tokens"]) tokens.push_back(t);
  }
  EXPECT_EQ(text, "<5><6><8> <9> <10>");
  EXPECT_EQ(json(tokens), json({"<5>", "<6>", "<8>", "<9>", "<10>"}));
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {5}}, {"prompt_logprobs", 1}, {"stream", true}})->status, 400);
}

// A list of prompts is one engine request per prompt in one response: prompt p's choices are p x n .. p x n + n - 1,
// each the text that prompt alone gets, and the usage is the sum.
TEST_F(ServerTest, BatchedPromptsAnswerEachPromptInOrder) {
  const Prompts prompts = {{5, 6}, {10}, {20, 21, 22}};
  json body = {{"model", "scripted"}, {"prompt", prompts}, {"max_tokens", 3}, {"n", 2}, {"temperature", 0},
               {"echo", true}, {"logprobs", 0}};
  auto res = post(body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json batch = json::parse(res->body);
  ASSERT_EQ(batch["choices"].size(), 6u) << res->body;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    json one_body = body;
    one_body["prompt"] = prompts[p];
    auto one = post(one_body);
    ASSERT_TRUE(one);
    ASSERT_EQ(one->status, 200) << one->body;
    const json alone = json::parse(one->body);
    prompt_tokens += alone["usage"]["prompt_tokens"].get<int64_t>();
    completion_tokens += alone["usage"]["completion_tokens"].get<int64_t>();
    for (size_t j = 0; j < 2; ++j) {
      const json& choice = batch["choices"][p * 2 + j];
      EXPECT_EQ(choice["index"], p * 2 + j);
      EXPECT_EQ(choice["text"], alone["choices"][j]["text"]) << "prompt " << p << " choice " << j;
      EXPECT_EQ(choice["logprobs"]["tokens"], alone["choices"][j]["logprobs"]["tokens"]);
      EXPECT_EQ(choice["finish_reason"], "length");
    }
  }
  EXPECT_EQ(batch["choices"][2]["text"], "<10> <11> <12> <13>") << "echo: each choice starts with its own prompt";
  EXPECT_EQ(batch["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(batch["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(completion_tokens, 3 * 2 * 3);

  // Streamed: every chunk names its choice by the batch's numbering; the usage chunk is the sum.
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto streamed = post(body);
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::vector<std::string> texts(6);
  std::vector<std::string> finish(6);
  json usage;
  for (size_t at = streamed->body.find("data: {"); at != std::string::npos;
       at = streamed->body.find("data: {", at + 1)) {
    const json chunk = json::parse(streamed->body.substr(at + 6, streamed->body.find("\n\n", at) - at - 6));
    if (chunk["usage"].is_object()) usage = chunk["usage"];
    for (const json& c : chunk["choices"]) {
      const size_t i = c["index"].get<size_t>();
      ASSERT_LT(i, 6u) << chunk.dump();
      texts[i] += c["text"].get<std::string>();
      if (c["finish_reason"].is_string()) finish[i] = c["finish_reason"];
    }
  }
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(texts[i], batch["choices"][i]["text"]) << i;
    EXPECT_EQ(finish[i], "length") << i;
  }
  EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(usage["completion_tokens"], completion_tokens);
  EXPECT_EQ(streamed->body.rfind("data: [DONE]\n\n") + 14, streamed->body.size());
}

// A batch is admitted whole or not at all: one bad prompt refuses the request, naming it, before anything runs.
TEST_F(ServerTest, BatchedPromptWithABadPromptIsRefusedWhole) {
  auto res = post({{"model", "scripted"}, {"prompt", Prompts{{1, 2}, {3, ScriptedRunner::kVocab}}}, {"max_tokens", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["param"], "prompt");
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("prompt 1: "));
  const std::vector<int32_t> long_prompt(4000, 3);
  auto too_long = post({{"model", "scripted"}, {"prompt", Prompts{{1}, long_prompt}}, {"max_tokens", 200}});
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  EXPECT_EQ(json::parse(too_long->body)["error"]["code"], "context_length_exceeded");
  EXPECT_THAT(too_long->body, HasSubstr("prompt 1: "));
  EXPECT_EQ(engine_->stats().requests_submitted, 0) << "refused before any prompt was queued";
  // More prompts than the engine's queue holds could never be admitted together: a 400, not a 429.
  auto too_many = post({{"model", "scripted"}, {"prompt", Prompts(257, {1})}, {"max_tokens", 1}});
  ASSERT_TRUE(too_many);
  EXPECT_EQ(too_many->status, 400) << too_many->body;
  EXPECT_EQ(json::parse(too_many->body)["error"]["param"], "prompt");
}

// A batch whose prompt the engine refuses at submission (more than the whole KV cache) takes back the prompts
// already queued.
class SmallKvBatchTest : public ServerTest {
 protected:
  int32_t kv_num_blocks() const override { return 64; }  // 1,024 tokens
};

TEST_F(SmallKvBatchTest, ARefusedSubmissionAbortsThePromptsBeforeIt) {
  runner_.step_delay_ms = 5;  // prompt 0's 100 tokens would take half a second
  auto res = post({{"model", "scripted"}, {"prompt", Prompts{{1}, std::vector<int32_t>(1000, 3)}}, {"max_tokens", 100}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "context_length_exceeded");
  EXPECT_THAT(res->body, HasSubstr("prompt 1: "));
  EXPECT_TRUE(eventually([&] { return engine_->stats().requests_aborted == 1; }))
      << "prompt 0 went back when prompt 1 was refused";
  EXPECT_TRUE(eventually([&] { return idle(); }));
}

// A client that leaves a batch aborts every prompt of it.
TEST_F(ServerTest, ClientLeavingABatchAbortsEveryPrompt) {
  runner_.step_delay_ms = 5;
  const std::string body = json{{"model", "scripted"}, {"prompt", Prompts{{1}, {2, 3}, {4}}}, {"max_tokens", 4000},
                                {"ignore_eos", true}, {"stream", true}}
                               .dump();
  const int fd = post_on_raw_socket(body);
  ASSERT_GE(fd, 0);
  char buffer[4096];
  ASSERT_GT(recv(fd, buffer, sizeof(buffer), 0), 0) << "the stream started";
  ASSERT_TRUE(eventually([&] { return engine_->stats().num_running == 3; }));
  close(fd);
  EXPECT_TRUE(eventually([&] { return engine_->stats().requests_aborted == 3; }))
      << "aborted: " << engine_->stats().requests_aborted;
  EXPECT_TRUE(eventually([&] { return idle(); }));
  EXPECT_LT(runner_.calls.load(), 1000);
}

// One prompt's failure in a streamed batch: its error event once, the other prompts stopped, [DONE] last.
TEST_F(ServerTest, StreamedBatchFailureSendsOneErrorEventThenDone) {
  runner_.fail_from_call = 4;
  auto res = post({{"model", "scripted"}, {"prompt", Prompts{{1, 2}, {3}, {4, 5}}}, {"max_tokens", 50}, {"stream", true}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const std::string& text = res->body;
  size_t errors = 0;
  for (size_t at = text.find("data: {\"error\""); at != std::string::npos; at = text.find("data: {\"error\"", at + 1))
    ++errors;
  EXPECT_EQ(errors, 1u) << text;
  EXPECT_EQ(text.rfind("data: [DONE]\n\n") + 14, text.size());
  EXPECT_TRUE(eventually([&] { return idle(); }));
}

// With a first-token floor the deltas wait for the floor's time, then every one of them is sent (the reply
// does not end when the last delta is fetched but when it is delivered).
class FloorServerTest : public ServerTest {
 protected:
  void configure(ServerConfig& config) override { config.first_token_floor = std::chrono::milliseconds(300); }
};

TEST_F(FloorServerTest, HeldDeltasAreAllDelivered) {
  for (const json& prompt : {json(std::vector<int32_t>{1, 2}), json(Prompts{{1, 2}, {7}})}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto whole = post({{"model", "scripted"}, {"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}});
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
    const json body = json::parse(whole->body);
    EXPECT_EQ(body["choices"][0]["text"], " <3> <4> <5>") << whole->body;
    EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
    if (prompt[0].is_array()) {
      EXPECT_EQ(body["choices"][1]["text"], " <8> <9> <10>") << whole->body;
    }

    auto streamed = post({{"model", "scripted"}, {"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0},
                          {"stream", true}});
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200);
    std::map<int, std::string> texts;
    std::map<int, std::string> finish;
    for (size_t at = streamed->body.find("data: {"); at != std::string::npos;
         at = streamed->body.find("data: {", at + 1)) {
      const json chunk = json::parse(streamed->body.substr(at + 6, streamed->body.find("\n\n", at) - at - 6));
      for (const json& c : chunk["choices"]) {
        texts[c["index"].get<int>()] += c["text"].get<std::string>();
        if (c["finish_reason"].is_string()) finish[c["index"].get<int>()] = c["finish_reason"];
      }
    }
    EXPECT_EQ(texts[0], " <3> <4> <5>") << streamed->body;
    EXPECT_EQ(finish[0], "length") << streamed->body;
    if (prompt[0].is_array()) {
      EXPECT_EQ(texts[1], " <8> <9> <10>") << streamed->body;
    }
  }
}

// "priority" is vLLM's: only 0 unless the server runs --scheduling-policy priority.
TEST_F(ServerTest, PriorityNeedsThePriorityPolicy) {
  auto refused = post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", 3}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["param"], "priority");
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", 0}})->status, 200);
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", "high"}})->status, 400);
}

// With the priority policy and one running slot, a queued urgent request overtakes a queued lax one; a tenant
// may not ask more urgent than its min_priority.
class PriorityServerTest : public ServerTest {
 protected:
  engine::EngineConfig make_engine_config() override {
    engine::EngineConfig config;
    config.scheduler.max_running_sequences = 1;
    return config;
  }
  void configure(ServerConfig& config) override {
    config.priority_scheduling = true;
    config.default_tenant_limits.min_priority = -5;
  }
};

TEST_F(PriorityServerTest, AnUrgentRequestOvertakesTheQueue) {
  runner_.step_delay_ms = 5;
  std::mutex mu;
  std::vector<std::string> finished;
  auto run = [&](const std::string& name, int priority, int max_tokens) {
    auto res = post({{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                     {"priority", priority}});
    std::lock_guard<std::mutex> lock(mu);
    finished.push_back(res && res->status == 200 ? name : name + " failed: " + (res ? res->body : "no reply"));
  };
  std::thread blocker(run, "blocker", 0, 40);
  ASSERT_TRUE(eventually([&] { return engine_->stats().num_running == 1; }));
  std::thread lax(run, "lax", 5, 2);
  ASSERT_TRUE(eventually([&] { return engine_->stats().num_waiting == 1; }));
  std::thread urgent(run, "urgent", -5, 2);
  ASSERT_TRUE(eventually([&] { return engine_->stats().num_waiting == 2; }));
  blocker.join();
  lax.join();
  urgent.join();
  EXPECT_EQ(finished, (std::vector<std::string>{"blocker", "urgent", "lax"}));

  auto too_urgent = post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", -6}});
  ASSERT_TRUE(too_urgent);
  EXPECT_EQ(too_urgent->status, 403) << too_urgent->body;
  EXPECT_EQ(json::parse(too_urgent->body)["error"]["code"], "priority_not_allowed");
}

// A tenant whose min_priority is above 0: requests without "priority" run at that floor instead of being
// refused; with the FCFS policy the floor plays no part.
class PriorityFloorServerTest : public ServerTest {
 protected:
  void configure(ServerConfig& config) override {
    config.priority_scheduling = policy_on_;
    config.default_tenant_limits.min_priority = 3;
  }
  bool policy_on_ = true;
};

TEST_F(PriorityFloorServerTest, RequestsWithoutAPriorityRunAtTheTenantsFloor) {
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}})->status, 200);
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", 3}})->status, 200);
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", 2}})->status, 403);
}

class PriorityFloorFcfsServerTest : public PriorityFloorServerTest {
 protected:
  PriorityFloorFcfsServerTest() { policy_on_ = false; }
};

TEST_F(PriorityFloorFcfsServerTest, TheFloorPlaysNoPartWithoutThePolicy) {
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}})->status, 200);
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", 0}})->status, 200);
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 1}, {"priority", 3}})->status, 400);
}

// Each prompt of a batch counts against the tenant's requests in flight.
class InFlightCapServerTest : public ServerTest {
 protected:
  void configure(ServerConfig& config) override { config.default_tenant_limits.max_requests_in_flight = 2; }
};

TEST_F(InFlightCapServerTest, BatchPromptsCountAsRequests) {
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", Prompts{{1}, {2}}}, {"max_tokens", 2}})->status, 200);
  auto res = post({{"model", "scripted"}, {"prompt", Prompts{{1}, {2}, {3}}}, {"max_tokens", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "tenant_quota_exceeded");
  auto usage = httplib::Client("127.0.0.1", port_).Get("/v1/usage");
  ASSERT_TRUE(usage);
  EXPECT_EQ(json::parse(usage->body)["requests"]["in_flight"], 0) << usage->body;
}

// One prompt's failure fails the whole reply and stops the others; their KV blocks go back.
TEST_F(ServerTest, BatchedPromptsFailTogether) {
  runner_.fail_from_call = 4;
  auto res = post({{"model", "scripted"}, {"prompt", Prompts{{1, 2}, {3}, {4, 5}}}, {"max_tokens", 50}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500) << res->body;
  EXPECT_THAT(res->body, HasSubstr("injected model failure"));
  EXPECT_TRUE(eventually([&] { return idle(); }));
  runner_.fail_from_call = 0;
  auto again = post({{"model", "scripted"}, {"prompt", Prompts{{1, 2}, {3}}}, {"max_tokens", 2}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
}

// Scoring a prompt is capped like generating: prompt tokens x (1 + alternatives).
class CostCapServerTest : public ServerTest {
 protected:
  void configure(ServerConfig& config) override { config.max_request_cost = 10000; }
};

TEST_F(CostCapServerTest, PromptScoringOverTheRequestCostIs400) {
  std::vector<int32_t> prompt(1000, 1);
  auto res = post({{"model", "scripted"}, {"prompt", prompt}, {"max_tokens", 1}, {"prompt_logprobs", 20}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["param"], "prompt_logprobs");
  EXPECT_EQ(e["code"], "request_too_costly");
  EXPECT_EQ(post({{"model", "scripted"}, {"prompt", prompt}, {"max_tokens", 1}, {"prompt_logprobs", 1}})->status, 200);
  auto echo = post({{"model", "scripted"}, {"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 20}});
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->status, 400);
  EXPECT_EQ(json::parse(echo->body)["error"]["param"], "echo") << "the field the client sent";
}

// The cap holds for a batch as a whole: prompts each within it may not add up past it.
TEST_F(CostCapServerTest, BatchedPromptsAreCappedTogether) {
  const std::vector<int32_t> prompt(100, 1);
  auto each = post({{"model", "scripted"}, {"prompt", prompt}, {"max_tokens", 3500}, {"ignore_eos", true}});
  ASSERT_TRUE(each);
  EXPECT_EQ(each->status, 200) << "one prompt is within the cap";
  auto res = post({{"model", "scripted"}, {"prompt", Prompts{prompt, prompt, prompt}}, {"max_tokens", 3500}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "request_too_costly");
  EXPECT_EQ(e["param"], "prompt");
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("3 prompts"));
  EXPECT_EQ(engine_->stats().requests_submitted, 1);
}

TEST_F(ServerTest, NonStreamedModelFailureIs500WithTheErrorObject) {
  runner_.fail_from_call = 3;  // prefill and one decode succeed, then the model fails
  auto res = post({{"model", "scripted"}, {"prompt", {5, 6}}, {"max_tokens", 20}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 500) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const json body = json::parse(res->body);
  ASSERT_TRUE(body.contains("error")) << res->body;
  EXPECT_FALSE(body.contains("choices"));
  EXPECT_EQ(body["error"]["type"], "server_error");
  EXPECT_EQ(body["error"]["code"], "internal_error");
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("injected model failure"));
  // The server stays up: the next request (model healthy again) is served.
  runner_.fail_from_call = 0;
  auto again = post({{"model", "scripted"}, {"prompt", {1}}, {"max_tokens", 2}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
}

TEST_F(ServerTest, StreamedModelFailureKeeps200AndSendsAnErrorEventThenDone) {
  runner_.fail_from_call = 3;
  auto res = post({{"model", "scripted"}, {"prompt", {5, 6}}, {"max_tokens", 20}, {"stream", true}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  const std::string& text = res->body;
  EXPECT_THAT(text, HasSubstr("data: {\"error\":"));
  EXPECT_THAT(text, HasSubstr("injected model failure"));
  const size_t error_at = text.find("\"error\"");
  const size_t done_at = text.rfind("data: [DONE]\n\n");
  ASSERT_NE(done_at, std::string::npos);
  EXPECT_LT(error_at, done_at);
  EXPECT_EQ(done_at + std::string("data: [DONE]\n\n").size(), text.size());
  // Tokens generated before the failure were streamed first.
  EXPECT_LT(text.find("\"choices\""), error_at);
}

TEST_F(ServerTest, ClientLeavingANonStreamedRequestAbortsIt) {
  runner_.step_delay_ms = 5;  // 4000 tokens would take 20 s
  const std::string body =
      json{{"model", "scripted"}, {"prompt", {1, 2, 3}}, {"max_tokens", 4000}, {"ignore_eos", true}}.dump();
  const int fd = post_on_raw_socket(body);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(eventually([&] { return engine_->stats().num_running == 1; }));
  std::this_thread::sleep_for(150ms);  // well past one poll interval: the server has looked the socket up
  close(fd);
  EXPECT_TRUE(eventually([&] { return engine_->stats().requests_aborted == 1; }))
      << "the generation kept running after the client left";
  EXPECT_TRUE(eventually([&] { return server_->http_counters().client_disconnects == 1; }));
  EXPECT_LT(runner_.calls.load(), 1000);
}

TEST_F(ServerTest, NonStreamedRequestCutShortByShutdownIs503) {
  runner_.step_delay_ms = 5;
  int status = 0;
  std::string body;
  std::thread client([&] {
    auto res = post({{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 4000}, {"ignore_eos", true}});
    if (res) {
      status = res->status;
      body = res->body;
    }
  });
  const bool started = eventually([&] { return engine_->stats().num_running == 1; });
  engine_->shutdown(0ms);
  client.join();
  ASSERT_TRUE(started);
  EXPECT_EQ(status, 503) << body;
  EXPECT_EQ(json::parse(body)["error"]["code"], "unavailable") << body;
}

// What submit() refuses is a 400 naming the field, decided by the status code
// and by the server's own vocabulary checks, never by the engine's wording.
TEST_F(ServerTest, RefusedSubmissionsAre400NamingTheField) {
  struct Case {
    json body;
    std::string param;
    std::string code;
  };
  const std::vector<int32_t> long_prompt(4000, 3);  // + 200 > the 4096-token context
  for (const Case& c : std::vector<Case>{
           {{{"model", "scripted"}, {"prompt", long_prompt}, {"max_tokens", 200}}, "prompt", "context_length_exceeded"},
           {{{"model", "scripted"}, {"prompt", {1, ScriptedRunner::kVocab}}, {"max_tokens", 2}}, "prompt",
            "invalid_value"},
           {{{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 2}, {"stop_token_ids", {ScriptedRunner::kVocab}}},
            "stop_token_ids", "invalid_value"},
           {{{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 2},
             {"logit_bias", {{std::to_string(ScriptedRunner::kVocab), 1}}}},
            "logit_bias", "invalid_value"},
           {{{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 2},
             {"allowed_token_ids", {1, ScriptedRunner::kVocab}}},
            "allowed_token_ids", "invalid_value"},
           {{{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 2}, {"bad_words", {"x"}}}, "bad_words",
            "invalid_value"},  // no tokenizer to read the words with
           {{{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 2},
             {"allowed_token_ids", std::vector<int32_t>(ScriptedRunner::kVocab + 1, 1)}},
            "allowed_token_ids", "invalid_value"},
           {{{"model", "scripted"}, {"prompt", long_prompt}, {"min_tokens", 97}}, "min_tokens", "invalid_value"},
       }) {
    auto res = post(c.body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const json error = json::parse(res->body)["error"];
    EXPECT_EQ(error["param"], c.param) << res->body;
    EXPECT_EQ(error["code"], c.code) << res->body;
    EXPECT_EQ(error["type"], "invalid_request_error") << res->body;
  }
  EXPECT_EQ(engine_->stats().requests_submitted, 0) << "nothing reached the engine's queue";
}

// A KV cache smaller than the context: a request within the context that needs
// more than the whole cache is refused at submit() like an over-long one.
class SmallKvServerTest : public ServerTest {
 protected:
  int32_t kv_num_blocks() const override { return 64; }  // 1,024 tokens
};

TEST_F(SmallKvServerTest, RequestLongerThanTheWholeKvCacheIs400ContextLengthExceeded) {
  auto res = post({{"model", "scripted"}, {"prompt", std::vector<int32_t>(1000, 3)}, {"max_tokens", 100}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json error = json::parse(res->body)["error"];
  EXPECT_EQ(error["code"], "context_length_exceeded") << res->body;
  EXPECT_EQ(error["param"], "prompt") << res->body;
  EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("KV cache"));
}

// Most of the KV cache (500 of 512 blocks) is held by a sequence the engine does
// not know, so a 300-token prompt passes submit() (it fits the cache's size)
// but can never be placed: the engine fails it after admission with its
// capacity code, which the server maps without reading the message.
class KvHeldElsewhereServerTest : public ServerTest {
 protected:
  void prepare_kv(kv::KvCacheManager& kv) override {
    const std::vector<int32_t> tokens(500 * 16, 7);
    auto held = kv.allocate_sequence(/*seq=*/1'000'000, "elsewhere", tokens);
    ASSERT_TRUE(held.ok()) << held.status().to_string();
  }
  static json long_prompt() { return std::vector<int32_t>(300, 5); }
};

TEST_F(KvHeldElsewhereServerTest, NonStreamedRequestThatCanNeverFitIs503KvCacheCapacity) {
  auto res = post({{"model", "scripted"}, {"prompt", long_prompt()}, {"max_tokens", 4}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 503) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["error"]["type"], "server_error");
  EXPECT_EQ(body["error"]["code"], "kv_cache_capacity");
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("300 tokens"));
  // Stats are published at the end of the engine step; the answer may come first.
  EXPECT_TRUE(eventually([&] { return engine_->stats().requests_failed == 1; }));
  // A request that fits the 12 blocks left is served as usual.
  auto small = post({{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 2}});
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;
}

TEST_F(KvHeldElsewhereServerTest, StreamedRequestThatCanNeverFitSendsTheCapacityErrorEventThenDone) {
  auto res = post({{"model", "scripted"}, {"prompt", long_prompt()}, {"max_tokens", 4}, {"stream", true}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  const std::string& text = res->body;
  const size_t error_at = text.find("data: {\"error\":");
  ASSERT_NE(error_at, std::string::npos) << text;
  const json event = json::parse(text.substr(error_at + 6, text.find("\n\n", error_at) - error_at - 6));
  EXPECT_EQ(event["error"]["code"], "kv_cache_capacity") << text;
  EXPECT_EQ(text.rfind("data: [DONE]\n\n") + std::string("data: [DONE]\n\n").size(), text.size()) << text;
}

TEST_F(ServerTest, StreamedRequestCutShortByShutdownSendsAnUnavailableErrorEventThenDone) {
  runner_.step_delay_ms = 5;
  std::string text;
  std::thread client([&] {
    auto res = post({{"model", "scripted"}, {"prompt", {1, 2}}, {"max_tokens", 4000}, {"ignore_eos", true},
                     {"stream", true}});
    if (res) text = res->body;
  });
  const bool started = eventually([&] { return engine_->stats().num_running == 1; });
  engine_->shutdown(0ms);
  client.join();
  ASSERT_TRUE(started);
  const size_t error_at = text.find("data: {\"error\":");
  ASSERT_NE(error_at, std::string::npos) << text;
  const json event = json::parse(text.substr(error_at + 6, text.find("\n\n", error_at) - error_at - 6));
  EXPECT_EQ(event["error"]["code"], "unavailable") << text;
  EXPECT_LT(error_at, text.rfind("data: [DONE]\n\n"));
}

// A chat server over a real chat template; "tokens" are the prompt's bytes (mod
// the vocabulary), so usage.prompt_tokens is the rendered prompt's length.
class ChatServerTest : public ServerTest {
 protected:
  virtual std::filesystem::path template_dir() const {
    return std::filesystem::path(PAGODA_SOURCE_DIR) / ".cache/npm/qwen3/package/models";
  }
  TextCodec make_codec() override {
    TextCodec codec;
    codec.encode = [](std::string_view text, bool) {
      std::vector<int32_t> ids;
      for (unsigned char c : text) ids.push_back(c % ScriptedRunner::kVocab);
      return ids;
    };
    auto chat = chat::ChatTemplate::load_from_model_dir(template_dir());
    EXPECT_TRUE(chat.ok()) << chat.status().to_string() << " (run scripts/fetch-test-data.sh)";
    if (chat.ok()) codec.render_chat = make_chat_renderer(std::move(*chat));
    return codec;
  }
};

// vLLM's /tokenize and /detokenize: the served model's tokenizer and chat template (here one token per byte, mod 64).
TEST_F(ChatServerTest, TokenizeAndDetokenize) {
  auto text = post({{"model", "scripted"}, {"prompt", "abc"}, {"return_token_strs", true}}, "/tokenize");
  ASSERT_TRUE(text);
  ASSERT_EQ(text->status, 200) << text->body;
  const json t = json::parse(text->body);
  EXPECT_EQ(t["tokens"], json({'a' % 64, 'b' % 64, 'c' % 64}));
  EXPECT_EQ(t["count"], 3);
  EXPECT_EQ(t["max_model_len"], 4096);
  EXPECT_EQ(t["token_strs"], json({"<33>", "<34>", "<35>"}));
  // A chat: the tokens /v1/chat/completions runs.
  const json messages = {{{"role", "user"}, {"content", "hello there"}}};
  auto chat = post({{"model", "scripted"}, {"messages", messages}}, "/tokenize");
  auto completion = post({{"model", "scripted"}, {"messages", messages}, {"max_tokens", 1}}, "/v1/chat/completions");
  ASSERT_TRUE(chat && completion);
  ASSERT_EQ(chat->status, 200) << chat->body;
  ASSERT_EQ(completion->status, 200) << completion->body;
  EXPECT_EQ(json::parse(chat->body)["count"], json::parse(completion->body)["usage"]["prompt_tokens"]);
  EXPECT_TRUE(json::parse(chat->body)["token_strs"].is_null());

  auto back = post({{"model", "scripted"}, {"tokens", {5, 6}}}, "/detokenize");
  ASSERT_TRUE(back);
  ASSERT_EQ(back->status, 200) << back->body;
  EXPECT_EQ(json::parse(back->body)["prompt"], "<5><6>");

  struct Case {
    json body;
    const char* path;
    std::string param;
  };
  for (const Case& c : std::vector<Case>{
           {{{"model", "other"}, {"prompt", "x"}}, "/tokenize", "model"},
           {{{"model", "scripted"}}, "/tokenize", "prompt"},
           {{{"model", "scripted"}, {"prompt", 5}}, "/tokenize", "prompt"},
           {{{"model", "scripted"}, {"prompt", "x"}, {"messages", messages}}, "/tokenize", "prompt"},
           {{{"model", "scripted"}, {"messages", messages}, {"add_generation_prompt", 0}}, "/tokenize",
            "add_generation_prompt"},
           {{{"model", "scripted"}, {"messages", messages}, {"continue_final_message", true}}, "/tokenize",
            "continue_final_message"},
           {{{"model", "scripted"}, {"messages", {{{"role", "nobody"}, {"content", "x"}}}}}, "/tokenize",
            "messages[0].role"},
           {{{"model", "scripted"}, {"tokens", {1, ScriptedRunner::kVocab}}}, "/detokenize", "tokens"},
           {{{"model", "scripted"}, {"tokens", {-1}}}, "/detokenize", "tokens"},
           {{{"model", "scripted"}, {"tokens", "x"}}, "/detokenize", "tokens"},
           {{{"model", "scripted"}}, "/detokenize", "tokens"},
       }) {
    auto res = post(c.body, c.path);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << c.body.dump() << " -> " << res->body;
    EXPECT_EQ(json::parse(res->body)["error"]["param"], c.param) << c.body.dump();
  }
}

// A codec whose add_special_tokens puts a BOS (id 63) first, to see which prompts get one.
class BosChatServerTest : public ChatServerTest {
 protected:
  static constexpr int32_t kBos = ScriptedRunner::kVocab - 1;
  TextCodec make_codec() override {
    TextCodec codec = ChatServerTest::make_codec();
    codec.encode = [](std::string_view text, bool add_special_tokens) {
      std::vector<int32_t> ids;
      if (add_special_tokens) ids.push_back(kBos);
      for (unsigned char c : text) ids.push_back(c % ScriptedRunner::kVocab);
      return ids;
    };
    return codec;
  }
  // usage.prompt_tokens of a one-token completion.
  int64_t prompt_tokens(json body, const char* path) {
    body["model"] = "scripted";
    body["max_tokens"] = 1;
    auto res = post(body, path);
    if (!res || res->status != 200) {
      ADD_FAILURE() << body.dump() << " -> " << (res ? res->body : "no reply");
      return -1;
    }
    return json::parse(res->body)["usage"]["prompt_tokens"].get<int64_t>();
  }
};

// vLLM's add_special_tokens (completions default true, chat false), add_generation_prompt (default true) and
// continue_final_message: what the engine runs, and /tokenize agreeing with it.
TEST_F(BosChatServerTest, SpecialTokensGenerationPromptAndContinuedMessages) {
  EXPECT_EQ(prompt_tokens({{"prompt", "abc"}}, "/v1/completions"), 4);
  EXPECT_EQ(prompt_tokens({{"prompt", "abc"}, {"add_special_tokens", false}}, "/v1/completions"), 3);
  EXPECT_EQ(prompt_tokens({{"prompt", {"abc", "de"}}, {"add_special_tokens", false}}, "/v1/completions"), 5);

  const json messages = {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Hello, I"}}};
  const int64_t closed = prompt_tokens({{"messages", messages}, {"add_generation_prompt", false}}, "/v1/chat/completions");
  const int64_t opened = prompt_tokens({{"messages", messages}}, "/v1/chat/completions");
  const int64_t continued = prompt_tokens(
      {{"messages", messages}, {"add_generation_prompt", false}, {"continue_final_message", true}},
      "/v1/chat/completions");
  EXPECT_EQ(opened - closed, int64_t(std::string("<|im_start|>assistant\n").size()));
  EXPECT_EQ(closed - continued, int64_t(std::string("<|im_end|>\n").size())) << "the message goes on: no end of turn";
  EXPECT_EQ(prompt_tokens({{"messages", messages}, {"add_special_tokens", true}}, "/v1/chat/completions"), opened + 1);

  auto tokenized = post({{"model", "scripted"}, {"messages", messages}, {"add_generation_prompt", false},
                         {"continue_final_message", true}},
                        "/tokenize");
  ASSERT_TRUE(tokenized);
  ASSERT_EQ(tokenized->status, 200) << tokenized->body;
  const json ids = json::parse(tokenized->body)["tokens"];
  EXPECT_EQ(int64_t(ids.size()), continued);
  std::vector<int32_t> tail;
  for (char c : std::string("Hello, I")) tail.push_back(static_cast<unsigned char>(c) % ScriptedRunner::kVocab);
  ASSERT_GE(ids.size(), tail.size());
  EXPECT_EQ(std::vector<int32_t>(ids.end() - tail.size(), ids.end()), tail) << "the prompt ends with the message";

  // Qwen3's template rewrites a final message's <think> part, so the text is not there to continue: a 400.
  const json rewritten = {{{"role", "user"}, {"content", "hi"}},
                          {{"role", "assistant"}, {"content", "<think>abc</think>def"}}};
  auto refused = post({{"model", "scripted"}, {"max_tokens", 1}, {"add_generation_prompt", false},
                       {"continue_final_message", true}, {"messages", rewritten}},
                      "/v1/chat/completions");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["param"], "messages") << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("continue_final_message"));
}

// vLLM's chat echo: the reply's content starts with the final message's text when it is the assistant's (the
// whole message, with continue_final_message), streamed in the first chunk; a final user message echoes nothing.
TEST_F(ChatServerTest, EchoLeadsWithTheFinalAssistantMessage) {
  const json messages = {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Hello, I"}}};
  const json body = {{"model", "scripted"}, {"messages", messages}, {"max_tokens", 2}, {"temperature", 0},
                     {"add_generation_prompt", false}, {"continue_final_message", true}};
  auto plain = post(body, "/v1/chat/completions");
  json echo_body = body;
  echo_body["echo"] = true;
  auto echoed = post(echo_body, "/v1/chat/completions");
  ASSERT_TRUE(plain && echoed);
  ASSERT_EQ(plain->status, 200) << plain->body;
  ASSERT_EQ(echoed->status, 200) << echoed->body;
  const std::string continuation = json::parse(plain->body)["choices"][0]["message"]["content"];
  EXPECT_FALSE(continuation.empty());
  EXPECT_EQ(json::parse(echoed->body)["choices"][0]["message"]["content"], "Hello, I" + continuation);
  EXPECT_EQ(json::parse(echoed->body)["usage"]["prompt_tokens"], json::parse(plain->body)["usage"]["prompt_tokens"]);

  echo_body["stream"] = true;
  auto streamed = post(echo_body, "/v1/chat/completions");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::string content;
  bool first = true;
  for (size_t at = streamed->body.find("data: {"); at != std::string::npos;
       at = streamed->body.find("data: {", at + 1)) {
    const json chunk = json::parse(streamed->body.substr(at + 6, streamed->body.find("\n\n", at) - at - 6));
    if (chunk["choices"].empty()) continue;
    const std::string piece = chunk["choices"][0]["delta"].value("content", "");
    if (first) EXPECT_EQ(piece.rfind("Hello, I", 0), 0u) << "the first chunk leads with the echo: " << piece;
    first = false;
    content += piece;
  }
  EXPECT_EQ(content, "Hello, I" + continuation);

  json user_last = {{"model", "scripted"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2},
                    {"temperature", 0}};
  auto no_echo = post(user_last, "/v1/chat/completions");
  user_last["echo"] = true;
  auto user_echo = post(user_last, "/v1/chat/completions");
  ASSERT_TRUE(no_echo && user_echo);
  EXPECT_EQ(json::parse(user_echo->body)["choices"][0]["message"]["content"],
            json::parse(no_echo->body)["choices"][0]["message"]["content"]);
}

// Without a tokenizer, text cannot be tokenized: a 400 that says so; ids still read back.
TEST_F(ServerTest, TokenizeWithoutATokenizerIs400) {
  auto res = post({{"model", "scripted"}, {"prompt", "abc"}}, "/tokenize");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_THAT(res->body, HasSubstr("no tokenizer"));
  auto back = post({{"model", "scripted"}, {"tokens", {1, 2}}}, "/detokenize");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->status, 200) << back->body;
}

TEST_F(ChatServerTest, ToolsAndToolCallsReachTheTemplate) {
  const json messages = json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}])");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  auto with_tools = post({{"model", "scripted"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 1}},
                         "/v1/chat/completions");
  auto without = post({{"model", "scripted"}, {"messages", messages}, {"tools", tools}, {"tool_choice", "none"},
                       {"max_tokens", 1}},
                      "/v1/chat/completions");
  ASSERT_TRUE(with_tools && without);
  ASSERT_EQ(with_tools->status, 200) << with_tools->body;
  ASSERT_EQ(without->status, 200) << without->body;

  // What the template makes of the conversation in HF form (arguments as an
  // object, content "" beside tool calls), with and without the tools.
  auto chat = chat::ChatTemplate::load_from_model_dir(template_dir());
  ASSERT_TRUE(chat.ok());
  nlohmann::ordered_json hf_messages = nlohmann::ordered_json::parse(messages.dump());
  hf_messages[1]["content"] = "";
  hf_messages[1]["tool_calls"][0]["function"]["arguments"] = {{"city", "Paris"}};
  const nlohmann::ordered_json hf_tools = nlohmann::ordered_json::parse(tools.dump());
  auto expected_with = chat->render(hf_messages, true, nlohmann::ordered_json{{"tools", hf_tools}});
  auto expected_without = chat->render(hf_messages, true);
  ASSERT_TRUE(expected_with.ok() && expected_without.ok());
  ASSERT_THAT(*expected_with, HasSubstr("<tools>"));
  ASSERT_THAT(*expected_with, HasSubstr("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"));
  ASSERT_THAT(*expected_with, HasSubstr("<tool_response>\n21 C\n</tool_response>"));
  // One "token" per byte: the prompt that reached the engine has exactly that length.
  EXPECT_EQ(json::parse(with_tools->body)["usage"]["prompt_tokens"], expected_with->size());
  EXPECT_EQ(json::parse(without->body)["usage"]["prompt_tokens"], expected_without->size());
  EXPECT_NE(expected_with->size(), expected_without->size());
}

TEST_F(ChatServerTest, BadChatShapesAre400NamingTheFieldAndTheServerStaysUp) {
  struct Case {
    json body;
    std::string param;
  };
  const json user = {{"role", "user"}, {"content", "hi"}};
  for (const Case& c : std::vector<Case>{
           {{{"model", "scripted"}, {"messages", {user}}, {"tools", {{"type", "function"}}}}, "tools"},
           {{{"model", "scripted"}, {"messages", {user}}, {"tools", {{{"type", "function"}}}}}, "tools[0].function"},
           {{{"model", "scripted"}, {"messages", {{{"role", "user"}, {"content", 42}}}}}, "messages[0].content"},
           {{{"model", "scripted"}, {"messages", {{{"role", "robot"}, {"content", "x"}}}}}, "messages[0].role"},
           {{{"model", "scripted"}, {"messages", {user}}, {"tool_choice", "required"}}, "tool_choice"},
           {{{"model", "scripted"}, {"messages", {user}}, {"chat_template_kwargs", "think"}}, "chat_template_kwargs"},
       }) {
    auto res = post(c.body, "/v1/chat/completions");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << c.body.dump() << " -> " << res->body;
    EXPECT_EQ(json::parse(res->body)["error"]["param"], c.param) << c.body.dump();
  }
  auto ok = post({{"model", "scripted"}, {"messages", {user}}, {"max_tokens", 1}}, "/v1/chat/completions");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// bad_words through the server's tokenizer (here a prompt's bytes mod 64): after "a" (33) the scripted model
// writes 34 ('"') then 35 ('#'); the word "\"#" lets 34 through and bans 35 after it.
TEST_F(ChatServerTest, BadWordsAreTokenizedAndBanned) {
  auto text_of = [&](json body) {
    body["prompt"] = "a";
    body["max_tokens"] = 3;
    return completion_text(body);
  };
  EXPECT_EQ(text_of({}), " <34> <35> <36>");
  EXPECT_EQ(text_of({{"bad_words", {"  \"#"}}}), " <34> <0> <1>");
  EXPECT_EQ(text_of({{"bad_words", {"\""}}}), " <0> <1> <2>");
}

TEST_F(ChatServerTest, ChatOverTheContextLengthIs400NamingMessages) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  auto res = post({{"model", "scripted"}, {"messages", {user}}, {"max_tokens", 4096}}, "/v1/chat/completions");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json error = json::parse(res->body)["error"];
  EXPECT_EQ(error["code"], "context_length_exceeded") << res->body;
  EXPECT_EQ(error["param"], "messages") << res->body;
}

// The model "writes" a Hermes tool call: the first generated token decodes to
// the whole block (then nothing), as a Qwen model answering with a call would.
class ToolCallingServerTest : public ChatServerTest {
 protected:
  class ScriptedText final : public engine::TextDecoder {
   public:
    std::string append(int32_t) override {
      return std::exchange(text_, "");
    }
    std::string finish() override { return ""; }

   private:
    std::string text_ =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  };
  engine::EngineConfig make_engine_config() override {
    engine::EngineConfig config;
    config.text_decoder_factory = [](std::span<const int32_t>, bool) { return std::make_unique<ScriptedText>(); };
    return config;
  }
};

TEST_F(ToolCallingServerTest, ToolCallsComeBackStructuredWhenToolsWereGiven) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const json messages = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  auto res = post({{"model", "scripted"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 2}},
                  "/v1/chat/completions");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json message = json::parse(res->body)["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << message.dump();
  ASSERT_EQ(message["tool_calls"].size(), 1u) << message.dump();
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_TRUE(message["tool_calls"][0]["id"].is_string());

  // Without tools (or with tool_choice "none") the same text is plain content.
  auto plain = post({{"model", "scripted"}, {"messages", messages}, {"max_tokens", 2}}, "/v1/chat/completions");
  auto none = post({{"model", "scripted"}, {"messages", messages}, {"tools", tools}, {"tool_choice", "none"},
                    {"max_tokens", 2}},
                   "/v1/chat/completions");
  ASSERT_TRUE(plain && none);
  for (const auto* r : {&plain, &none}) {
    const json m = json::parse((*r)->body)["choices"][0]["message"];
    EXPECT_FALSE(m.contains("tool_calls")) << m.dump();
    EXPECT_THAT(m["content"].get<std::string>(), HasSubstr("<tool_call>"));
  }
}

// A template's own raise_exception is the client's fault: 400 with its message.
class StrictTemplateServerTest : public ChatServerTest {
 protected:
  std::filesystem::path template_dir() const override {
    return std::filesystem::path(PAGODA_SOURCE_DIR) / "tests/fixtures/chat/models/mistral_v01";
  }
};

TEST_F(StrictTemplateServerTest, TemplateRaiseIs400WithItsMessage) {
  auto res = post({{"model", "scripted"},
                   {"messages", {{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "u"}}}}},
                  "/v1/chat/completions");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["error"]["param"], "messages");
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("Conversation roles must alternate"));
}

}  // namespace
}  // namespace pagoda::server
