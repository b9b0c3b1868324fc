// Isolation inside a tenant against the real `pagoda serve` on loopback: users
// salted by X-Pagoda-User never hit each other's prefixes, a key without the
// right cannot salt, prefix hits come in whole share units only, and the
// first-token floor holds hits (and, in scope "all", misses) back.

#include <algorithm>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "raw_http.h"
#include "server_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const char* kFixture = "tests/fixtures/models/llama_f32";
constexpr int kFloorMs = 400;

std::string keys_file(const std::string& tag) {
  // One file per process: ctest -j runs the suite's tests in parallel processes.
  const std::string path =
      std::string(PAGODA_BINARY_DIR) + "/e2e_user_keys_" + tag + "_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << R"({"keys": [
      {"key": "sk-app", "tenant": "acme", "user_salt": true},
      {"key": "sk-strict", "tenant": "acme", "user_salt": "required"},
      {"key": "sk-plain", "tenant": "acme"},
      {"key": "sk-ops", "tenant": "ops", "admin": true},
      {"key": "sk-globex", "tenant": "globex"}]})";
  return path;
}

std::vector<std::string> server_args(const std::string& tag, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", repo_path(kFixture), "--block-size", "4", "--max-running", "8",
                                   "--kv-cache-memory", "8000000", "--api-keys", keys_file(tag)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string post(const std::string& path, const std::string& key, const json& body, const std::string& user) {
  std::string r = "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key +
                  "\r\nContent-Type: application/json\r\n";
  if (!user.empty()) r += "X-Pagoda-User: " + user + "\r\n";
  const std::string b = body.dump();
  return r + "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
}

struct Completion {
  int status = -1;
  json body;
  int cached_tokens = -1;
};

Completion complete(int port, const std::vector<int>& prompt, const std::string& key, const std::string& user) {
  const json body = {{"model", "llama_f32"}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
  const Received r = exchange(port, post("/v1/completions", key, body, user), 30s);
  Completion c;
  c.status = status_of(r.bytes);
  c.body = json::parse(body_of(r.bytes), nullptr, false);
  if (c.status == 200) c.cached_tokens = c.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  return c;
}

// Time from sending a streamed completion to its first data event.
std::chrono::milliseconds time_to_first_event(int port, const std::vector<int>& prompt, const std::string& key,
                                              const std::string& user) {
  const json body = {{"model", "llama_f32"}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0},
                     {"stream", true}};
  std::string got;
  const double ms = time_to_first_event_ms(port, post("/v1/completions", key, body, user), 20s, &got);
  EXPECT_EQ(status_of(got), 200) << got.substr(0, 300);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got.substr(0, 300);
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

std::vector<int> random_prompt(std::mt19937& rng, int n) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int& t : p) t = static_cast<int>(rng() % 250) + 3;
  return p;
}

// One server: share unit 8 tokens (2 blocks of 4), no floor.
class UserIsolationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    std::string error;
    ok_ = server_->start(server_args("unit", {"--prefix-share-min-tokens", "8"}), &error);
    if (!ok_) std::fprintf(stderr, "%s\n", error.c_str());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "server did not start"; }
  static int port() { return server_->port(); }
  static inline ServerProcess* server_ = nullptr;
  static inline bool ok_ = false;
};

TEST_F(UserIsolationTest, SaltedUsersOfOneTenantNeverHitEachOther) {
  std::mt19937 rng(11);
  for (int round = 0; round < 5; ++round) {
    const auto secret = random_prompt(rng, 41);  // 40 cacheable tokens: 5 whole units
    ASSERT_EQ(complete(port(), secret, "sk-app", "alice").cached_tokens, 0);
    ASSERT_EQ(complete(port(), secret, "sk-app", "alice").cached_tokens, 40) << "alice hits her own prefix";
    EXPECT_EQ(complete(port(), secret, "sk-app", "bob").cached_tokens, 0) << "bob never hits alice's";
    EXPECT_EQ(complete(port(), secret, "sk-strict", "mallory").cached_tokens, 0);
    EXPECT_EQ(complete(port(), secret, "sk-plain", "").cached_tokens, 0) << "nor does the tenant's unsalted namespace";
    EXPECT_EQ(complete(port(), secret, "sk-app", "").cached_tokens, 40)
        << "a salting key without the header is in the tenant's own namespace, as the plain key is";
    EXPECT_EQ(complete(port(), secret, "sk-app", "bob").cached_tokens, 40) << "bob hits his own repeat";
    EXPECT_EQ(complete(port(), secret, "sk-strict", "alice").cached_tokens, 40)
        << "the user's namespace is the tenant's and the user's, whichever salting key sends it";
  }
  // Each user's usage shows only that user's namespace.
  const Received mallory = exchange(port(), http_get("/v1/usage", "sk-app", "X-Pagoda-User: nobody-yet\r\n"), 10s);
  ASSERT_EQ(status_of(mallory.bytes), 200) << mallory.bytes.substr(0, 300);
  const json u = json::parse(body_of(mallory.bytes), nullptr, false);
  EXPECT_EQ(u["user"], "nobody-yet");
  EXPECT_EQ(u["prefix_cache"]["hit_tokens"].get<int>(), 0);
  EXPECT_EQ(u["kv_blocks"]["held"].get<int>(), 0);
}

