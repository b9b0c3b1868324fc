// DeepSeek checkpoints through the real `pagoda` binary on the CPU: generate
// reproduces transformers' greedy tokens through the engine, serve answers a
// completion and reports the MLA latent cache, and the KV settings an MLA
// model cannot take are refused by name. (--device cuda: tests/e2e/cli_gpu_test.cpp.)

#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli_process.h"
#include "server_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

const std::string kFixture = "tests/fixtures/models/deepseek_v3_bf16";

json expected() {
  std::ifstream in(source_path(kFixture + "/expected.json"));
  return json::parse(in);
}

std::string joined(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

TEST(DeepseekCliTest, GenerateReproducesTransformersGreedyTokens) {
  const json e = expected();
  const auto greedy = e["greedy_tokens"].get<std::vector<int32_t>>();
  const CliResult r = run_pagoda({"generate", "--model", source_path(kFixture), "--prompt-ids",
                                  joined(e["prompt_ids"].get<std::vector<int32_t>>()), "--max-tokens", "12",
                                  "--ignore-eos", "--kv-cache-dtype", "f32", "--block-size", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(last_line(r.out));
  EXPECT_EQ(out["tokens"].get<std::vector<int32_t>>(), std::vector<int32_t>(greedy.begin(), greedy.begin() + 12));
  EXPECT_THAT(r.err, HasSubstr("attention MLA (latent 32 + rope 8"));
  EXPECT_THAT(r.err, HasSubstr("KV cache: MLA, 40 values/token/layer (latent 32 + rope 8), f32 (latent)"));
  EXPECT_THAT(r.err, HasSubstr("KV cache per layer: MLA f32 160 B/token (MHA K/V in bf16: 320 B/token)"));
}

// An fp8 latent is one runtime/mla_fp8_layout.h record per token and layer: 32 codes, a scale and 8 bf16
// rope values, padded to 64 bytes (FlashMLA's 656 for 512 + 64), named in the start-up report.
TEST(DeepseekCliTest, StartupReportNamesTheFp8LatentRecordBytesPerLayer) {
  const json e = expected();
  const CliResult r = run_pagoda({"generate", "--model", source_path(kFixture), "--prompt-ids",
                                  joined(e["prompt_ids"].get<std::vector<int32_t>>()), "--max-tokens", "2",
                                  "--ignore-eos", "--kv-cache-dtype", "fp8", "--block-size", "64", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("fp8 (latent), 192 B/token"));
  EXPECT_THAT(r.err, HasSubstr("KV cache per layer: MLA fp8 64 B/token (MHA K/V in bf16: 320 B/token)"));
}

TEST(DeepseekCliTest, RefusesSplitKeyValueDtypes) {
  const json e = expected();
  const std::string ids = joined(e["prompt_ids"].get<std::vector<int32_t>>());
  const CliResult split = run_pagoda({"generate", "--model", source_path(kFixture), "--prompt-ids", ids,
                                      "--max-tokens", "2", "--kv-cache-dtype-k", "int8", "--kv-cache-dtype-v",
                                      "int4"});
  EXPECT_NE(split.exit_code, 0);
  EXPECT_FALSE(split.crashed());
  EXPECT_THAT(split.err, HasSubstr("MLA latent pool"));
}

TEST(DeepseekCliTest, ServeAnswersACompletionOnAnFp8LatentCache) {
  ServerProcess server;
  std::string why;
  ASSERT_TRUE(server.start({"--model", source_path(kFixture), "--max-num-seqs", "2", "--kv-cache-dtype", "fp8",
                            "--kv-cache-memory", "64KiB"},
                           &why))
      << why;
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(60, 0);
  const json body = {{"model", "deepseek_v3_bf16"}, {"prompt", expected()["prompt_ids"]}, {"max_tokens", 6},
                     {"temperature", 0}, {"ignore_eos", true}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 6) << res->body;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(DeepseekCliTest, ServeRandomWeightsForADeepseekConfig) {
  ServerProcess server;
  std::string why;
  ASSERT_TRUE(server.start({"--load-format", "random", "--model", source_path(kFixture + "/config.json"),
                            "--max-num-seqs", "2", "--kv-cache-memory", "64KiB"},
                           &why))
      << why;
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(60, 0);
  const json body = {{"model", "deepseek_v3_bf16"}, {"prompt", {1, 2, 3}}, {"max_tokens", 4}, {"temperature", 0},
                     {"ignore_eos", true}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 4) << res->body;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace pagoda::e2e
