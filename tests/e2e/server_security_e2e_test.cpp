// The real `pagoda serve` on loopback, probed as a hostile tenant would: what
// /metrics, /v1/usage and Range headers reveal or amplify.

#include <fstream>
#include <future>
#include <thread>
#include <random>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "raw_http.h"
#include "server_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const char* kFixture = "tests/fixtures/models/llama_f32";

class ServerSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    // One file per process: ctest -j runs the suite's tests in parallel processes.
    const std::string keys = std::string(PAGODA_BINARY_DIR) + "/e2e_security_keys_" + std::to_string(getpid()) + ".json";
    std::ofstream(keys) << R"({"keys": [{"key": "sk-alice", "tenant": "alice"}, {"key": "sk-bob", "tenant": "bob"},
                                       {"key": "sk-ops", "tenant": "ops", "admin": true}]})";
    std::string error;
    ok_ = server_->start({"--model", repo_path(kFixture), "--block-size", "4", "--max-running", "8",
                          "--kv-cache-memory", "8000000", "--api-keys", keys},
                         &error);
    if (!ok_) std::fprintf(stderr, "%s\n", error.c_str());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "server did not start"; }

  static int port() { return server_->port(); }
  static Received get(const std::string& path, const std::string& key, const std::string& extra = "") {
    return exchange(port(), http_get(path, key, extra), 10s);
  }
  static json get_json(const std::string& path, const std::string& key) {
    const Received r = get(path, key);
    EXPECT_EQ(status_of(r.bytes), 200) << r.bytes.substr(0, 500);
    return json::parse(body_of(r.bytes), nullptr, false);
  }
  static json complete(const std::vector<int>& prompt, const std::string& key) {
    const json body = {{"model", "llama_f32"}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
    const Received r = exchange(port(), http_post("/v1/completions", key, body.dump()), 30s);
    EXPECT_EQ(status_of(r.bytes), 200) << r.bytes.substr(0, 500);
    return json::parse(body_of(r.bytes), nullptr, false);
  }
  // Every pagoda_prefix_cache_miss_tokens_total{reason=...} value.
  static std::map<std::string, double> miss_counters() {
    const std::string m = body_of(get("/metrics", "sk-ops").bytes);
    std::map<std::string, double> out;
    std::regex re(R"re(pagoda_prefix_cache_miss_tokens_total\{reason="([a-z_]+)"\} ([0-9.e+]+))re");
    for (std::sregex_iterator it(m.begin(), m.end(), re), end; it != end; ++it) out[(*it)[1]] = std::stod((*it)[2]);
    return out;
  }

  static inline ServerProcess* server_ = nullptr;
  static inline bool ok_ = false;
};

TEST_F(ServerSecurityTest, MetricsNeedAnAdminKeyWhenKeysAreOn) {
  EXPECT_EQ(status_of(get("/metrics", "").bytes), 401);
  EXPECT_EQ(status_of(get("/metrics", "sk-mallory").bytes), 401);
  const Received tenant = get("/metrics", "sk-alice");
  EXPECT_EQ(status_of(tenant.bytes), 403);
  const json error = json::parse(body_of(tenant.bytes), nullptr, false);
  ASSERT_TRUE(error.contains("error")) << tenant.bytes;
  EXPECT_EQ(error["error"]["code"], "admin_key_required");
  EXPECT_EQ(body_of(tenant.bytes).find("pagoda_"), std::string::npos) << "no figure leaks into the refusal";
  const Received admin = get("/metrics", "sk-ops");
  EXPECT_EQ(status_of(admin.bytes), 200);
  EXPECT_NE(admin.bytes.find("pagoda_kv_blocks_in_use"), std::string::npos);
  EXPECT_EQ(admin.bytes.find("other_namespace"), std::string::npos) << "the cross-tenant miss reason is gone";
}