TEST_F(UserIsolationTest, AKeyWithoutTheRightIsRefusedAndRequiredKeysNameTheirUser) {
  const std::vector<int> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  Completion refused = complete(port(), prompt, "sk-plain", "alice");
  EXPECT_EQ(refused.status, 403);
  EXPECT_EQ(refused.body["error"]["code"], "user_salt_not_allowed");
  EXPECT_EQ(refused.body["error"]["param"], "X-Pagoda-User");
  const Received usage = exchange(port(), http_get("/v1/usage", "sk-plain", "X-Pagoda-User: alice\r\n"), 10s);
  EXPECT_EQ(status_of(usage.bytes), 403);
  const Received drop = exchange(
      port(), post("/v1/cache/drop", "sk-plain", json{{"all", true}}, "alice"), 10s);
  EXPECT_EQ(status_of(drop.bytes), 403);
  Completion missing = complete(port(), prompt, "sk-strict", "");
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.body["error"]["code"], "user_required");
  Completion bad = complete(port(), prompt, "sk-app", "two words");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["param"], "X-Pagoda-User");
  EXPECT_EQ(complete(port(), prompt, "sk-plain", "").status, 200);
}

TEST_F(UserIsolationTest, PrefixHitsComeInWholeShareUnitsOnly) {
  std::mt19937 rng(23);
  const auto base = random_prompt(rng, 21);  // 5 full blocks cacheable: 20 tokens
  ASSERT_EQ(complete(port(), base, "sk-app", "unit").cached_tokens, 0);
  EXPECT_EQ(complete(port(), base, "sk-app", "unit").cached_tokens, 16) << "20 cached tokens, used as 2 units of 8";
  // Probes sharing k tokens with the cached prompt, then tokens never sent.
  for (const auto& [shared, expected] : std::vector<std::pair<int, int>>{{4, 0}, {7, 0}, {8, 8}, {12, 8}, {16, 16}, {19, 16}}) {
    auto probe = std::vector<int>(base.begin(), base.begin() + shared);
    const auto tail = random_prompt(rng, 9);
    probe.insert(probe.end(), tail.begin(), tail.end());
    EXPECT_EQ(complete(port(), probe, "sk-app", "unit").cached_tokens, expected) << shared << " tokens shared";
  }
}

// One KV cap per tenant, however many users it salts: 30 users of "acme"
// together stay within its 12 blocks, "ops"'s cached prompt survives them, and
// the users whose blocks were recycled leave the KV namespace table.
TEST(UserSaltKvCap, AllUsersOfATenantShareItsOneKvCap) {
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.start(server_args("cap", {"--tenant-max-kv-blocks", "12"}), &error)) << error;
  std::mt19937 rng(41);
  const auto ops_prompt = random_prompt(rng, 9);  // 2 cacheable blocks
  ASSERT_EQ(complete(server.port(), ops_prompt, "sk-ops", "").status, 200);
  int most_held = 0;
  for (int u = 0; u < 30; ++u) {
    const std::string user = "user" + std::to_string(u);
    ASSERT_EQ(complete(server.port(), random_prompt(rng, 17), "sk-app", user).status, 200) << user;
    const Received usage =
        exchange(server.port(), http_get("/v1/usage", "sk-app", "X-Pagoda-User: " + user + "\r\n"), 10s);
    ASSERT_EQ(status_of(usage.bytes), 200) << usage.bytes.substr(0, 300);
    const json k = json::parse(body_of(usage.bytes), nullptr, false)["kv_blocks"];
    EXPECT_EQ(k["limit"].get<int>(), 12) << "a user's limit is its tenant's";
    EXPECT_GE(k["held"].get<int>(), 4) << "the user's own blocks";
    EXPECT_LE(k["tenant_held"].get<int>(), 12) << "every user of acme together, after " << user;
    most_held = std::max(most_held, k["tenant_held"].get<int>());
  }
  EXPECT_GE(most_held, 8) << "the users did fill acme's cap (else the test proves nothing)";
  EXPECT_EQ(complete(server.port(), ops_prompt, "sk-ops", "").cached_tokens, 8) << "ops's cache survived acme";
  const Received metrics = exchange(server.port(), http_get("/metrics", "sk-ops"), 10s);
  const std::string text = body_of(metrics.bytes);
  const size_t at = text.find("\npagoda_kv_namespaces ");
  ASSERT_NE(at, std::string::npos) << text.substr(0, 300);
  // acme, ops, and the users still holding blocks (at most 12 of acme's blocks).
  EXPECT_LE(std::stoi(text.substr(at + 22)), 2 + 12) << "30 users came and went";
}

