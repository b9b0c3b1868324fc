// The KV tiers below the host through the real `pagoda serve` on loopback:
//  - restart persistence: a second server process on the same --kv-offload-disk
//    hits what the first wrote (cached tokens, tier="disk"), same greedy text;
//  - corruption: bytes flipped in the middle of every block file, files
//    truncated, the index deleted -> the same greedy text, misses, no crash;
//  - tenant isolation on disk and in redis: tenant B never hits tenant A's blocks;
//  - one server per directory; an unwritable directory names itself;
//  - redis: two processes on one redis-server share prefixes; redis killed
//    mid-run -> requests still succeed; restarted -> used again; unreachable
//    at start -> a warning (an error with --kv-offload-redis-required).

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "../kvstore/redis_server.h"
#include "server_process.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kFixture = "tests/fixtures/models/llama_f32";

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

json completion(const ServerProcess& s, const std::vector<int32_t>& prompt, const std::string& api_key = "") {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(60, 0);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  const json body = {{"model", "llama_f32"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0},
                     {"ignore_eos", true}};
  auto res = c.Post("/v1/completions", headers, body.dump(), "application/json");
  if (!res || res->status != 200) {
    ADD_FAILURE() << (res ? res->body : "no response");
    return json();
  }
  return json::parse(res->body);
}

std::string metrics_of(const ServerProcess& s, const std::string& api_key = "") {
  httplib::Client c("127.0.0.1", s.port());
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  auto res = c.Get("/metrics", headers);
  return res && res->status == 200 ? res->body : std::string();
}

int cached(const json& out) { return out.is_null() ? -1 : out["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }
std::string text(const json& out) { return out.is_null() ? std::string("<none>") : out["choices"][0]["text"].get<std::string>(); }

class DiskTierE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/pagoda_disk_e2e_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    root_ = templ;
    dir_ = root_ / "kv";
    keys_ = root_ / "keys.json";
    std::ofstream(keys_) << R"({"keys": [{"key": "sk-alice", "tenant": "alice"}, {"key": "sk-bob", "tenant": "bob"},
                                        {"key": "sk-ops", "tenant": "ops", "admin": true}]})";
  }
  void TearDown() override { fs::remove_all(root_); }

  // 64 device blocks of 4 tokens, a 1 MiB host tier, the disk tier and/or redis.
  std::vector<std::string> flags(bool disk, const std::string& redis = "", bool keys = false) const {
    std::vector<std::string> f = {"--model", repo_path(kFixture), "--block-size", "4", "--kv-cache-memory",
                                  "131072", "--kv-offload-memory", "1MiB"};
    if (disk) f.insert(f.end(), {"--kv-offload-disk", dir_.string(), "--kv-offload-disk-size", "16MiB"});
    if (!redis.empty()) f.insert(f.end(), {"--kv-offload-redis", redis});
    if (keys) f.insert(f.end(), {"--api-keys", keys_.string()});
    return f;
  }
  std::vector<fs::path> block_files() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir_ / "blocks")) out.push_back(e.path());
    return out;
  }

  fs::path root_, dir_, keys_;
};

TEST_F(DiskTierE2eTest, ARestartedServerHitsWhatTheLastOneWrote) {
  const std::vector<int32_t> prompt = prompt_of(41, 1);
  std::string first_text;
  {
    ServerProcess a;
    std::string error;
    ASSERT_TRUE(a.start(flags(true), &error)) << error;
    const json first = completion(a, prompt);
    EXPECT_EQ(cached(first), 0);
    first_text = text(first);
    EXPECT_EQ(a.stop(), 0);
  }
  EXPECT_TRUE(fs::exists(dir_ / "index")) << "a clean stop writes the index";
  EXPECT_GE(block_files().size(), 10u);
  ServerProcess b;
  std::string error;
  ASSERT_TRUE(b.start(flags(true), &error)) << error;
  const json again = completion(b, prompt);
  EXPECT_EQ(cached(again), 40) << "the whole cacheable prefix came from disk";
  EXPECT_EQ(text(again), first_text) << "disk K/V gives the computed greedy output";
  const std::string m = metrics_of(b);
  EXPECT_EQ(metric(m, R"(pagoda_prefix_cache_hit_tokens_total{tier="disk"})"), 40) << m.substr(0, 2000);
  EXPECT_EQ(metric(m, R"(pagoda_prefix_cache_hit_tokens_total{tier="host"})"), 0);
  EXPECT_EQ(metric(m, R"(pagoda_kv_tier_read_blocks_total{tier="disk"})"), 10);
  EXPECT_EQ(metric(m, R"(pagoda_kv_tier_read_bytes_total{tier="disk"})"), 10 * 2048);
  EXPECT_EQ(metric(m, R"(pagoda_kv_tier_read_seconds_count{tier="disk"})"), 10);
  EXPECT_EQ(metric(m, R"(pagoda_kv_tier_corrupt_blocks_total{tier="disk"})"), 0);
  EXPECT_EQ(b.stop(), 0);
}

