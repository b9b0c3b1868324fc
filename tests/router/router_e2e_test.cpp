// `pagoda route` end to end: real `pagoda serve` replicas of the bundled model
// on the CPU and a real router, all on loopback, talked to with plain HTTP.
//
//   - a replica's /v1/kv/events: namespace-scoped hashes equal to the prompt's
//     block keys, never a tenant name; admin-only load; bad parameters named;
//   - kv-aware: every later turn of a conversation lands where its earlier
//     turns are cached (the backend's own usage.cached_tokens says so);
//   - pass-through: streamed and whole responses byte for byte (less the
//     response id and timestamp), api keys and errors from the backends;
//   - /v1/cache/drop reaches every replica;
//   - a killed replica leaves the rotation with no request lost, a restarted
//     one rejoins with a fresh index; no replica at all is a 503 in the
//     OpenAI error shape;
//   - bad flags are refused, an unreachable backend at start is a warning.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/kv/prefix_cache.h"
#include "pagoda/router/backend_reports.h"
#include "pagoda/router/prompt_hasher.h"
#include "pagoda_process.h"

namespace pagoda::e2e {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const char* kModel = "models/pagoda-tiny";

// One file per test process, written whole before anyone reads it: ctest runs
// these tests in parallel, and a shared file could be read half-written.
std::string keys_file() {
  static const std::string path = [] {
    const std::string final_path =
        std::string(PAGODA_BINARY_DIR) + "/router_e2e_keys." + std::to_string(::getpid()) + ".json";
    const std::string tmp = final_path + ".tmp";
    std::ofstream(tmp) << R"({"keys": [{"key": "sk-alice", "tenant": "alice"}, {"key": "sk-bob", "tenant": "bob"},
                                    {"key": "sk-app", "tenant": "app", "user_salt": true},
                                    {"key": "sk-router", "tenant": "ops", "admin": true}]})";
    std::filesystem::rename(tmp, final_path);
    return final_path;
  }();
  return path;
}

std::vector<std::string> serve_args(int port = 0) {
  return {"serve", "--model", source_path(kModel), "--host", "127.0.0.1", "--port", std::to_string(port),
          "--api-keys", keys_file(), "--max-queued", "32", "--http-threads", "24"};
}

httplib::Client client(int port, const std::string& key = "sk-alice") {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  if (!key.empty()) c.set_default_headers({{"Authorization", "Bearer " + key}});
  return c;
}

json chat_body(const json& messages, int max_tokens, bool stream = false) {
  json body = {{"model", "pagoda-tiny"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) body["stream"] = true;
  return body;
}

// A system prompt of a few hundred tokens, different per conversation.
std::string system_prompt(int conversation) {
  std::string s = "You are assistant number " + std::to_string(conversation) + ". ";
  for (int i = 0; i < 12; ++i) s += "Rule " + std::to_string(i) + " for conversation " + std::to_string(conversation) + ": answer kindly and briefly. ";
  return s;
}

// Response ids and timestamps differ per response; everything else must not.
std::string without_ids(const std::string& body) {
  static const std::regex id(R"re("id":"[^"]*")re");
  static const std::regex created(R"re("created":[0-9]+)re");
  return std::regex_replace(std::regex_replace(body, id, R"("id":"X")"), created, R"("created":0)");
}

double metric(const std::string& text, const std::string& line_prefix) {
  const size_t at = text.find("\n" + line_prefix + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + line_prefix.size() + 2));
}

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

// Backends whose KV events the router follows.
int synced_backends(int router_port) {
  auto res = client(router_port, "").Get("/metrics");
  if (!res) return -1;
  int n = 0;
  for (size_t at = res->body.find("\npagoda_router_backend_index_synced{"); at != std::string::npos;
       at = res->body.find("\npagoda_router_backend_index_synced{", at + 1))
    n += res->body.compare(res->body.find("} ", at) + 2, 1, "1") == 0 ? 1 : 0;
  return n;
}

int healthy_backends(int router_port) {
  auto res = client(router_port, "").Get("/health");
  if (!res) return -1;
  const json j = json::parse(res->body, nullptr, false);
  return j.is_object() && j.contains("healthy_backends") ? j["healthy_backends"].get<int>() : -1;
}

// Two replicas with api keys and a kv-aware router holding the admin key.
class RouterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    for (auto& r : replicas_) ASSERT_TRUE(r.start(serve_args(), &error)) << error;
    std::vector<std::string> args = {"route", "--model", source_path(kModel), "--host", "127.0.0.1", "--port", "0",
                                     "--backend-api-key", "sk-router", "--health-interval", "0.2",
                                     "--poll-interval", "0.05"};
    for (auto& r : replicas_) args.insert(args.end(), {"--backend", r.url()});
    ASSERT_TRUE(router_.start(args, &error)) << error;
    ASSERT_TRUE(wait_until([&] { return healthy_backends(router_.port()) == 2 && synced_backends(router_.port()) == 2; },
                           10s))
        << router_.stderr_text();
  }

  PagodaProcess replicas_[2];
  PagodaProcess router_;
};