// GET /v1/kv/events: a tenant's key reads its whole namespace group (its own
// namespace and every salted user's), numbered in one sequence; never another
// tenant's blocks, even of the same text; the admin key reads every one.
TEST(KvEventsOfATenantGroup, ATenantSeesItsSaltedUsersBlocksAndNoOtherTenants) {
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.start(server_args("events", {}), &error)) << error;
  struct Page {
    std::vector<std::string> stored;  // hashes of stored blocks, in order
    std::vector<uint64_t> seqs;
    bool snapshot = true;
  };
  auto read = [&](const std::string& key) {
    const Received r = exchange(server.port(), http_get("/v1/kv/events?since=0&max_events=10000", key), 10s);
    EXPECT_EQ(status_of(r.bytes), 200) << r.bytes.substr(0, 300);
    const json j = json::parse(body_of(r.bytes), nullptr, false);
    Page p;
    if (!j.is_object() || !j.contains("events")) return p;
    p.snapshot = j["snapshot"].get<bool>();
    for (const auto& e : j["events"]) {
      p.seqs.push_back(e["seq"].get<uint64_t>());
      if (e["type"] == "stored") p.stored.push_back(e["hash"].get<std::string>());
    }
    return p;
  };
  auto disjoint = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    for (const auto& h : a)
      if (std::find(b.begin(), b.end(), h) != b.end()) return false;
    return true;
  };
  std::mt19937 rng(53);
  const auto secret = random_prompt(rng, 41);  // 10 full blocks of 4
  // Readers start before any traffic, so each page below is incremental.
  for (const char* key : {"sk-plain", "sk-globex", "sk-ops"}) EXPECT_TRUE(read(key).stored.empty()) << key;
  ASSERT_EQ(complete(server.port(), secret, "sk-globex", "").status, 200);
  const Page globex = read("sk-globex");
  ASSERT_GE(globex.stored.size(), 10u) << "globex's prompt blocks";
  EXPECT_TRUE(read("sk-plain").stored.empty()) << "acme sees nothing of globex";

  ASSERT_EQ(complete(server.port(), secret, "sk-app", "alice").status, 200);
  ASSERT_EQ(complete(server.port(), random_prompt(rng, 41), "sk-app", "bob").status, 200);
  ASSERT_EQ(complete(server.port(), random_prompt(rng, 21), "sk-plain", "").status, 200);
  for (const char* key : {"sk-plain", "sk-app"}) {  // either key of acme reads the same group
    const Page acme = read(key);
    EXPECT_FALSE(acme.snapshot) << key;
    EXPECT_GE(acme.stored.size(), 10u + 10u + 5u) << key << ": alice's, bob's and the tenant's own blocks";
    for (size_t i = 0; i < acme.seqs.size(); ++i) EXPECT_EQ(acme.seqs[i], i + 1) << key << ": one gap-free sequence";
    EXPECT_TRUE(disjoint(acme.stored, globex.stored)) << key << ": the same text in another tenant hashes apart";
  }
  const Page globex_after = read("sk-globex");
  EXPECT_EQ(globex_after.stored, globex.stored) << "globex sees none of acme's users' blocks";
  for (size_t i = 0; i < globex_after.seqs.size(); ++i) EXPECT_EQ(globex_after.seqs[i], i + 1);
  const Page admin = read("sk-ops");
  EXPECT_EQ(admin.stored.size(), globex.stored.size() + read("sk-plain").stored.size()) << "the admin sees all";

  // X-Pagoda-User is checked here as everywhere: refused without the right,
  // and with it the feed stays the tenant's; /v1/kv/namespace gives the seed
  // of the user's namespace.
  auto get = [&](const std::string& path, const std::string& key, const std::string& user) {
    return exchange(server.port(), http_get(path, key, user.empty() ? "" : "X-Pagoda-User: " + user + "\r\n"), 10s);
  };
  EXPECT_EQ(status_of(get("/v1/kv/events", "sk-plain", "alice").bytes), 403);
  EXPECT_EQ(status_of(get("/v1/kv/namespace", "sk-plain", "alice").bytes), 403);
  EXPECT_EQ(status_of(get("/v1/kv/events", "sk-app", "two words").bytes), 400);
  const Received as_alice = get("/v1/kv/events?since=0&max_events=10000", "sk-app", "alice");
  ASSERT_EQ(status_of(as_alice.bytes), 200);
  EXPECT_EQ(json::parse(body_of(as_alice.bytes), nullptr, false)["events"].size(),
            json::parse(body_of(get("/v1/kv/events?since=0&max_events=10000", "sk-app", "").bytes), nullptr,
                        false)["events"]
                .size());
  auto seed = [&](const std::string& user) {
    return json::parse(body_of(get("/v1/kv/namespace", "sk-app", user).bytes), nullptr, false)["namespace_seed"];
  };
  EXPECT_NE(seed("alice"), seed("")) << "alice's namespace is not the tenant's";
  EXPECT_NE(seed("alice"), seed("bob"));
  EXPECT_EQ(seed(""), json::parse(body_of(get("/v1/kv/namespace", "sk-plain", "").bytes), nullptr,
                                  false)["namespace_seed"]);
}