TEST_F(ServerSecurityTest, RangeHeadersGetTheWholeAnswerOnEveryEndpoint) {
  std::string ranges = "Range: bytes=0-";
  for (int i = 0; i < 1500; ++i) ranges += ",0-";
  ranges += "\r\n";
  for (const auto& [path, key] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/models", "sk-alice"}, {"/metrics", "sk-ops"}, {"/health", ""}, {"/v1/usage", "sk-alice"}}) {
    const Received plain = get(path, key);
    const Received ranged = get(path, key, ranges);
    EXPECT_EQ(status_of(ranged.bytes), 200) << path << ": " << ranged.bytes.substr(0, 300);
    EXPECT_EQ(ranged.bytes.find("multipart/byteranges"), std::string::npos) << path;
    EXPECT_EQ(ranged.bytes.find("Content-Range"), std::string::npos) << path;
    // /metrics moves between the two calls; the others are equal.
    EXPECT_LT(body_of(ranged.bytes).size(), body_of(plain.bytes).size() + 512) << path << " amplified";
  }
  // A malformed Range is ignored too, never a 416.
  EXPECT_EQ(status_of(get("/v1/models", "sk-alice", "Range: bytes=zz-\r\n").bytes), 200);
}

TEST_F(ServerSecurityTest, UsageShowsTheCallersOwnFiguresOnly) {
  EXPECT_EQ(status_of(get("/v1/usage", "").bytes), 401);
  const json bob_before = get_json("/v1/usage", "sk-bob");
  const json alice_before = get_json("/v1/usage", "sk-alice");
  ASSERT_EQ(alice_before["tenant"], "alice");
  complete({9, 8, 7, 6, 5, 4, 3, 2, 1}, "sk-alice");
  const json alice_after = get_json("/v1/usage", "sk-alice");
  const json bob_after = get_json("/v1/usage", "sk-bob");
  EXPECT_EQ(bob_after, bob_before) << "another tenant's request changes nothing bob can see";
  EXPECT_EQ(alice_after["requests"]["accepted"].get<int>(), alice_before["requests"]["accepted"].get<int>() + 1);
  EXPECT_EQ(alice_after["tokens"]["prompt"].get<int>(), alice_before["tokens"]["prompt"].get<int>() + 9);
  EXPECT_EQ(alice_after["tokens"]["completion"].get<int>(), alice_before["tokens"]["completion"].get<int>() + 2);
  EXPECT_EQ(alice_after["prefix_cache"]["miss_tokens"].get<int>(),
            alice_before["prefix_cache"]["miss_tokens"].get<int>() + 9);
  EXPECT_GE(alice_after["kv_blocks"]["held"].get<int>(), 2) << "the prompt's full blocks stay cached";
}

