// Runs the real `pagoda kvcalc` binary and checks its figures and errors.

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr together
};

Result run_pagoda(const std::string& args) {
  std::string cmd = std::string(PAGODA_BINARY_DIR) + "/pagoda " + args + " 2>&1";
  Result r{-1, ""};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
}

TEST(KvcalcCommandTest, ArticleExampleFromFlags) {
  Result r = run_pagoda("kvcalc --layers 80 --heads 64 --kv-heads 8 --head-dim 128 --tokens 4096 "
                        "--kv-dtype f16,int8 --memory 80GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["bytes_per_token"], 327680);
  EXPECT_EQ(j["rows"][0]["bytes_per_request"], 327680LL * 4096);
  EXPECT_EQ(j["rows"][0]["tokens_in_budget"], (80LL << 30) / 327680);  // 262,144 tokens
  EXPECT_EQ(j["rows"][0]["requests_in_budget"], 64);
  EXPECT_EQ(j["rows"][1]["bytes_per_token"], 2 * 80 * 8 * (128 + 4));
}

TEST(KvcalcCommandTest, ReadsAFixtureConfigAndCompares) {
  Result r = run_pagoda(std::string("kvcalc --model ") + PAGODA_SOURCE_DIR +
                        "/tests/fixtures/models/qwen3_sharded_f32 --compare --kv-dtype bf16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  // qwen3 fixture: 2 layers, 4 query heads, 2 KV heads, head_dim 32.
  std::map<std::string, int64_t> by_kind;
  for (auto& row : j["rows"]) by_kind[row["attention"]] = row["bytes_per_token"];
  EXPECT_EQ(by_kind["MHA"], 2 * 2 * 4 * 32 * 2);
  EXPECT_EQ(by_kind["GQA"], 2 * 2 * 2 * 32 * 2);
  EXPECT_EQ(by_kind["MQA"], 2 * 2 * 1 * 32 * 2);
  EXPECT_EQ(by_kind["MLA"], 2 * 576 * 2);
}

TEST(KvcalcCommandTest, TablePrintsEveryDtype) {
  Result r = run_pagoda("kvcalc --layers 32 --heads 32 --kv-heads 8 --head-dim 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* d : {"bf16", "fp8", "int8", "int4"}) EXPECT_NE(r.output.find(d), std::string::npos) << d;
  EXPECT_NE(r.output.find("131,072"), std::string::npos) << r.output;  // Llama-3-8B bf16 bytes/token
}

TEST(KvcalcCommandTest, BadInputGivesClearErrors) {
  Result no_shape = run_pagoda("kvcalc --layers 4");
  EXPECT_NE(no_shape.exit_code, 0);
  EXPECT_NE(no_shape.output.find("--kv-heads"), std::string::npos) << no_shape.output;
  Result bad_dtype = run_pagoda("kvcalc --layers 4 --kv-heads 2 --head-dim 8 --kv-dtype int3");
  EXPECT_NE(bad_dtype.exit_code, 0);
  EXPECT_NE(bad_dtype.output.find("int3"), std::string::npos);
  Result bad_memory = run_pagoda("kvcalc --layers 4 --kv-heads 2 --head-dim 8 --memory lots");
  EXPECT_NE(bad_memory.exit_code, 0);
  EXPECT_NE(bad_memory.output.find("lots"), std::string::npos);
  Result missing = run_pagoda("kvcalc --config /nonexistent/config.json");
  EXPECT_NE(missing.exit_code, 0);
}

}  // namespace

namespace {

TEST(KvcalcCommandTest, MlaModelShowsValuesPerTokenAndWhatMhaWouldNeed) {
  Result r = run_pagoda("kvcalc --layers 27 --heads 16 --kv-lora-rank 512 --qk-rope-dim 64 --head-dim 192 "
                        "--v-head-dim 128 --kv-dtype bf16,fp8 --memory 1GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  ASSERT_EQ(j["rows"].size(), 4u);  // MLA bf16, fp8; MHA bf16, fp8
  EXPECT_EQ(j["rows"][0]["attention"], "MLA");
  EXPECT_EQ(j["rows"][0]["values_per_token_per_layer"], 576);
  EXPECT_EQ(j["rows"][0]["bytes_per_token"], 31104);
  EXPECT_EQ(j["rows"][1]["bytes_per_token"], 27 * 656);  // FlashMLA's fp8 record
  EXPECT_EQ(j["rows"][2]["attention"], "MHA");
  EXPECT_EQ(j["rows"][2]["values_per_token_per_layer"], 16 * (192 + 128));
  EXPECT_EQ(j["rows"][2]["bytes_per_token"], 276480);
  EXPECT_NE(j["model"].get<std::string>().find("576 values per token per layer"), std::string::npos) << j["model"];
  EXPECT_NE(j["rows"][1]["startup_line"].get<std::string>().find("MLA, 576 values/token/layer"), std::string::npos);
}

TEST(KvcalcCommandTest, ReadsADeepseekFixture) {
  Result r = run_pagoda(std::string("kvcalc --model ") + PAGODA_SOURCE_DIR +
                        "/tests/fixtures/models/deepseek_v2_lite_bf16 --kv-dtype bf16,fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 3 layers, latent 32 + rope 8; MHA: 4 heads x (24 K + 16 V).
  EXPECT_NE(r.output.find("MLA latent 32 + rope 8 = 40 values per token per layer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MHA with 4 heads x (24 K + 16 V) would cache 160"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("240"), std::string::npos) << r.output;  // 3 x 40 x 2 bytes
  // fp8: 3 x one 64-byte record (32 codes, a scale, 8 bf16 rope values = 52, padded to 16).
  EXPECT_NE(r.output.find(" 192 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("656 B for 512 + 64"), std::string::npos) << r.output;
}

}  // namespace