TEST_F(DiskTierE2eTest, CorruptTruncatedOrUnindexedFilesAreMissesNeverWrongOutput) {
  const std::vector<int32_t> prompt = prompt_of(41, 2);
  std::string expected;
  {
    ServerProcess a;
    std::string error;
    ASSERT_TRUE(a.start(flags(true), &error)) << error;
    expected = text(completion(a, prompt));
    EXPECT_EQ(a.stop(), 0);
  }
  // Flip a byte in the middle of every block file.
  for (const fs::path& f : block_files()) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(fs::file_size(f) / 2));
    const char c = static_cast<char>(io.get());
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
    io.put(static_cast<char>(c ^ 0x5a));
  }
  {
    ServerProcess b;
    std::string error;
    ASSERT_TRUE(b.start(flags(true), &error)) << error;
    const json out = completion(b, prompt);
    EXPECT_EQ(cached(out), 0) << "a corrupt block is never served";
    EXPECT_EQ(text(out), expected);
    EXPECT_GE(metric(metrics_of(b), R"(pagoda_kv_tier_corrupt_blocks_total{tier="disk"})"), 1);
    EXPECT_EQ(b.stop(), 0);  // it wrote the blocks again
  }
  // Truncate every file and delete the index.
  for (const fs::path& f : block_files()) fs::resize_file(f, fs::file_size(f) - 7);
  fs::remove(dir_ / "index");
  ServerProcess c;
  std::string error;
  ASSERT_TRUE(c.start(flags(true), &error)) << error;
  const json out = completion(c, prompt);
  EXPECT_EQ(cached(out), 0);
  EXPECT_EQ(text(out), expected);
  EXPECT_EQ(c.stop(), 0);
}

TEST_F(DiskTierE2eTest, TenantBNeverHitsTenantAsBlocksOnDisk) {
  const std::vector<int32_t> prompt = prompt_of(41, 3);
  {
    ServerProcess a;
    std::string error;
    ASSERT_TRUE(a.start(flags(true, "", true), &error)) << error;
    EXPECT_EQ(cached(completion(a, prompt, "sk-alice")), 0);
    EXPECT_EQ(a.stop(), 0);
  }
  const size_t alice_files = block_files().size();
  ServerProcess b;
  std::string error;
  ASSERT_TRUE(b.start(flags(true, "", true), &error)) << error;
  EXPECT_EQ(cached(completion(b, prompt, "sk-bob")), 0) << "bob's keys differ from alice's";
  EXPECT_EQ(metric(metrics_of(b, "sk-ops"), R"(pagoda_kv_tier_read_blocks_total{tier="disk"})"), 0);
  EXPECT_EQ(cached(completion(b, prompt, "sk-alice")), 40) << "alice's own blocks still hit";
  EXPECT_EQ(b.stop(), 0);
  EXPECT_EQ(block_files().size(), 2 * alice_files) << "the same prompt is stored once per tenant";
}