TEST_F(ServerSecurityTest, AnotherTenantsCachedPromptLeavesNoTraceInMetricsOrUsage) {
  // The reported attack: tenant B sends a prompt and reads how the miss
  // counters moved; they moved by the tokens tenant A had cached for it. Now
  // B's request must move every counter (server-wide and B's own) exactly as
  // a prompt nobody ever sent does.
  std::mt19937 rng(7);
  auto fresh_prompt = [&] {
    std::vector<int> p(41);
    for (int& t : p) t = static_cast<int>(rng() % 250) + 1;
    return p;
  };
  for (int pair = 0; pair < 5; ++pair) {
    const auto secret = fresh_prompt();
    complete(secret, "sk-alice");
    const auto metrics0 = miss_counters();
    const json usage0 = get_json("/v1/usage", "sk-bob");
    const json got_secret = complete(secret, "sk-bob");
    const auto metrics1 = miss_counters();
    const json usage1 = get_json("/v1/usage", "sk-bob");
    complete(fresh_prompt(), "sk-bob");
    const auto metrics2 = miss_counters();
    const json usage2 = get_json("/v1/usage", "sk-bob");
    ASSERT_FALSE(metrics0.empty());
    EXPECT_EQ(got_secret["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    for (const auto& [reason, v0] : metrics0) {
      EXPECT_EQ(metrics1.at(reason) - v0, metrics2.at(reason) - metrics1.at(reason)) << "pair " << pair << " " << reason;
    }
    for (const auto& [reason, v] : usage0["prefix_cache"]["miss_tokens_by_reason"].items()) {
      EXPECT_EQ(usage1["prefix_cache"]["miss_tokens_by_reason"][reason].get<int>() - v.get<int>(),
                usage2["prefix_cache"]["miss_tokens_by_reason"][reason].get<int>() -
                    usage1["prefix_cache"]["miss_tokens_by_reason"][reason].get<int>())
          << "pair " << pair << " " << reason;
    }
  }
}

TEST_F(ServerSecurityTest, KvEventNumbersCountOnlyTheReadersOwnTenant) {
  // With global numbers, the gap between two of bob's events counted every
  // block alice cached meanwhile.
  const auto events = [&](const std::string& key, uint64_t since) {
    return get_json("/v1/kv/events?since=" + std::to_string(since), key);
  };
  const json start = events("sk-bob", 0);
  ASSERT_EQ(start["scope"], "tenant");
  const uint64_t bob_last = start["last"].get<uint64_t>();
  complete({11, 12, 13, 14, 15, 16, 17, 18, 19}, "sk-bob");
  const json first = events("sk-bob", bob_last);
  ASSERT_FALSE(first["events"].empty());
  const uint64_t after_first = first["last"].get<uint64_t>();
  for (int i = 0; i < 5; ++i) complete({21 + i, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33}, "sk-alice");
  complete({41, 42, 43, 44, 45, 46, 47, 48, 49}, "sk-bob");
  const json second = events("sk-bob", after_first);
  ASSERT_FALSE(second["events"].empty());
  EXPECT_EQ(second["events"][0]["seq"].get<uint64_t>(), after_first + 1)
      << "bob's numbering moved while only alice cached blocks: " << second.dump().substr(0, 400);
  for (const auto& e : second["events"]) EXPECT_LE(e["seq"].get<uint64_t>(), second["last"].get<uint64_t>());
  // The admin still reads global numbers.
  EXPECT_EQ(events("sk-ops", 0)["scope"], "all");
}

TEST_F(ServerSecurityTest, JsonEndpointsRefuseOtherMediaTypesWith415) {
  // What a web page may send to a local server without a CORS preflight.
  const std::string completion = R"({"model": "llama_f32", "prompt": [1, 2, 3], "max_tokens": 1})";
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b",
                                 ""}) {
    for (const std::string path : {"/v1/completions", "/v1/chat/completions", "/v1/cache/drop"}) {
      const Received r = exchange(port(), http_post(path, "sk-alice", completion, type), 10s);
      EXPECT_EQ(status_of(r.bytes), 415) << path << " with '" << type << "': " << r.bytes.substr(0, 300);
      const json error = json::parse(body_of(r.bytes), nullptr, false);
      ASSERT_TRUE(error.contains("error")) << r.bytes;
      EXPECT_EQ(error["error"]["code"], "unsupported_media_type");
      for (const char* f : {"message", "type", "param", "code"}) EXPECT_TRUE(error["error"].contains(f)) << f;
    }
  }
  // The drop-everything request a page would forge does nothing.
  complete({3, 1, 4, 1, 5, 9, 2, 6, 5}, "sk-alice");
  const int held = get_json("/v1/usage", "sk-alice")["kv_blocks"]["cached"].get<int>();
  ASSERT_GT(held, 0);
  EXPECT_EQ(status_of(exchange(port(), http_post("/v1/cache/drop", "sk-alice", R"({"all": true})", "text/plain"), 10s)
                          .bytes),
            415);
  EXPECT_EQ(get_json("/v1/usage", "sk-alice")["kv_blocks"]["cached"].get<int>(), held);
}

TEST_F(ServerSecurityTest, CacheDropRefusesOutOfVocabularyIds) {
  for (const char* prompt : {"[1, 99999]", "[-1]", "[256]"}) {
    const Received r =
        exchange(port(), http_post("/v1/cache/drop", "sk-alice", std::string(R"({"prompt": )") + prompt + "}"), 10s);
    EXPECT_EQ(status_of(r.bytes), 400) << prompt << ": " << r.bytes.substr(0, 300);
    const json error = json::parse(body_of(r.bytes), nullptr, false);
    ASSERT_TRUE(error.contains("error"));
    EXPECT_EQ(error["error"]["param"], "prompt");
  }
  EXPECT_EQ(status_of(exchange(port(), http_post("/v1/cache/drop", "sk-alice", R"({"prompt": [255, 0]})"), 10s).bytes),
            200);
}

