// The official `openai` npm package (v6) against the real `pagoda serve`:
// completions (token ids on a fixture; text on the bundled model), chat,
// streaming with include_usage, seeds, n > 1, errors as the SDK sees them;
// structured outputs: tools with tool_choice required / named (whole and
// streamed) and response_format json_schema / json_object.
// The package is installed once into .cache/node/ by install_openai_client.sh.

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "server_process.h"

namespace pagoda::e2e {
namespace {

bool ensure_client(std::string* why) {
  const std::string script = repo_path("tests/e2e/install_openai_client.sh");
  if (std::system(script.c_str()) != 0) {
    *why = "npm install openai@6 failed: run tests/e2e/install_openai_client.sh (scripts/fetch-test-data.sh does)";
    return false;
  }
  return true;
}

int run_node(int port, const std::string& model, const std::string& mode, const std::string& key) {
  const std::string cmd = "PAGODA_NODE_DIR=" + repo_path(".cache/node") + " PAGODA_API_KEY=" + key + " node " +
                          repo_path("tests/e2e/openai_client_check.mjs") + " http://127.0.0.1:" +
                          std::to_string(port) + "/v1 " + model + " " + mode;
  int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(OpenAiClientTest, CompletionsWithTokenIdsOnAFixture) {
  std::string why;
  // A missing client is a failure, not a skip: CI must not pass without the real client.
  if (!ensure_client(&why)) FAIL() << why;
  ServerProcess server;
  ASSERT_TRUE(server.start({"--model", repo_path("tests/fixtures/models/qwen2_tied_bf16")}, &why)) << why;
  EXPECT_EQ(run_node(server.port(), "qwen2_tied_bf16", "token-ids", "none"), 0);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(OpenAiClientTest, CompletionsAndChatWithTextOnTheBundledModel) {
  const std::string model_dir = repo_path("models/pagoda-tiny");
  if (!std::filesystem::exists(model_dir + "/model.safetensors")) FAIL() << "models/pagoda-tiny not present";
  std::string why;
  // A missing client is a failure, not a skip: CI must not pass without the real client.
  if (!ensure_client(&why)) FAIL() << why;
  const std::string keys = std::string(PAGODA_BINARY_DIR) + "/e2e_openai_keys.json";
  std::ofstream(keys) << R"({"keys": [{"key": "sk-e2e", "tenant": "e2e"}]})";
  ServerProcess server;
  ASSERT_TRUE(server.start({"--model", model_dir, "--api-keys", keys}, &why)) << why;
  EXPECT_EQ(run_node(server.port(), "pagoda-tiny", "text", "sk-e2e"), 0);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(OpenAiClientTest, ToolsAndJsonSchemaThroughTheClientOnTheBundledModel) {
  const std::string model_dir = repo_path("models/pagoda-tiny");
  if (!std::filesystem::exists(model_dir + "/model.safetensors")) FAIL() << "models/pagoda-tiny not present";
  std::string why;
  if (!ensure_client(&why)) FAIL() << why;
  ServerProcess server;
  ASSERT_TRUE(server.start({"--model", model_dir}, &why)) << why;
  EXPECT_EQ(run_node(server.port(), "pagoda-tiny", "structured", "none"), 0);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace pagoda::e2e