TEST_F(RouterE2eTest, ReplicaPublishesNamespaceScopedHashesOfItsCachedBlocksAndNoNames) {
  const int port = replicas_[0].port();
  const json messages = {{{"role", "system"}, {"content", system_prompt(1)}}, {{"role", "user"}, {"content", "Hi"}}};
  const std::string body = chat_body(messages, 1).dump();
  auto done = client(port).Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200) << done->body;

  auto alice = client(port).Get("/v1/kv/events?since=0");
  ASSERT_TRUE(alice);
  ASSERT_EQ(alice->status, 200) << alice->body;
  auto page = router::parse_kv_events_page(alice->body);
  ASSERT_TRUE(page.ok()) << page.status().to_string();
  EXPECT_EQ(json::parse(alice->body)["scope"], "tenant");
  EXPECT_FALSE(page->load) << "load spans tenants: admin only";
  EXPECT_EQ(alice->body.find("alice"), std::string::npos) << "no tenant names leave the server";

  // The hashes are the prompt's block keys, from the namespace seed the server gives alice.
  auto ns = client(port).Get("/v1/kv/namespace");
  ASSERT_TRUE(ns);
  ASSERT_EQ(ns->status, 200);
  const uint64_t seed = *router::parse_hex64(json::parse(ns->body)["namespace_seed"].get<std::string>());
  auto hasher = router::PromptHasher::load(source_path(kModel));
  ASSERT_TRUE(hasher.ok()) << hasher.status().to_string();
  auto tokens = (*hasher)->prompt_tokens(body, server::Endpoint::kChatCompletions);
  ASSERT_TRUE(tokens.ok());
  const auto keys = router::PromptHasher::block_keys(seed, *tokens, page->block_size);
  ASSERT_GE(keys.size(), 4u);
  std::set<uint64_t> stored;
  for (const auto& e : page->events)
    if (e.stored) stored.insert(e.key_hash);
  for (uint64_t k : keys) EXPECT_EQ(stored.count(k), 1u) << "a prompt block the server did not report";

  // Bob sees none of alice's blocks; the admin key sees them and the load.
  auto bob = client(port, "sk-bob").Get("/v1/kv/events?since=0");
  ASSERT_TRUE(bob);
  EXPECT_TRUE(json::parse(bob->body)["events"].empty()) << bob->body;
  auto admin = client(port, "sk-router").Get("/v1/kv/events?since=0");
  ASSERT_TRUE(admin);
  auto admin_page = router::parse_kv_events_page(admin->body);
  ASSERT_TRUE(admin_page.ok());
  EXPECT_GE(admin_page->events.size(), keys.size());
  EXPECT_TRUE(admin_page->load);
  EXPECT_EQ(client(port, "sk-alice").Get("/v1/load")->status, 403);
  EXPECT_EQ(client(port, "sk-router").Get("/v1/load")->status, 200);
  EXPECT_EQ(client(port, "sk-nobody").Get("/v1/kv/events")->status, 401);
  auto bad = client(port).Get("/v1/kv/events?since=-1");
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "since");
  auto ahead = client(port).Get("/v1/kv/events?since=999999999");
  EXPECT_TRUE(json::parse(ahead->body)["snapshot"].get<bool>()) << "ahead of the server: resync";
}

TEST_F(RouterE2eTest, EveryLaterTurnLandsWhereTheConversationIsCached) {
  auto c = client(router_.port());
  int64_t later_turn_prompt = 0, later_turn_cached = 0;
  for (int conversation = 0; conversation < 3; ++conversation) {
    json messages = {{{"role", "system"}, {"content", system_prompt(100 + conversation)}}};
    for (int turn = 0; turn < 3; ++turn) {
      messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(turn) + ", please."}});
      auto res = c.Post("/v1/chat/completions", chat_body(messages, 8).dump(), "application/json");
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      const json j = json::parse(res->body);
      const int64_t cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
      if (turn > 0) {
        EXPECT_GT(cached, 0) << "conversation " << conversation << " turn " << turn << " missed its cache";
        later_turn_prompt += j["usage"]["prompt_tokens"].get<int64_t>();
        later_turn_cached += cached;
      }
      messages.push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
    }
  }
  EXPECT_GT(later_turn_cached * 2, later_turn_prompt) << "most of every later prompt came from cache";
  const std::string metrics = client(router_.port(), "").Get("/metrics")->body;
  EXPECT_GT(metric(metrics, "pagoda_router_prefix_match_tokens_sum"), 0) << metrics;
  EXPECT_EQ(metric(metrics, "pagoda_router_unhashed_prompts_total"), 0);
}

