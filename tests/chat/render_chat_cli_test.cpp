// `pagoda render-chat` end to end: the binary's stdout must be exactly the transformers
// render (no newline added), and bad input must exit non-zero with an error naming the problem.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string read_all(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

class RenderChatCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    binary_ = fs::path(PAGODA_BINARY_DIR) / "pagoda";
    if (!fs::exists(binary_)) FAIL() << binary_ << " is not built";
    dir_ = fs::temp_directory_path() / ("pagoda_render_chat_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  RunResult run(const std::string& args, const std::string& stdin_text) {
    std::ofstream(dir_ / "in.json", std::ios::binary) << stdin_text;
    const std::string command = "'" + binary_.string() + "' render-chat " + args + " < '" + (dir_ / "in.json").string() +
                                "' > '" + (dir_ / "out").string() + "' 2> '" + (dir_ / "err").string() + "'";
    const int status = std::system(command.c_str());
    RunResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = read_all(dir_ / "out");
    result.err = read_all(dir_ / "err");
    return result;
  }

  static std::string model(const std::string& name) {
    return "--model '" + (fs::path(PAGODA_SOURCE_DIR) / "tests/fixtures/chat/models" / name).string() + "'";
  }

  fs::path binary_;
  fs::path dir_;
};

TEST_F(RenderChatCliTest, PrintsExactlyTheTransformersRender) {
  const fs::path expected_path = fs::path(PAGODA_SOURCE_DIR) / "tests/fixtures/chat/expected/chatml.json";
  if (!fs::exists(expected_path)) FAIL() << "no transformers fixtures yet";
  const auto expected = nlohmann::ordered_json::parse(read_all(expected_path));
  const auto conversations =
      nlohmann::ordered_json::parse(read_all(fs::path(PAGODA_SOURCE_DIR) / "tests/fixtures/chat/conversations.json"));
  int compared = 0;
  for (const auto& c : expected["cases"]) {
    if (c["conversation"] != "unicode" && c["conversation"] != "multi_turn") continue;
    for (const auto& conversation : conversations) {
      if (conversation["id"] != c["conversation"]) continue;
      const bool add_generation_prompt = c["add_generation_prompt"].get<bool>();
      const bool continue_final_message = c.value("continue_final_message", false);
      const RunResult result = run(model("chatml") + (add_generation_prompt ? " --add-generation-prompt" : "") +
                                       (continue_final_message ? " --continue-final-message" : ""),
                                   conversation["messages"].dump());
      EXPECT_EQ(result.exit_code, 0) << result.err;
      EXPECT_EQ(result.out, c["rendered"].get<std::string>());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 4);  // two conversations, each without and with the generation prompt
}

TEST_F(RenderChatCliTest, ContinuesTheFinalMessage) {
  const RunResult result = run(model("chatml") + " --continue-final-message",
                               R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}])");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I");

  const RunResult both = run(model("chatml") + " --continue-final-message --add-generation-prompt",
                             R"([{"role": "assistant", "content": "x"}])");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_THAT(both.err, HasSubstr("do not go together"));
}

TEST_F(RenderChatCliTest, PassesExtraVariables) {
  const RunResult result = run(model("llama3_2") + " --vars '{\"date_string\": \"01 Jan 2030\"}'",
                               R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("Today Date: 01 Jan 2030\n"));
}

TEST_F(RenderChatCliTest, BadInputFailsWithAClearMessage) {
  RunResult bad_json = run(model("chatml"), "[{\"role\": ");
  EXPECT_NE(bad_json.exit_code, 0);
  EXPECT_THAT(bad_json.err, HasSubstr("not valid JSON"));
  EXPECT_TRUE(bad_json.out.empty());

  RunResult not_array = run(model("chatml"), R"({"role": "user"})");
  EXPECT_NE(not_array.exit_code, 0);
  EXPECT_THAT(not_array.err, HasSubstr("messages must be a JSON array"));

  RunResult raised = run(model("mistral_v01"), R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  EXPECT_NE(raised.exit_code, 0);
  EXPECT_THAT(raised.err, HasSubstr("Conversation roles must alternate"));

  RunResult no_model = run("--model '" + (dir_ / "missing").string() + "'", "[]");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_THAT(no_model.err, HasSubstr("missing"));

  RunResult bad_vars = run(model("chatml") + " --vars '[1]'", "[]");
  EXPECT_NE(bad_vars.exit_code, 0);
  EXPECT_THAT(bad_vars.err, HasSubstr("--vars must be a JSON object"));
}

}  // namespace
