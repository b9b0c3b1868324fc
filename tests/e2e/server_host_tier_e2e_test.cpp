// The host tier through the real `pagoda serve` on loopback: a device pool of
// a few blocks and --kv-offload-memory. A prompt whose blocks were evicted
// from the device is served from the host tier (cached_tokens, the same
// greedy text, /metrics with tier="host"), and concurrent requests that
// overflow the device are preempted by swap and all finish.

#include <chrono>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;

const char* kFixture = "tests/fixtures/models/llama_f32";  // 512 bytes of f32 K/V per token

// The value of one sample line, e.g. name = `pagoda_kv_blocks_demoted_total` or
// `pagoda_prefix_cache_hit_tokens_total{tier="host"}`; -1 when absent.
double metric(const std::string& metrics, const std::string& name) {
  const std::string escaped = std::regex_replace(name, std::regex(R"([{}.\[\]()*+?^$|\\])"), R"(\$&)");
  std::smatch m;
  if (!std::regex_search(metrics, m, std::regex("(^|\\n)" + escaped + " ([0-9.e+-]+)"))) return -1;
  return std::stod(m[2]);
}

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 37 + salt * 101 + 11) % 256);
  return p;
}

class ServerHostTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    // 24 device blocks of 4 tokens (48 KiB), a host tier of 512 blocks (1 MiB).
    ASSERT_TRUE(server_.start({"--model", repo_path(kFixture), "--block-size", "4", "--kv-cache-memory", "49152",
                               "--kv-offload-memory", "1MiB", "--max-running", "8"},
                              &error))
        << error;
  }
  void TearDown() override { EXPECT_EQ(server_.stop(), 0); }

  json completion(const std::vector<int32_t>& prompt, int max_tokens) {
    httplib::Client c("127.0.0.1", server_.port());
    c.set_read_timeout(60, 0);
    const json body = {{"model", "llama_f32"}, {"prompt", prompt}, {"max_tokens", max_tokens},
                       {"temperature", 0},     {"ignore_eos", true}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (!res || res->status != 200) {
      ADD_FAILURE() << (res ? res->body : "no response");
      return json();
    }
    return json::parse(res->body);
  }
  std::string metrics() {
    httplib::Client c("127.0.0.1", server_.port());
    auto res = c.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  }

  ServerProcess server_;
};

TEST_F(ServerHostTierTest, AnEvictedPromptIsServedFromTheHostTier) {
  const std::vector<int32_t> prompt = prompt_of(41, 1);
  const json first = completion(prompt, 8);
  ASSERT_FALSE(first.is_null());
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // Three other conversations of 13 blocks each crowd the 24-block device pool.
  for (int i = 0; i < 3; ++i) ASSERT_FALSE(completion(prompt_of(41, 10 + i), 8).is_null());
  std::string m = metrics();
  EXPECT_GT(metric(m, "pagoda_kv_blocks_demoted_total"), 0) << "the first prompt's blocks went to the host tier";
  EXPECT_EQ(metric(m, R"(pagoda_prefix_cache_hit_tokens_total{tier="host"})"), 0);

  const json again = completion(prompt, 8);
  ASSERT_FALSE(again.is_null());
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 40) << "a host-tier hit is a cached token";
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]) << "a host hit gives the miss's greedy output";
  m = metrics();
  EXPECT_GE(metric(m, R"(pagoda_prefix_cache_hit_tokens_total{tier="host"})"), 40) << m.substr(0, 3000);
  EXPECT_GE(metric(m, R"(pagoda_prefix_cache_hit_tokens_total{tier="device"})"), 0);
  EXPECT_EQ(metric(m, R"(pagoda_kv_tier_blocks_capacity{tier="host"})"), 512);
  EXPECT_EQ(metric(m, R"(pagoda_kv_tier_blocks_capacity{tier="device"})"), 24);
  EXPECT_GT(metric(m, R"(pagoda_kv_tier_blocks_used{tier="host"})"), 0);
  EXPECT_GE(metric(m, R"(pagoda_kv_transfer_blocks_total{direction="host_to_device"})"), 10);
  EXPECT_GT(metric(m, R"(pagoda_kv_transfer_bytes_total{direction="device_to_host"})"), 0);
  EXPECT_GT(metric(m, R"(pagoda_kv_transfer_seconds_total{direction="host_to_device"})"), 0);
  EXPECT_EQ(metric(m, "pagoda_kv_transfer_failures_total"), 0);
}

TEST_F(ServerHostTierTest, ConcurrentRequestsOverflowingTheDeviceAreSwappedAndFinish) {
  // Six requests of 20 + 40 tokens need 90 blocks at once; the device holds 24.
  std::vector<std::future<json>> futures;
  for (int i = 0; i < 6; ++i)
    futures.push_back(std::async(std::launch::async, [this, i] { return completion(prompt_of(20, 40 + i), 40); }));
  std::vector<json> concurrent;
  for (auto& f : futures) concurrent.push_back(f.get());
  for (const json& out : concurrent) {
    ASSERT_FALSE(out.is_null());
    EXPECT_EQ(out["usage"]["completion_tokens"], 40);
  }
  // A reply can reach the client a moment before the engine frees its sequence: wait (bounded) for that.
  std::string m = metrics();
  for (int i = 0; i < 100 && metric(m, "pagoda_kv_blocks_in_use") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = metrics();
  }
  EXPECT_GT(metric(m, "pagoda_swap_preemptions_total"), 0) << "the test must exercise swapping";
  EXPECT_EQ(metric(m, "pagoda_swap_preemptions_total"), metric(m, "pagoda_preemptions_total"));
  EXPECT_EQ(metric(m, "pagoda_kv_swapped_sequences"), 0);
  EXPECT_EQ(metric(m, "pagoda_kv_blocks_in_use"), 0);
  EXPECT_EQ(metric(m, "pagoda_kv_host_blocks_swapped"), 0);
}

TEST(ServerHostTierFlagsTest, BadSizesAndSwapWithoutAHostTierFailAtStartNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--kv-offload-memory", "lots"}, "--kv-offload-memory lots"},
      {{"--kv-offload-memory", "-5"}, "--kv-offload-memory -5"},
      {{"--kv-offload-memory", "4096TiB"}, "more than this machine's"},
      {{"--kv-offload-memory", "100"}, "holds no KV block"},
      {{"--preemption-mode", "swap"}, "--preemption-mode swap needs a host tier"},
      {{"--preemption-mode", "later"}, "--preemption-mode later"},
  };
  for (const auto& [flags, expected] : cases) {
    std::vector<std::string> args = {"serve", "--model", repo_path(kFixture), "--port", "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    const CliResult r = run_pagoda(args);
    EXPECT_NE(r.exit_code, 0) << flags[1];
    EXPECT_FALSE(r.crashed()) << flags[1];
    EXPECT_NE(r.err.find(expected), std::string::npos) << flags[1] << ": " << r.err;
  }
}

}  // namespace
}  // namespace pagoda::e2e