// A salting key's users (X-Pagoda-User) have namespaces of their own: the router asks the replicas for
// each user's seed, so it hashes a user's prompts into that user's block keys. Then a user's later turns
// match that user's cached blocks (and land there), and another user's identical prompt matches nothing:
// hashed with the tenant's seed instead, user-2's first turns would "match" user-1's blocks (the same
// system prompts) and be sent to a replica that cannot serve them from cache.
TEST_F(RouterE2eTest, SaltedUsersAreHashedIntoTheirOwnNamespaces) {
  const auto matched = [&] {
    return metric(client(router_.port(), "").Get("/metrics")->body, "pagoda_router_prefix_match_tokens_sum");
  };
  int64_t later_turn_prompt = 0;
  double later_turn_matched = 0;
  for (const std::string user : {"user-1", "user-2"}) {
    auto c = client(router_.port(), "sk-app");
    for (int conversation = 0; conversation < 3; ++conversation) {
      json messages = {{{"role", "system"}, {"content", system_prompt(200 + conversation)}}};
      for (int turn = 0; turn < 3; ++turn) {
        messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(turn) + ", please."}});
        const double matched_before = matched();
        auto res = c.Post("/v1/chat/completions", {{"X-Pagoda-User", user}}, chat_body(messages, 8).dump(),
                          "application/json");
        ASSERT_TRUE(res);
        ASSERT_EQ(res->status, 200) << res->body;
        const double matched_here = matched() - matched_before;
        const json j = json::parse(res->body);
        const int64_t cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
        if (turn > 0) {
          EXPECT_GT(cached, 0) << user << " conversation " << conversation << " turn " << turn << " missed its cache";
          later_turn_prompt += j["usage"]["prompt_tokens"].get<int64_t>();
          later_turn_matched += matched_here;
        } else {
          EXPECT_EQ(cached, 0) << user << " hit another user's blocks";
          EXPECT_EQ(matched_here, 0) << user << "'s first turn matched blocks of another namespace in the router";
        }
        messages.push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
      }
    }
  }
  EXPECT_GT(later_turn_matched * 2, later_turn_prompt) << "the router matched the users' own cached prefixes";
}

TEST_F(RouterE2eTest, ResponsesPassThroughByteForByteStreamedOrWhole) {
  const json messages = {{{"role", "user"}, {"content", "Tell me a short story about a pagoda."}}};
  // A whole answer carries usage.prompt_tokens_details.cached_tokens, which is
  // the chosen replica's own cache state: which replica the router picks
  // depends on when it last polled each one's events and load, so on a loaded
  // box it may pick the replica that has not seen this prompt (cached 0 where
  // the direct answer said 16). Both replicas see the prompt first, so every
  // later answer below is a hit of the same length wherever it is routed.
  for (auto& r : replicas_) {
    auto warm = client(r.port()).Post("/v1/chat/completions", chat_body(messages, 24).dump(), "application/json");
    ASSERT_TRUE(warm);
    ASSERT_EQ(warm->status, 200) << warm->body;
  }
  for (bool stream : {true, false}) {
    const std::string body = chat_body(messages, 24, stream).dump();
    auto direct = client(replicas_[1].port()).Post("/v1/chat/completions", body, "application/json");
    auto routed = client(router_.port()).Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(direct && routed);
    EXPECT_EQ(routed->status, 200);
    EXPECT_EQ(routed->get_header_value("Content-Type"), direct->get_header_value("Content-Type"));
    EXPECT_EQ(without_ids(routed->body), without_ids(direct->body)) << "stream " << stream;
    if (stream) {
      EXPECT_EQ(routed->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
      EXPECT_TRUE(routed->body.ends_with("data: [DONE]\n\n"));
    }
  }
  // Token-id completions too (no chat template involved); 4 tokens are less
  // than a block, never cached, so routing cannot change this answer either.
  const std::string completion = R"({"model": "pagoda-tiny", "prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "stream": true})";
  auto direct = client(replicas_[0].port()).Post("/v1/completions", completion, "application/json");
  auto routed = client(router_.port()).Post("/v1/completions", completion, "application/json");
  ASSERT_TRUE(direct && routed);
  EXPECT_EQ(without_ids(routed->body), without_ids(direct->body));
}