TEST_F(DiskTierE2eTest, OneServerPerDirectoryAndBadDirectoriesFailAtStart) {
  ServerProcess a;
  std::string error;
  ASSERT_TRUE(a.start(flags(true), &error)) << error;
  std::vector<std::string> args = {"serve", "--port", "0"};
  for (const std::string& f : flags(true)) args.push_back(f);
  CliResult r = run_pagoda(args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("in use by another pagoda process"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir_.string()), std::string::npos) << r.err;
  EXPECT_EQ(a.stop(), 0);

  std::ofstream(root_ / "file") << "x";
  const std::string unwritable = (root_ / "file" / "kv").string();
  r = run_pagoda({"serve", "--port", "0", "--model", repo_path(kFixture), "--kv-offload-memory", "1MiB",
                  "--kv-offload-disk", unwritable, "--kv-offload-disk-size", "1MiB"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(r.crashed());
  EXPECT_NE(r.err.find(unwritable), std::string::npos) << r.err;
  r = run_pagoda({"serve", "--port", "0", "--model", repo_path(kFixture), "--kv-offload-disk", dir_.string(),
                  "--kv-offload-disk-size", "1MiB"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("needs a host tier"), std::string::npos) << r.err;
}

TEST_F(DiskTierE2eTest, TwoServersShareRedisSurviveItsDeathAndUseItAgain) {
  if (!pagoda::testing::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
  pagoda::testing::RedisServer redis;
  ASSERT_TRUE(redis.start());
  ServerProcess a, b;
  std::string error;
  ASSERT_TRUE(a.start(flags(false, redis.url(), true), &error)) << error;
  ASSERT_TRUE(b.start(flags(false, redis.url(), true), &error)) << error;
  const std::vector<int32_t> prompt = prompt_of(41, 4);
  const json first = completion(a, prompt, "sk-alice");
  EXPECT_EQ(cached(first), 0);
  // a's writer thread stores the blocks; b, a fresh process, hits them.
  json shared;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (metric(metrics_of(a, "sk-ops"), R"(pagoda_kv_tier_written_blocks_total{tier="redis"})") >= 10) break;
  }
  EXPECT_EQ(cached(completion(b, prompt, "sk-bob")), 0) << "another tenant never hits alice's blocks";
  shared = completion(b, prompt, "sk-alice");
  EXPECT_EQ(cached(shared), 40);
  EXPECT_EQ(text(shared), text(first));
  EXPECT_EQ(metric(metrics_of(b, "sk-ops"), R"(pagoda_prefix_cache_hit_tokens_total{tier="redis"})"), 40);

  // Redis dies: requests still succeed (misses), bounded in time.
  const int port = redis.port();
  redis.stop();
  const std::vector<int32_t> other = prompt_of(41, 5);
  const json during = completion(b, other, "sk-alice");
  EXPECT_EQ(cached(during), 0);
  EXPECT_EQ(metric(metrics_of(b, "sk-ops"), R"(pagoda_kv_tier_up{tier="redis"})"), 0);
  // Back (empty): after the reconnect interval it is written and read again.
  ASSERT_TRUE(redis.start(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  const std::vector<int32_t> later = prompt_of(41, 6);
  const json computed = completion(a, later, "sk-alice");
  json reused;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (metric(metrics_of(a, "sk-ops"), R"(pagoda_kv_tier_written_blocks_total{tier="redis"})") >= 20) break;
  }
  reused = completion(b, later, "sk-alice");
  EXPECT_EQ(cached(reused), 40);
  EXPECT_EQ(text(reused), text(computed));
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
}

TEST_F(DiskTierE2eTest, UnreachableRedisIsAWarningOrWithRequiredAnError) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(pagoda::testing::free_loopback_port());
  std::vector<std::string> args = {"serve", "--port", "0"};
  for (const std::string& f : flags(false, url)) args.push_back(f);
  args.push_back("--kv-offload-redis-required");
  const CliResult r = run_pagoda(args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(r.crashed());
  EXPECT_NE(r.err.find("127.0.0.1"), std::string::npos) << r.err;
  ServerProcess s;
  std::string error;
  ASSERT_TRUE(s.start(flags(false, url), &error)) << error;  // serves without the tier
  EXPECT_EQ(cached(completion(s, prompt_of(41, 7))), 0);
  EXPECT_EQ(s.stop(), 0);
}

}  // namespace
}  // namespace pagoda::e2e
