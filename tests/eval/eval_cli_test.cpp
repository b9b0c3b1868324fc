// `pagoda eval` as a user runs it: the JSON contract of the last stdout line, and clear errors
// (non-zero exit, message naming the problem) for bad input.

#include <array>
#include <cmath>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

const std::filesystem::path kBinary = std::filesystem::path(PAGODA_BINARY_DIR) / "pagoda";
const std::filesystem::path kModel = std::filesystem::path(PAGODA_SOURCE_DIR) / "models/pagoda-tiny";

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

RunResult run(const std::string& args) {
  RunResult result;
  const std::string command = kBinary.string() + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string last_line(const std::string& text) {
  std::string trimmed = text;
  while (!trimmed.empty() && trimmed.back() == '\n') trimmed.pop_back();
  const size_t pos = trimmed.rfind('\n');
  return pos == std::string::npos ? trimmed : trimmed.substr(pos + 1);
}

class EvalCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kBinary)) FAIL() << "no " << kBinary << " (build pagoda_cli)";
    if (!std::filesystem::exists(kModel / "model.safetensors")) FAIL() << "no bundled model";
  }
  std::string common() const {
    return "--model " + kModel.string() + " --text-file " + (kModel / "heldout.txt").string();
  }
};

TEST_F(EvalCliTest, PerplexityPrintsJsonLast) {
  const auto r = run("eval perplexity " + common() + " --max-tokens 300 --window 150 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(last_line(r.output), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.output;
  EXPECT_EQ(json["tokens"].get<int64_t>(), 2 * 149);
  EXPECT_EQ(json["windows"].get<int>(), 2);
  const double ppl = json["perplexity"].get<double>();
  EXPECT_GT(ppl, 5.0);
  EXPECT_LT(ppl, 500.0);
  EXPECT_NEAR(std::log(ppl), json["mean_nll"].get<double>(), 1e-9);
}

TEST_F(EvalCliTest, AgreementOfTheBaselineWithItselfIsExact) {
  const auto r = run("eval agreement " + common() +
                     " --max-tokens 120 --kv-dtype f32 --block-size 4 --baseline-block-size 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(last_line(r.output), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.output;
  EXPECT_EQ(json["top1_agreement"].get<double>(), 1.0);
  EXPECT_EQ(json["mean_kl"].get<double>(), 0.0);
  EXPECT_EQ(json["tokens"].get<int64_t>(), 119);
}

TEST_F(EvalCliTest, BadInputFailsWithAClearMessage) {
  auto r = run("eval perplexity " + common() + " --kv-dtype int9");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("int9"), std::string::npos) << r.output;

  r = run("eval perplexity --model " + kModel.string() + " --text-file /nonexistent/text.txt");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent/text.txt"), std::string::npos) << r.output;

  const auto empty = std::filesystem::temp_directory_path() / "pagoda_eval_empty.txt";
  std::ofstream(empty).close();
  r = run("eval perplexity --model " + kModel.string() + " --text-file " + empty.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("empty"), std::string::npos) << r.output;
  std::filesystem::remove(empty);

  r = run("eval perplexity " + common() + " --window 4096");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("max_position_embeddings"), std::string::npos) << r.output;

  r = run("eval agreement " + common() + " --max-tokens 64 --kv-dtype int8,int5/int4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("int5"), std::string::npos) << r.output;
}

TEST_F(EvalCliTest, QuantizedKvDtypesAndTheirSpellings) {
  auto r = run("eval perplexity " + common() + " --max-tokens 64 --kv-cache-dtype int4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = nlohmann::json::parse(last_line(r.output), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.output;
  EXPECT_EQ(json["kv_dtype"], "int4");

  r = run("eval perplexity " + common() + " --max-tokens 64 --kv-cache-dtype-k int8 --kv-cache-dtype-v int4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json = nlohmann::json::parse(last_line(r.output), nullptr, false);
  EXPECT_EQ(json["key_dtype"], "int8");
  EXPECT_EQ(json["value_dtype"], "int4");
  EXPECT_EQ(json["kv_dtype"], "int8/int4");

  // A sweep: one JSON line per variant, the baseline shared.
  r = run("eval agreement " + common() + " --max-tokens 100 --kv-dtype fp8,int8/int4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> lines;
  std::stringstream out(r.output);
  for (std::string line; std::getline(out, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) lines.push_back(j);
  }
  ASSERT_EQ(lines.size(), 2u) << r.output;
  EXPECT_EQ(lines[0]["kv_dtype"], "fp8");
  EXPECT_EQ(lines[1]["kv_dtype"], "int8/int4");
  EXPECT_EQ(lines[0]["baseline_perplexity"], lines[1]["baseline_perplexity"]);
  for (const auto& j : lines) {
    EXPECT_GT(j["top1_agreement"].get<double>(), 0.8);
    EXPECT_GT(j["mean_kl"].get<double>(), 0.0);
  }
}

// --quantization int8|int4|fp8 (CPU weights): the variant of `eval agreement` is the
// quantized model, the baseline the model as loaded; bad values, cuda and a
// checkpoint that declares its own quantization fail naming the flag.
TEST_F(EvalCliTest, WeightQuantizationFlag) {
  auto r = run("eval agreement " + common() + " --max-tokens 100 --kv-dtype f32 --quantization int8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = nlohmann::json::parse(last_line(r.output), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.output;
  EXPECT_GT(json["top1_agreement"].get<double>(), 0.95);
  EXPECT_GT(json["mean_kl"].get<double>(), 0.0);  // the weights really were quantized
  EXPECT_LT(std::abs(json["perplexity_change_percent"].get<double>()), 1.0);

  r = run("eval perplexity " + common() + " --max-tokens 64 --quantization int3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--quantization int3"), std::string::npos) << r.output;

  r = run("eval perplexity " + common() + " --max-tokens 64 --device cuda --quantization int4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--quantization int4"), std::string::npos) << r.output;

  // generate: a config.json that declares a quantization_config (an already-quantized checkpoint).
  const auto dir = std::filesystem::temp_directory_path() / ("pagoda_quant_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    auto config = nlohmann::json::parse(std::ifstream(kModel / "config.json"));
    config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
    std::ofstream(dir / "config.json") << config.dump();
  }
  r = run("generate --load-format random --config " + (dir / "config.json").string() +
          " --prompt-ids 1,2,3 --max-tokens 2 --quantization int8");
  std::filesystem::remove_all(dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--quantization int8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("already quantized"), std::string::npos) << r.output;

  // fp8: the quantized variant runs; an FP8 checkpoint loads as it is and refuses the flag.
  r = run("eval agreement " + common() + " --max-tokens 100 --kv-dtype f32 --quantization fp8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json = nlohmann::json::parse(last_line(r.output), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.output;
  EXPECT_GT(json["top1_agreement"].get<double>(), 0.9);
  EXPECT_GT(json["mean_kl"].get<double>(), 0.0);
  const auto fp8_fixture = std::filesystem::path(PAGODA_SOURCE_DIR) / "tests/fixtures/fp8/block_fp8";
  r = run("generate --model " + fp8_fixture.string() + " --prompt-ids 5,6,7 --max-tokens 3 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("block fp8, 32x32 block weight scales"), std::string::npos) << r.output;
  r = run("generate --model " + fp8_fixture.string() + " --prompt-ids 5,6,7 --max-tokens 3 --quantization fp8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--quantization fp8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("already quantized"), std::string::npos) << r.output;
}

TEST_F(EvalCliTest, RecallSweepPrintsOneJsonLinePerPolicyAndBudget) {
  const auto r = run("eval recall " + common() +
                     " --policies none,streaming,snapkv --budgets 64 --trials 1 --depths 40,100 --context 240"
                     " --list-words 4 --agreement-tokens 300 --window 150 --prefill-chunk 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u) << r.output;
  EXPECT_EQ(rows[0]["policy"], "none");
  EXPECT_EQ(rows[0]["top1_agreement"], 1.0);
  EXPECT_EQ(rows[0]["kv_tokens_held"], 240 + 64);
  for (const auto& row : rows) {
    EXPECT_GE(row["recall"].get<double>(), 0.0);
    EXPECT_LE(row["recall"].get<double>(), 1.0);
    EXPECT_EQ(row["recall_by_depth"].size(), 2u);
    EXPECT_GT(row["perplexity"].get<double>(), 1.0);
  }
  // Under a budget the sequence holds budget + one block, and the scores move off the baseline.
  EXPECT_EQ(rows[1]["kv_tokens_held"], 64 + 16);
  EXPECT_LT(rows[1]["top1_agreement"].get<double>(), 1.0);
}

// Left out, --context and --depths fit the model: its 2,048 positions less the
// list's room, lists over the back half (docs/MODEL.md's recall figure).
TEST_F(EvalCliTest, RecallDefaultsFitTheModelsContext) {
  const auto r = run("eval recall " + common() + " --policies none --trials 1 --list-words 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto row = nlohmann::json::parse(last_line(r.output), nullptr, false);
  ASSERT_FALSE(row.is_discarded()) << r.output;
  EXPECT_EQ(row["context"], 1980);
  EXPECT_EQ(row["depths"], nlohmann::json({1000, 1250, 1500, 1750}));
  EXPECT_EQ(row["recall_by_depth"].size(), 4u);
  EXPECT_EQ(row["kv_tokens_held"], 1980 + 64);
}

TEST_F(EvalCliTest, RecallDepthBeyondThePromptIsAnErrorWithoutATable) {
  const auto r = run("eval recall " + common() + " --policies none --trials 1 --depths 5000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("depth 5000 leaves no room"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("| policy |"), std::string::npos) << r.output;
}

TEST_F(EvalCliTest, TokenEvictionFlagsAreCheckedByName) {
  auto r = run("eval perplexity " + common() + " --max-tokens 100 --kv-compression snapkv --kv-budget 20");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--kv-budget 20 must exceed --kv-sink-tokens + --kv-window"), std::string::npos)
      << r.output;
  r = run("eval recall " + common() + " --policies lru --budgets 64");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--kv-compression 'lru'"), std::string::npos) << r.output;
}

}  // namespace