TEST_F(RouterE2eTest, KeysAndErrorsAreTheBackendsOwn) {
  const std::string body = chat_body({{{"role", "user"}, {"content", "hi"}}}, 2).dump();
  auto no_key = client(router_.port(), "").Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(json::parse(no_key->body)["error"]["code"], "invalid_api_key");
  auto bad_json = client(router_.port()).Post("/v1/chat/completions", "{", "application/json");
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_TRUE(json::parse(bad_json->body)["error"].is_object());
  auto wrong_model = client(router_.port()).Post("/v1/completions", R"({"model": "gpt-9", "prompt": "x"})",
                                                 "application/json");
  EXPECT_EQ(wrong_model->status, 400);
  EXPECT_EQ(json::parse(wrong_model->body)["error"]["code"], "model_not_found");
  auto models = client(router_.port()).Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "pagoda-tiny");
  // vLLM's /tokenize (outside /v1/) reaches a backend too.
  auto tokenized = client(router_.port()).Post("/tokenize", R"({"model": "pagoda-tiny", "prompt": "Hello"})",
                                               "application/json");
  ASSERT_TRUE(tokenized);
  EXPECT_EQ(tokenized->status, 200) << tokenized->body;
  EXPECT_GE(json::parse(tokenized->body)["count"].get<int>(), 1);
  auto unknown = client(router_.port()).Get("/v1/nothing-here");
  EXPECT_EQ(unknown->status, 404);
  EXPECT_TRUE(json::parse(unknown->body)["error"].is_object());
  auto router_404 = client(router_.port()).Get("/nowhere");
  EXPECT_EQ(router_404->status, 404);
  EXPECT_EQ(json::parse(router_404->body)["error"]["code"], "not_found");
}

TEST_F(RouterE2eTest, CacheDropReachesEveryReplica) {
  auto c = client(router_.port());
  for (int conversation = 0; conversation < 2; ++conversation) {
    const json messages = {{{"role", "system"}, {"content", system_prompt(200 + conversation)}},
                           {{"role", "user"}, {"content", "Hello"}}};
    ASSERT_EQ(c.Post("/v1/chat/completions", chat_body(messages, 2).dump(), "application/json")->status, 200);
  }
  auto dropped = c.Post("/v1/cache/drop", R"({"all": true})", "application/json");
  ASSERT_TRUE(dropped);
  ASSERT_EQ(dropped->status, 200) << dropped->body;
  const json j = json::parse(dropped->body);
  EXPECT_EQ(j["backends"], 2);
  EXPECT_GE(j["dropped_blocks"].get<int64_t>(), 8);
  auto bad = c.Post("/v1/cache/drop", R"({"all": "yes"})", "application/json");
  EXPECT_EQ(bad->status, 400) << "the backends' verdict is the answer";
}