// The floor: scope "all" holds every first token; scope "hits" only hits.
TEST(FirstTokenFloor, HitsAndMissesWaitForTheFloorInScopeAll) {
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.start(server_args("floor_all", {"--cache-hit-ttft-floor-ms", std::to_string(kFloorMs)}), &error))
      << error;
  std::mt19937 rng(31);
  for (int i = 0; i < 3; ++i) {
    const auto prompt = random_prompt(rng, 33);
    const auto miss = time_to_first_event(server.port(), prompt, "sk-app", "floor");
    const auto hit = time_to_first_event(server.port(), prompt, "sk-app", "floor");
    EXPECT_GE(miss.count(), kFloorMs) << "a miss";
    EXPECT_GE(hit.count(), kFloorMs) << "a hit";
    // Not streamed: the whole answer waits for the floor too.
    const auto start = std::chrono::steady_clock::now();
    const Completion c = complete(server.port(), prompt, "sk-app", "floor");
    EXPECT_EQ(c.cached_tokens, 32);
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(kFloorMs));
  }
}

TEST(FirstTokenFloor, InScopeHitsOnlyHitsWaitAndMissesAreNotHeld) {
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.start(server_args("floor_hits", {"--cache-hit-ttft-floor-ms", std::to_string(kFloorMs),
                                                      "--cache-hit-ttft-floor-scope", "hits"}),
                           &error))
      << error;
  std::mt19937 rng(37);
  for (int i = 0; i < 3; ++i) {
    const auto prompt = random_prompt(rng, 33);
    const auto miss = time_to_first_event(server.port(), prompt, "sk-app", "floor");
    const auto hit = time_to_first_event(server.port(), prompt, "sk-app", "floor");
    // The control: the fixture model answers a miss far quicker than the floor,
    // so the floor (not the model) is what holds the hit.
    EXPECT_LT(miss.count(), kFloorMs / 2) << "a miss is not held in scope 'hits'";
    EXPECT_GE(hit.count(), kFloorMs) << "a hit";
  }
}

TEST(FirstTokenFloor, BadFlagsAreRefusedNamingTheFlag) {
  for (const auto& extra : std::vector<std::vector<std::string>>{{"--cache-hit-ttft-floor-ms", "-5"},
                                                                  {"--cache-hit-ttft-floor-scope", "some"},
                                                                  {"--prefix-share-min-tokens", "6"}}) {
    ServerProcess server;
    std::string error;
    EXPECT_FALSE(server.start(server_args("bad", extra), &error)) << extra[0];
  }
}

}  // namespace
}  // namespace pagoda::e2e