TEST_F(ServerSecurityTest, CostlyRequestsAreRefusedBeforeAnyWork) {
  // n x max_tokens x (1 + logprobs) = 16 x 400 x 21, over the default cap.
  const json costly = {{"model", "llama_f32"}, {"prompt", {1, 2}}, {"n", 16}, {"max_tokens", 400}, {"logprobs", 20}};
  const Received r = exchange(port(), http_post("/v1/completions", "sk-bob", costly.dump()), 10s);
  EXPECT_EQ(status_of(r.bytes), 400) << r.bytes.substr(0, 300);
  const json error = json::parse(body_of(r.bytes), nullptr, false);
  ASSERT_TRUE(error.contains("error"));
  EXPECT_EQ(error["error"]["code"], "request_too_costly");
  EXPECT_EQ(error["error"]["param"], "max_tokens");
  EXPECT_EQ(get_json("/v1/usage", "sk-bob")["requests"]["refused"]["request_cost"].get<int>() >= 1, true);
  json cheaper = costly;
  cheaper["n"] = 2;
  cheaper["max_tokens"] = 4;
  EXPECT_EQ(status_of(exchange(port(), http_post("/v1/completions", "sk-bob", cheaper.dump()), 30s).bytes), 200);
}

TEST_F(ServerSecurityTest, AHugeChunkedUploadIsRefusedAtTheBodyLimit) {
  // The old front read chunked bodies whole (a 200 MB body became 100M tokens).
  const int fd = connect_loopback(port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-alice\r\n"
                           "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "10000\r\n" + std::string(0x10000, ' ') + "\r\n";
  size_t sent = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (sent < (64u << 20) && send_all(fd, chunk)) sent += chunk.size();
  const Received r = receive(fd, 5s, 1);
  close(fd);
  EXPECT_EQ(status_of(r.bytes), 413) << r.bytes.substr(0, 300);
  EXPECT_LT(sent, 32u << 20) << "the server kept reading far past its 8 MiB limit";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

class ServerQuotaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    const std::string keys = std::string(PAGODA_BINARY_DIR) + "/e2e_quota_keys_" + std::to_string(getpid()) + ".json";
    std::ofstream(keys) << R"({"keys": [
        {"key": "sk-one", "tenant": "one", "limits": {"max_requests_in_flight": 1}},
        {"key": "sk-budget", "tenant": "budget", "limits": {"tokens_per_minute": 300}},
        {"key": "sk-small", "tenant": "small", "limits": {"max_kv_blocks": 8}},
        {"key": "sk-free", "tenant": "free"},
        {"key": "sk-ops", "tenant": "ops", "admin": true}]})";
    std::string error;
    ok_ = server_->start({"--model", repo_path(kFixture), "--block-size", "4", "--api-keys", keys}, &error);
    if (!ok_) std::fprintf(stderr, "%s\n", error.c_str());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "server did not start"; }
  static Received post(const std::string& key, const json& body) {
    return exchange(server_->port(), http_post("/v1/completions", key, body.dump()), 30s);
  }
  static json body_json(const Received& r) { return json::parse(body_of(r.bytes), nullptr, false); }

  static inline ServerProcess* server_ = nullptr;
  static inline bool ok_ = false;
};

TEST_F(ServerQuotaTest, RequestsInFlightPerTenantGet429WithRetryAfter) {
  const json req = {{"model", "llama_f32"}, {"prompt", {1, 2, 3}}, {"max_tokens", 60}, {"ignore_eos", true}};
  std::vector<std::future<Received>> calls;
  for (int i = 0; i < 10; ++i) calls.push_back(std::async(std::launch::async, [&] { return post("sk-one", req); }));
  // Another tenant at the same time is not affected.
  std::vector<std::future<Received>> others;
  for (int i = 0; i < 3; ++i) others.push_back(std::async(std::launch::async, [&] { return post("sk-free", req); }));
  int ok = 0, refused = 0;
  for (auto& c : calls) {
    const Received r = c.get();
    if (status_of(r.bytes) == 200) ++ok;
    if (status_of(r.bytes) == 429) {
      ++refused;
      EXPECT_NE(r.bytes.find("Retry-After: "), std::string::npos);
      EXPECT_EQ(body_json(r)["error"]["code"], "tenant_queue_full");
    }
  }
  for (auto& c : others) EXPECT_EQ(status_of(c.get().bytes), 200);
  EXPECT_EQ(ok + refused, 10);
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1) << "ten requests at once against a cap of one";
  const json usage = body_json(exchange(server_->port(), http_get("/v1/usage", "sk-one"), 10s));
  EXPECT_EQ(usage["requests"]["refused"]["tenant_queue_full"].get<int>(), refused);
  EXPECT_EQ(usage["limits"]["max_requests_in_flight"], 1);
}