TEST(RouterFailover, AKilledReplicaLosesNoNewRequestAndARestartedOneRejoins) {
  std::string error;
  PagodaProcess replicas[2], router;
  for (auto& r : replicas) ASSERT_TRUE(r.start(serve_args(), &error)) << error;
  ASSERT_TRUE(router.start({"route", "--model", source_path(kModel), "--port", "0", "--backend-api-key", "sk-router",
                            "--health-interval", "0.2", "--backend", replicas[0].url(), "--backend",
                            replicas[1].url()},
                           &error))
      << error;
  ASSERT_TRUE(wait_until([&] { return healthy_backends(router.port()) == 2 && synced_backends(router.port()) == 2; },
                         10s));
  auto metrics = [&] { return client(router.port(), "").Get("/metrics")->body; };
  auto in_flight = [&](const PagodaProcess& r) {
    return metric(metrics(), "pagoda_router_backend_in_flight{backend=\"" + r.url() + "\"}");
  };

  // A long non-streamed completion sends nothing until it is done: kill its
  // replica under it, and the router retries it on the other one.
  std::atomic<int> long_status{0};
  std::thread long_request([&] {
    auto res = client(router.port()).Post(
        "/v1/completions",
        json{{"model", "pagoda-tiny"}, {"prompt", {9, 8, 7}}, {"max_tokens", 600}, {"ignore_eos", true}}.dump(),
        "application/json");
    long_status = res ? res->status : -1;
  });
  int victim = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        for (int i = 0; i < 2 && victim < 0; ++i)
          if (in_flight(replicas[i]) == 1) victim = i;
        return victim >= 0;
      },
      10s));
  PagodaProcess& dead = replicas[victim];
  PagodaProcess& alive = replicas[1 - victim];
  const int dead_port = dead.port();
  const std::string dead_url = dead.url();
  dead.stop(SIGKILL);
  long_request.join();
  EXPECT_EQ(long_status.load(), 200) << "failed before its first byte: retried elsewhere";
  EXPECT_EQ(metric(metrics(), "pagoda_router_retries_total"), 1);

  // Requests right after the death: if the router has not noticed yet, they
  // fail to connect and are retried on the other replica.
  auto c = client(router.port());
  for (int i = 0; i < 8; ++i) {
    auto res = c.Post("/v1/completions",
                      json{{"model", "pagoda-tiny"}, {"prompt", {1, 2, 3, i}}, {"max_tokens", 2}}.dump(),
                      "application/json");
    ASSERT_TRUE(res) << "request " << i;
    EXPECT_EQ(res->status, 200) << "request " << i << ": " << res->body;
  }
  EXPECT_TRUE(wait_until([&] { return healthy_backends(router.port()) == 1; }, 3s)) << "out within seconds";
  EXPECT_EQ(metric(metrics(), "pagoda_router_backend_healthy{backend=\"" + dead_url + "\"}"), 0);

  PagodaProcess restarted;
  ASSERT_TRUE(restarted.start(serve_args(dead_port), &error)) << error;
  EXPECT_TRUE(wait_until([&] { return healthy_backends(router.port()) == 2; }, 5s)) << "back within seconds";
  // Its index starts over from the new process's events.
  EXPECT_TRUE(wait_until(
      [&] { return metric(metrics(), "pagoda_router_backend_index_resyncs_total{backend=\"" + dead_url + "\"}") >= 1; },
      5s))
      << metrics() << router.stderr_text();

  restarted.stop(SIGKILL);
  alive.stop(SIGKILL);
  ASSERT_TRUE(wait_until([&] { return healthy_backends(router.port()) == 0; }, 5s));
  auto none = c.Post("/v1/completions", R"({"model": "pagoda-tiny", "prompt": [1, 2], "max_tokens": 1})",
                     "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 503);
  const json j = json::parse(none->body);
  EXPECT_EQ(j["error"]["code"], "no_healthy_backend");
  EXPECT_EQ(j["error"]["type"], "server_error");
  EXPECT_EQ(client(router.port(), "").Get("/health")->status, 503);
  EXPECT_EQ(router.stop(SIGTERM), 0) << router.stderr_text();
}

TEST(RouterCli, RefusesBadFlagsAndWarnsAboutAnUnreachableBackend) {
  auto no_backend = run_pagoda({"route"});
  EXPECT_NE(no_backend.exit_code, 0);
  EXPECT_NE(no_backend.err.find("--backend"), std::string::npos) << no_backend.err;
  auto https = run_pagoda({"route", "--policy", "round-robin", "--backend", "https://127.0.0.1:1"});
  EXPECT_NE(https.exit_code, 0);
  EXPECT_NE(https.err.find("https is not supported"), std::string::npos) << https.err;
  auto no_model = run_pagoda({"route", "--backend", "http://127.0.0.1:1"});
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE(no_model.err.find("--model"), std::string::npos) << no_model.err;
  auto policy = run_pagoda({"route", "--policy", "fastest", "--backend", "http://127.0.0.1:1"});
  EXPECT_NE(policy.err.find("kv-aware, round-robin or least-loaded"), std::string::npos) << policy.err;
  auto twice = run_pagoda({"route", "--policy", "round-robin", "--backend", "127.0.0.1:9", "--backend",
                           "http://127.0.0.1:9/"});
  EXPECT_NE(twice.err.find("given twice"), std::string::npos) << twice.err;

  PagodaProcess router;
  std::string error;
  ASSERT_TRUE(router.start({"route", "--policy", "least-loaded", "--port", "0", "--backend", "http://127.0.0.1:1"},
                           &error))
      << error;
  EXPECT_NE(router.stderr_text().find("warning: backend http://127.0.0.1:1 is not healthy"), std::string::npos)
      << router.stderr_text();
  auto res = client(router.port()).Post("/v1/completions", R"({"model": "m", "prompt": [1]})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "no_healthy_backend");
  EXPECT_EQ(router.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace pagoda::e2e