TEST_F(ServerQuotaTest, TokensPerMinuteAreBudgetedWith429AndWhenToRetry) {
  // 3 + 200 of 300 tokens; what is left (about 100) does not cover 3 + 150.
  json req = {{"model", "llama_f32"}, {"prompt", {1, 2, 3}}, {"max_tokens", 200}, {"ignore_eos", true}};
  EXPECT_EQ(status_of(post("sk-budget", req).bytes), 200);
  req["max_tokens"] = 150;
  const Received r = post("sk-budget", req);
  EXPECT_EQ(status_of(r.bytes), 429) << r.bytes.substr(0, 400);
  EXPECT_EQ(body_json(r)["error"]["code"], "tokens_per_minute");
  const size_t at = r.bytes.find("Retry-After: ");
  ASSERT_NE(at, std::string::npos);
  const int retry = std::atoi(r.bytes.c_str() + at + 13);
  EXPECT_GE(retry, 5);
  EXPECT_LE(retry, 12) << "about 53 tokens short at 5 tokens a second";
  // More than a whole minute's budget can never pass: 400, not 429.
  req["max_tokens"] = 400;
  const Received never = post("sk-budget", req);
  EXPECT_EQ(status_of(never.bytes), 400);
  EXPECT_EQ(body_json(never)["error"]["code"], "tenant_quota_exceeded");
  // The admin sees per-tenant counters.
  const std::string metrics = body_of(exchange(server_->port(), http_get("/metrics", "sk-ops"), 10s).bytes);
  EXPECT_NE(metrics.find("pagoda_tenant_requests_total{tenant=\"budget\",outcome=\"refused_tokens_per_minute\"} 2"),
            std::string::npos)
      << metrics.substr(metrics.find("pagoda_tenant"), 1500);
}

TEST_F(ServerQuotaTest, ARequestBiggerThanItsTenantsKvCapIsRefused) {
  // 8 blocks of 4 tokens: prompt 3 + max_tokens 30 needs 9.
  json req = {{"model", "llama_f32"}, {"prompt", {1, 2, 3}}, {"max_tokens", 30}};
  const Received r = post("sk-small", req);
  EXPECT_EQ(status_of(r.bytes), 400) << r.bytes.substr(0, 400);
  EXPECT_EQ(body_json(r)["error"]["code"], "tenant_kv_limit");
  req["max_tokens"] = 20;
  EXPECT_EQ(status_of(post("sk-small", req).bytes), 200);
  const json usage = body_json(exchange(server_->port(), http_get("/v1/usage", "sk-small"), 10s));
  EXPECT_EQ(usage["kv_blocks"]["limit"], 8) << "the KV manager holds the cap";
  EXPECT_LE(usage["kv_blocks"]["held"].get<int>(), 8);
}

TEST(ServerShutdownSecurityTest, SigtermHonoursTheGraceWithDrippingClientsConnected) {
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.start({"--model", repo_path(kFixture), "--shutdown-grace", "1"}, &error)) << error;
  // Fifty clients dripping their headers and one streaming a long generation.
  std::vector<int> drippers;
  for (int i = 0; i < 50; ++i) {
    drippers.push_back(connect_loopback(server.port()));
    send_all(drippers.back(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  }
  const int streaming = connect_loopback(server.port());
  const json body = {{"model", "llama_f32"}, {"prompt", {1, 2, 3}}, {"max_tokens", 500}, {"stream", true},
                     {"ignore_eos", true}};
  ASSERT_TRUE(send_all(streaming, http_post("/v1/completions", "", body.dump())));
  std::this_thread::sleep_for(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(SIGTERM), 0);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(elapsed, 4s) << "the old front took 39 s with one dripping client";
  const Received rest = receive(streaming, 2s);
  EXPECT_NE(rest.bytes.find("data: [DONE]"), std::string::npos) << "the stream is ended properly";
  for (int fd : drippers) close(fd);
  close(streaming);
}

}  // namespace
}  // namespace pagoda::e2e
