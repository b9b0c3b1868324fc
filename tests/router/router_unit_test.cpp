// The router's pure parts and the server's KV event feed, without processes:
// backend URLs, the three routing policies, event-page parsing, the prefix
// index staying in step (incremental, snapshot, restart, corrupt pages,
// expected blocks), prompt block keys equal to the KV manager's own keys, and
// the feed's pages (in order, cut, per namespace, snapshots after gaps).

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../engine/fake_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kv/prefix_cache.h"
#include "pagoda/router/backend_reports.h"
#include "pagoda/router/backend_url.h"
#include "pagoda/router/prefix_index.h"
#include "pagoda/router/prompt_hasher.h"
#include "pagoda/router/routing_policy.h"
#include "pagoda/router/backend.h"
#include "pagoda/server/api_keys.h"
#include "pagoda/server/kv_event_feed.h"
#include "pagoda/server/tokenizer_fingerprint.h"

namespace pagoda::router {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::string source_path(const std::string& relative) { return std::string(PAGODA_SOURCE_DIR) + "/" + relative; }

// ---- backend URLs -------------------------------------------------------------

TEST(BackendUrl, AcceptsTheUsualFormsAndNormalizes) {
  auto a = parse_backend_url("http://127.0.0.1:8001");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8001);
  EXPECT_EQ(a->text, "http://127.0.0.1:8001");
  EXPECT_EQ(parse_backend_url("localhost:9000/")->text, "http://localhost:9000");
  EXPECT_EQ(parse_backend_url("http://replica-a")->port, 80);
  auto v6 = parse_backend_url("http://[::1]:8002");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->text, "http://[::1]:8002");
}

TEST(BackendUrl, RefusesWhatItCannotReachWithAClearReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"https://a:1", "https"},        {"ftp://a:1", "only http"},     {"http://a:1/v1", "no path"},
      {"http://a:0", "port"},          {"http://a:70000", "port"},     {"http://a:x", "port"},
      {"http://:8000", "no host"},     {"::1:8000", "brackets"},       {"http://[::1", "unclosed"},
      {"http://a:", "empty port"},     {"", "no host"}};
  for (const auto& [url, why] : cases) {
    auto r = parse_backend_url(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << url << ": " << r.status().message();
  }
}

// ---- routing policies ---------------------------------------------------------

BackendView view(bool eligible, int64_t in_flight, int64_t cached = 0, int64_t busy = 0, double kv = 0.0) {
  BackendView v;
  v.eligible = eligible;
  v.in_flight = in_flight;
  v.cached_tokens = cached;
  v.reported_busy = busy;
  v.kv_usage = kv;
  return v;
}

TEST(RoutingPolicy, NamesRoundTripAndUnknownOnesAreRefused) {
  for (auto p : {RoutingPolicy::kKvAware, RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastLoaded})
    EXPECT_EQ(*parse_routing_policy(routing_policy_name(p)), p);
  auto bad = parse_routing_policy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--policy 'random'"), std::string::npos);
}

TEST(RoutingPolicy, RoundRobinTakesTurnsAndSkipsIneligibleBackends) {
  const std::vector<BackendView> v = {view(true, 9), view(false, 0), view(true, 0)};
  EXPECT_EQ(choose_backend(RoutingPolicy::kRoundRobin, v, 100, 256, 0).index, 0);
  EXPECT_EQ(choose_backend(RoutingPolicy::kRoundRobin, v, 100, 256, 1).index, 2) << "1 is down: the next one";
  EXPECT_EQ(choose_backend(RoutingPolicy::kRoundRobin, v, 100, 256, 2).index, 2);
  EXPECT_EQ(choose_backend(RoutingPolicy::kRoundRobin, v, 100, 256, 3).index, 0);
}

TEST(RoutingPolicy, LeastLoadedUsesTheLargerOfOwnAndReportedCountsPlusKvUsage) {
  // 0: 3 own; 1: 1 own but the backend reports 5 (another router's traffic); 2: 2 own.
  std::vector<BackendView> v = {view(true, 3), view(true, 1, 0, 5), view(true, 2)};
  EXPECT_EQ(choose_backend(RoutingPolicy::kLeastLoaded, v, 0, 256, 0).index, 2);
  v[2].kv_usage = 0.9;
  v[0] = view(true, 2, 0, 0, 0.1);
  EXPECT_EQ(choose_backend(RoutingPolicy::kLeastLoaded, v, 0, 256, 0).index, 0) << "a fuller cache weighs more";
  // Ties go in rotation order.
  const std::vector<BackendView> tie = {view(true, 1), view(true, 1), view(true, 1)};
  EXPECT_EQ(choose_backend(RoutingPolicy::kLeastLoaded, tie, 0, 256, 7).index, 1);
}

TEST(RoutingPolicy, KvAwareFollowsTheCacheUntilLoadCostsMoreThanTheHit) {
  // Prompt of 1,000 tokens; backend 1 holds 800 of them.
  std::vector<BackendView> v = {view(true, 0), view(true, 0, 800)};
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, v, 1000, 256, 0).index, 1);
  v[1].in_flight = 4;  // cost 200 + 4 x 256 > 1000
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, v, 1000, 256, 0).index, 0);
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, v, 1000, 100, 0).index, 1) << "a lower weight follows the cache";
  // No prefix known anywhere: least loaded.
  const std::vector<BackendView> cold = {view(true, 2), view(true, 1), view(true, 4)};
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, cold, 1000, 256, 0).index, 1);
  // Prefills queued ahead count in full: 800 cached tokens are worth less
  // than 900 tokens of other prompts still to compute there.
  v = {view(true, 1), view(true, 1, 800)};
  v[1].pending_prefill_tokens = 900;
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, v, 1000, 32, 0).index, 0);
  v[1].pending_prefill_tokens = 700;
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, v, 1000, 32, 0).index, 1);
  // A cached count larger than the prompt cannot make a cost negative.
  const std::vector<BackendView> odd = {view(true, 0, 5000), view(true, 0, 0)};
  EXPECT_DOUBLE_EQ(choose_backend(RoutingPolicy::kKvAware, odd, 100, 256, 0).cost, 0.0);
}

TEST(RoutingPolicy, NoEligibleBackendIsMinusOne) {
  const std::vector<BackendView> v = {view(false, 0), view(false, 0)};
  for (auto p : {RoutingPolicy::kKvAware, RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastLoaded})
    EXPECT_EQ(choose_backend(p, v, 10, 256, 0).index, -1);
  EXPECT_EQ(choose_backend(RoutingPolicy::kKvAware, std::vector<BackendView>{}, 10, 256, 0).index, -1);
}

// ---- pending prefill: first bytes, or the backend's load report --------------

BackendUrl local_url() {
  auto url = parse_backend_url("http://127.0.0.1:9");
  EXPECT_TRUE(url.ok());
  return *url;
}

TEST(BackendPrefill, EndsAtFirstBytesOnceAndWithoutDoubleCounting) {
  Backend b(local_url(), BackendOptions{});
  const uint64_t t1 = b.begin_prefill(100);
  const uint64_t t2 = b.begin_prefill(40);
  EXPECT_EQ(b.pending_prefill_tokens(), 140);
  b.end_prefill(t1);
  b.end_prefill(t1);  // idempotent
  EXPECT_EQ(b.pending_prefill_tokens(), 40);
  b.end_prefill(t2);
  EXPECT_EQ(b.pending_prefill_tokens(), 0);
  b.begin_prefill(-5);  // a negative share (a prompt shorter than its match) counts as nothing
  EXPECT_EQ(b.pending_prefill_tokens(), 0);
}

TEST(BackendPrefill, ALoadReportSettlesTheOldestRequestsItShowsStarted) {
  using Clock = std::chrono::steady_clock;
  Backend b(local_url(), BackendOptions{});
  const uint64_t oldest = b.begin_prefill(100);
  b.begin_prefill(200);
  b.begin_prefill(300);
  const auto asked = Clock::now() + 1s;  // after all three were routed
  BackendLoad load;
  load.running = 2;
  load.waiting = 1;  // one of the three has not started there
  b.settle_prefills(load, asked, 0ms);
  EXPECT_EQ(b.pending_prefill_tokens(), 300) << "the two oldest started; the newest waits";
  EXPECT_EQ(b.prefills_settled_by_load(), 2);
  b.end_prefill(oldest);  // its first bytes later: nothing left to give back
  EXPECT_EQ(b.pending_prefill_tokens(), 300);

  // Requests routed after the report was asked for (or within the arrival
  // allowance) are not in its figures: they stay pending.
  b.begin_prefill(50);
  load.waiting = 0;
  load.queued = 0;
  b.settle_prefills(load, Clock::now(), 10s);
  EXPECT_EQ(b.pending_prefill_tokens(), 350);
  // Queued requests (accepted, not yet sequences) count as not started too.
  load.queued = 2;
  b.settle_prefills(load, Clock::now() + 1s, 0ms);
  EXPECT_EQ(b.pending_prefill_tokens(), 350);
  load.queued = 1;
  b.settle_prefills(load, Clock::now() + 1s, 0ms);
  EXPECT_EQ(b.pending_prefill_tokens(), 50);
  EXPECT_EQ(b.prefills_settled_by_load(), 3);
}

// ---- tokenizer fingerprint ----------------------------------------------------

TEST(TokenizerFingerprint, SameFilesSameDigestAnyChangeAnotherAndNoTokenizerNone) {
  namespace fs = std::filesystem;
  const std::string model = source_path("models/pagoda-tiny");
  auto a = server::tokenizer_fingerprint(model);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(*server::tokenizer_fingerprint(model), *a);

  const fs::path dir = fs::temp_directory_path() / ("pagoda_fp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_EQ(*server::tokenizer_fingerprint(dir.string()), "") << "no tokenizer.json: nothing to fingerprint";
  fs::copy_file(fs::path(model) / "tokenizer.json", dir / "tokenizer.json");
  fs::copy_file(fs::path(model) / "tokenizer_config.json", dir / "tokenizer_config.json");
  EXPECT_EQ(*server::tokenizer_fingerprint(dir.string()), *a);
  std::ofstream(dir / "chat_template.jinja") << "";  // an empty template file is not an absent one
  const auto with_template = server::tokenizer_fingerprint(dir.string());
  EXPECT_NE(*with_template, *a);
  fs::remove(dir / "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json", std::ios::app) << " ";
  EXPECT_NE(*server::tokenizer_fingerprint(dir.string()), *a);
  fs::remove_all(dir);
  EXPECT_EQ(server::tokenizer_fingerprint(dir.string()).status().code(), StatusCode::kNotFound);
}

// ---- event pages and the prefix index ---------------------------------------

std::string page_json(uint64_t instance, uint64_t since, uint64_t last, bool snapshot,
                      std::vector<std::tuple<uint64_t, bool, uint64_t>> events, bool more = false) {
  json e = json::array();
  for (auto [seq, stored, hash] : events)
    e.push_back({{"seq", seq}, {"type", stored ? "stored" : "removed"}, {"hash", fmt::format("{:016x}", hash)},
                 {"parent", nullptr}});
  return json{{"object", "kv.events"}, {"instance", fmt::format("{:x}", instance)}, {"block_size", 4},
              {"since", since}, {"last", last}, {"snapshot", snapshot}, {"more", more}, {"events", e}}
      .dump();
}

KvEventsPage page(uint64_t instance, uint64_t since, uint64_t last, bool snapshot,
                  std::vector<std::tuple<uint64_t, bool, uint64_t>> events) {
  auto p = parse_kv_events_page(page_json(instance, since, last, snapshot, std::move(events)));
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : KvEventsPage{};
}

TEST(BackendReports, ParsesPagesAndLoadAndNamesTheBadField) {
  auto p = parse_kv_events_page(page_json(0xabc, 5, 7, false, {{6, true, 0x11}, {7, false, 0x22}}, true));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->instance, 0xabcu);
  EXPECT_EQ(p->block_size, 4);
  EXPECT_TRUE(p->more);
  ASSERT_EQ(p->events.size(), 2u);
  EXPECT_FALSE(p->events[1].stored);
  EXPECT_EQ(p->events[1].key_hash, 0x22u);
  EXPECT_FALSE(p->load);
  auto load = parse_backend_load(R"({"object": "load", "running": 2, "waiting": 3, "kv_usage": 0.5})");
  ASSERT_TRUE(load.ok());
  EXPECT_EQ(load->waiting, 3);
  const std::pair<std::string, const char*> bad[] = {
      {"[]", "not a JSON object"},
      {R"({"instance": "zz", "block_size": 4})", "instance"},
      {R"({"instance": "1", "block_size": 0})", "block_size"},
      {R"({"instance": "1", "block_size": 4, "since": -1, "last": 0})", "since"},
      {R"({"instance": "1", "block_size": 4, "since": 0, "last": 0, "snapshot": false, "events": [{"seq": 1}]})",
       "lacks"},
      {R"({"instance": "1", "block_size": 4, "since": 0, "last": 1, "snapshot": false,
           "events": [{"seq": 1, "type": "moved", "hash": "1"}]})", "type"},
      {R"({"instance": "1", "block_size": 4, "since": 0, "last": 1, "snapshot": false, "events": [],
           "load": {"running": 1}})", "load.waiting"}};
  for (const auto& [body, field] : bad) {
    auto r = parse_kv_events_page(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(parse_hex64("12345678901234567"));
  EXPECT_EQ(*parse_hex64("ff"), 255u);
}

TEST(PrefixIndex, MatchesTheLeadingRunOfCachedKeysOnceSynced) {
  PrefixIndex index;
  const std::vector<uint64_t> chain = {1, 2, 3, 4};
  EXPECT_EQ(index.match_blocks(chain), 0) << "not synced";
  EXPECT_EQ(index.apply(page(9, 0, 3, false, {{1, true, 1}, {2, true, 2}, {3, true, 4}})),
            PrefixIndex::ApplyResult::kApplied);
  EXPECT_TRUE(index.synced());
  EXPECT_EQ(index.block_size(), 4);
  EXPECT_EQ(index.next_since(), 3u);
  EXPECT_EQ(index.match_blocks(chain), 2) << "3 is missing: 4 cannot count";
  EXPECT_EQ(index.apply(page(9, 3, 5, false, {{4, true, 3}, {5, false, 1}})), PrefixIndex::ApplyResult::kApplied);
  EXPECT_EQ(index.match_blocks(chain), 0) << "the first block left";
  EXPECT_EQ(index.num_blocks(), 3u);
}

TEST(PrefixIndex, ASnapshotReplacesEverythingAndCountsAResync) {
  PrefixIndex index;
  index.apply(page(9, 0, 2, false, {{1, true, 1}, {2, true, 2}}));
  EXPECT_EQ(index.apply(page(9, 2, 40, true, {{0, true, 7}, {0, true, 8}})), PrefixIndex::ApplyResult::kApplied);
  EXPECT_EQ(index.resyncs(), 1);
  EXPECT_EQ(index.num_blocks(), 2u);
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{7, 8}), 2);
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{1}), 0);
  EXPECT_EQ(index.next_since(), 40u);
}

TEST(PrefixIndex, ARestartedBackendEmptiesTheIndexAndStartsFromZero) {
  PrefixIndex index;
  index.apply(page(9, 0, 2, false, {{1, true, 1}, {2, true, 2}}));
  EXPECT_EQ(index.apply(page(10, 2, 1, false, {{1, true, 5}})), PrefixIndex::ApplyResult::kResync);
  EXPECT_EQ(index.next_since(), 0u);
  EXPECT_EQ(index.num_blocks(), 0u);
  EXPECT_FALSE(index.synced());
  EXPECT_EQ(index.apply(page(10, 0, 1, false, {{1, true, 5}})), PrefixIndex::ApplyResult::kApplied);
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{5}), 1);
  // A restart answered with a snapshot applies at once.
  EXPECT_EQ(index.apply(page(11, 1, 8, true, {{0, true, 6}})), PrefixIndex::ApplyResult::kApplied);
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{6}), 1);
  EXPECT_EQ(index.resyncs(), 2);
}

TEST(PrefixIndex, StalePagesAreIgnoredAndCorruptNumberingForcesAResync) {
  PrefixIndex index;
  index.apply(page(9, 0, 2, false, {{1, true, 1}, {2, true, 2}}));
  EXPECT_EQ(index.apply(page(9, 0, 2, false, {{1, true, 1}})), PrefixIndex::ApplyResult::kStale);
  EXPECT_EQ(index.next_since(), 2u);
  EXPECT_EQ(index.apply(page(9, 2, 4, false, {{4, true, 3}, {3, true, 4}})), PrefixIndex::ApplyResult::kResync)
      << "numbers must rise";
  EXPECT_EQ(index.next_since(), 0u);
  EXPECT_EQ(index.num_blocks(), 0u);
  index.apply(page(9, 0, 2, false, {{1, true, 1}, {2, true, 2}}));
  EXPECT_EQ(index.apply(page(9, 2, 3, false, {{9, true, 3}})), PrefixIndex::ApplyResult::kResync)
      << "an event past `last`";
}

TEST(PrefixIndex, RoutedPromptsCountAsHeldUntilTheyExpireOrAnEventSettlesThem) {
  PrefixIndex index;
  const auto now = std::chrono::steady_clock::now();
  index.note_routed(std::vector<uint64_t>{1, 2}, now + std::chrono::hours(1));
  EXPECT_EQ(index.num_expected(), 0u) << "ignored until synced";
  index.apply(page(9, 0, 1, false, {{1, true, 1}}));
  index.note_routed(std::vector<uint64_t>{1, 2, 3}, now + std::chrono::hours(1));
  EXPECT_EQ(index.num_expected(), 2u) << "1 is known already";
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{1, 2, 3, 4}), 3);
  index.apply(page(9, 1, 3, false, {{2, true, 2}, {3, false, 3}}));
  EXPECT_EQ(index.num_expected(), 0u) << "2 confirmed, 3 gone";
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{1, 2, 3}), 2);
  index.note_routed(std::vector<uint64_t>{1, 2, 5}, now - std::chrono::seconds(1));
  EXPECT_EQ(index.match_blocks(std::vector<uint64_t>{1, 2, 5}), 2) << "expired";
}

// ---- prompt keys equal the KV manager's keys -------------------------------

TEST(PromptHasher, BlockKeysEqualTheKeysTheKvManagerStores) {
  kv::KvCacheConfig config;
  config.num_blocks = 32;
  config.block_size = 4;
  auto kv = std::move(kv::KvCacheManager::create(config)).value();
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 18; ++i) prompt.push_back(100 + 7 * i);
  ASSERT_TRUE(kv->allocate_sequence(1, "tenant:1:a", prompt).ok());
  ASSERT_TRUE(kv->mark_computed(1, static_cast<int64_t>(prompt.size())).ok());
  std::vector<uint64_t> stored;
  for (const auto& e : kv->drain_events()) stored.push_back(e.key_hash);
  ASSERT_EQ(stored.size(), 4u);  // 18 tokens: 4 full blocks
  const auto keys = PromptHasher::block_keys(kv::namespace_seed("tenant:1:a"), prompt, 4);
  ASSERT_EQ(keys.size(), 4u) << "(18 - 1) / 4 blocks can match";
  EXPECT_EQ(keys, stored);
  // 17 tokens: the last is always computed, so 4 blocks; 16 tokens: 3.
  EXPECT_EQ(PromptHasher::block_keys(1, std::span(prompt).first(17), 4).size(), 4u);
  EXPECT_EQ(PromptHasher::block_keys(1, std::span(prompt).first(16), 4).size(), 3u);
  EXPECT_NE(PromptHasher::block_keys(kv::namespace_seed("tenant:1:b"), prompt, 4)[0], keys[0])
      << "another namespace, unrelated keys";
}

TEST(PromptHasher, TokenIdPromptsNeedNoTokenizerAndBadBodiesHaveNoPrompt) {
  auto hasher = PromptHasher::token_ids_only();
  auto tokens = hasher->prompt_tokens(R"({"model": "m", "prompt": [5, 6, 7]})", server::Endpoint::kCompletions);
  ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{5, 6, 7}));
  // truncate_prompt_tokens: the backend keeps (and caches) the prompt's last k tokens; -1 is left whole.
  tokens = hasher->prompt_tokens(R"({"model": "m", "prompt": [5, 6, 7], "truncate_prompt_tokens": 2})",
                                 server::Endpoint::kCompletions);
  ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{6, 7}));
  tokens = hasher->prompt_tokens(R"({"model": "m", "prompt": [5, 6, 7], "truncate_prompt_tokens": -1})",
                                 server::Endpoint::kCompletions);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->size(), 3u);
  EXPECT_FALSE(hasher->prompt_tokens(R"({"model": "m", "prompt": "text"})", server::Endpoint::kCompletions).ok());
  EXPECT_FALSE(hasher->prompt_tokens("{not json", server::Endpoint::kCompletions).ok());
  EXPECT_FALSE(
      hasher->prompt_tokens(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})",
                            server::Endpoint::kChatCompletions)
          .ok());
  EXPECT_FALSE(PromptHasher::load("/nonexistent/model").ok());
}

// ---- the server's event feed ----------------------------------------------

class KvEventFeedTest : public ::testing::Test {
 protected:
  void make(int32_t max_pending_events, size_t feed_capacity) {
    kv::KvCacheConfig config;
    config.num_blocks = 64;
    config.block_size = 4;
    config.max_pending_events = max_pending_events;
    kv_ = std::move(kv::KvCacheManager::create(config)).value();
    runner_ = std::make_unique<engine::testing::FakeModelRunner>(64, 4);
    // Not started: visit_kv_cache runs on the calling thread, so the test may
    // drive the KV manager directly between reads.
    engine_ = std::make_unique<engine::Engine>(engine::EngineConfig{}, *runner_, *kv_);
    feed_ = std::make_unique<server::KvEventFeed>(*engine_, feed_capacity);
  }
  // Caches the full blocks of `tokens` in `ns`.
  void prefill(const std::string& ns, std::vector<int32_t> tokens) {
    ASSERT_TRUE(kv_->allocate_sequence(next_seq_, ns, tokens).ok());
    ASSERT_TRUE(kv_->mark_computed(next_seq_, static_cast<int64_t>(tokens.size())).ok());
    ASSERT_TRUE(kv_->free_sequence(next_seq_).ok());
    ++next_seq_;
  }
  static std::vector<int32_t> tokens(int32_t n, int32_t first) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < n; ++i) t.push_back(first + i);
    return t;
  }

  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<engine::testing::FakeModelRunner> runner_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<server::KvEventFeed> feed_;
  int64_t next_seq_ = 1;
};

TEST_F(KvEventFeedTest, PagesCarryEveryEventOnceInOrderAndAreCutAtMaxEvents) {
  make(1024, 1024);
  prefill("a", tokens(13, 1));  // 3 blocks
  auto p = feed_->read(0, std::nullopt, 2);
  EXPECT_FALSE(p.snapshot);
  EXPECT_TRUE(p.more);
  ASSERT_EQ(p.events.size(), 2u);
  EXPECT_EQ(p.events[0].sequence_number, 1u);
  EXPECT_EQ(p.events[1].parent_key_hash, p.events[0].key_hash);
  EXPECT_EQ(p.last, 2u);
  p = feed_->read(2, std::nullopt, 2);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_FALSE(p.more);
  EXPECT_EQ(p.last, 3u);
  EXPECT_TRUE(feed_->read(3, std::nullopt, 10).events.empty());
  ASSERT_EQ(kv_->evict(1), 1);
  p = feed_->read(3, std::nullopt, 10);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_FALSE(p.events[0].stored);
  EXPECT_EQ(p.last, 4u);
}

TEST_F(KvEventFeedTest, ANamespaceReaderSeesOnlyItsOwnBlocks) {
  make(1024, 1024);
  prefill("a", tokens(9, 1));    // 2 blocks
  prefill("b", tokens(5, 50));   // 1 block
  const auto only_b = feed_->read(0, std::string("b"), 100);
  ASSERT_EQ(only_b.events.size(), 1u);
  // A namespace reader counts in its own sequence: global numbers would let it
  // count other tenants' blocks in the gaps (docs/SECURITY.md).
  EXPECT_EQ(only_b.events[0].sequence_number, 1u) << "b's first event";
  EXPECT_EQ(only_b.events[0].key_hash, PromptHasher::block_keys(kv::namespace_seed("b"), tokens(5, 50), 4)[0]);
  EXPECT_EQ(only_b.last, 1u);
  EXPECT_TRUE(feed_->read(1, std::string("b"), 100).events.empty());
  EXPECT_EQ(feed_->read(0, std::string("a"), 100).events.size(), 2u);
  EXPECT_EQ(feed_->read(0, std::nullopt, 100).events.size(), 3u);
  EXPECT_TRUE(feed_->read(0, std::string("c"), 100).events.empty());
}

// A tenant's reader follows its whole namespace group: its own namespace and
// its salted users', in one sequence; never a namespace of another tenant,
// even one whose name looks like a user of it.
TEST_F(KvEventFeedTest, ATenantReaderSeesItsSaltedUsersEventsAndNoOtherTenants) {
  make(1024, 1024);
  using server::ApiKeyStore;
  const std::string acme = ApiKeyStore::cache_namespace("acme");
  const std::string alice = ApiKeyStore::cache_namespace("acme", "alice");
  const std::string bob = ApiKeyStore::cache_namespace("acme", "bob");
  // A tenant named so that its namespace starts like a user of acme's.
  const std::string lookalike = ApiKeyStore::cache_namespace("acme/user:5:alice");
  const std::string globex = ApiKeyStore::cache_namespace("globex");
  EXPECT_EQ(server::KvEventFeed::group_of(alice), acme);
  EXPECT_EQ(server::KvEventFeed::group_of(lookalike), lookalike);
  EXPECT_EQ(server::KvEventFeed::group_of(ApiKeyStore::cache_namespace("a/b", "c/d")),
            ApiKeyStore::cache_namespace("a/b"));
  prefill(acme, tokens(5, 1));        // 1 block
  prefill(alice, tokens(9, 20));      // 2 blocks
  prefill(globex, tokens(5, 40));     // 1 block
  prefill(bob, tokens(5, 60));        // 1 block
  prefill(lookalike, tokens(5, 80));  // 1 block
  std::set<uint64_t> acme_keys;
  for (const auto& [ns, first, n] : std::vector<std::tuple<std::string, int32_t, int32_t>>{
           {acme, 1, 5}, {alice, 20, 9}, {bob, 60, 5}})
    for (uint64_t k : PromptHasher::block_keys(kv::namespace_seed(ns), tokens(n, first), 4)) acme_keys.insert(k);
  ASSERT_EQ(acme_keys.size(), 4u);

  const auto page = feed_->read(0, acme, 100);
  EXPECT_FALSE(page.snapshot);
  ASSERT_EQ(page.events.size(), 4u) << "acme's own block and its users' three";
  for (size_t i = 0; i < page.events.size(); ++i) {
    EXPECT_EQ(page.events[i].sequence_number, i + 1) << "one sequence for the whole group, no gaps for others";
    EXPECT_EQ(acme_keys.count(page.events[i].key_hash), 1u) << "an event outside acme's group";
  }
  EXPECT_EQ(page.last, 4u);
  EXPECT_EQ(feed_->read(0, lookalike, 100).events.size(), 1u) << "the look-alike tenant sees only its own";
  EXPECT_EQ(feed_->read(0, globex, 100).events.size(), 1u);
  EXPECT_EQ(feed_->read(0, std::nullopt, 100).events.size(), 6u) << "the admin sees every namespace";
  const auto user = feed_->read(0, alice, 100);
  EXPECT_TRUE(user.events.empty() && !user.snapshot) << "a user namespace is no scope of its own";
  // Dropping globex's block adds nothing to acme's sequence; dropping bob's does.
  ASSERT_EQ(kv_->drop_namespace(globex), 1);
  EXPECT_TRUE(feed_->read(4, acme, 100).events.empty());
  ASSERT_EQ(kv_->drop_namespace(bob), 1);
  const auto removed = feed_->read(4, acme, 100);
  ASSERT_EQ(removed.events.size(), 1u);
  EXPECT_FALSE(removed.events[0].stored);
  EXPECT_EQ(removed.events[0].sequence_number, 5u);

  // A reader behind the ring gets a snapshot of its group only.
  feed_.reset();
  engine_.reset();
  make(1024, 2);
  prefill(acme, tokens(5, 1));
  prefill(alice, tokens(9, 20));
  prefill(bob, tokens(5, 60));
  prefill(globex, tokens(9, 40));
  const auto snap = feed_->read(0, acme, 100);
  EXPECT_TRUE(snap.snapshot);
  ASSERT_EQ(snap.events.size(), 4u);
  for (const auto& e : snap.events) EXPECT_EQ(acme_keys.count(e.key_hash), 1u) << "a snapshot event outside acme's group";
}

TEST_F(KvEventFeedTest, SaltedUserNamespacesDoNotPileUpAndTenantReadersKeepTheirPlace) {
  make(1 << 16, 8);
  // The tenant's block stays referenced, so the users' churn never evicts it.
  ASSERT_TRUE(kv_->allocate_sequence(1'000'000, "t", tokens(5, 1)).ok());
  ASSERT_TRUE(kv_->mark_computed(1'000'000, 5).ok());
  auto own = feed_->read(0, std::string("t"), 100);  // a tenant's reader: "t" is kept from now on
  ASSERT_EQ(own.events.size(), 1u);
  for (int32_t u = 0; u < 1000; ++u) {
    // Users of "t", and of "s", which nobody reads.
    prefill((u % 2 == 0 ? "t/user:" : "s/user:") + std::to_string(u), tokens(5, 100 + u));
    if (u % 10 == 0) (void)feed_->read(0, std::nullopt, 1);  // drains the manager into the ring
  }
  (void)feed_->read(0, std::nullopt, 1);
  EXPECT_LE(feed_->groups_tracked(), 2u) << "users count in their tenant's group: t, and s while in the ring";
  // The tenant's reader fell behind the ring (its users' events filled it):
  // a snapshot of its group, then it continues in its own numbering.
  const auto behind = feed_->read(own.last, std::string("t"), 1000);
  EXPECT_TRUE(behind.snapshot);
  EXPECT_FALSE(behind.events.empty());
  prefill("t", tokens(5, 5000));
  const auto next = feed_->read(behind.last, std::string("t"), 100);
  EXPECT_FALSE(next.snapshot);
  ASSERT_GE(next.events.size(), 1u);
  EXPECT_EQ(next.events[0].sequence_number, behind.last + 1);
  const auto late = feed_->read(0, std::string("s"), 100);
  EXPECT_TRUE(late.snapshot) << "a group first read after others were forgotten starts from a snapshot";
}

TEST_F(KvEventFeedTest, AReaderBehindTheRingGetsASnapshotConsistentWithLast) {
  make(1024, 3);
  prefill("a", tokens(21, 1));  // 5 blocks, events 1..5; the ring keeps 3..5
  auto p = feed_->read(0, std::nullopt, 100);
  EXPECT_TRUE(p.snapshot);
  EXPECT_EQ(p.last, 5u);
  ASSERT_EQ(p.events.size(), 5u);
  EXPECT_EQ(p.events[0].parent_key_hash, 0u);
  for (size_t i = 1; i < p.events.size(); ++i) EXPECT_EQ(p.events[i].parent_key_hash, p.events[i - 1].key_hash);
  p = feed_->read(2, std::nullopt, 100);
  EXPECT_FALSE(p.snapshot) << "events 3..5 are still in the ring";
  EXPECT_EQ(p.events.size(), 3u);
  EXPECT_TRUE(feed_->read(99, std::nullopt, 100).snapshot) << "ahead of the feed: another process";
  EXPECT_EQ(feed_->read(0, std::string("b"), 100).events.size(), 0u) << "a snapshot is filtered too";
}

TEST_F(KvEventFeedTest, EventsTheManagerDroppedBeforeADrainForceASnapshot) {
  make(2, 1024);
  prefill("a", tokens(17, 1));  // 4 blocks; the manager keeps events 3, 4 only
  const auto p = feed_->read(0, std::nullopt, 100);
  EXPECT_TRUE(p.snapshot);
  EXPECT_EQ(p.events.size(), 4u);
  EXPECT_EQ(p.last, 4u);
  prefill("a", tokens(9, 200));  // 2 more blocks: events 5, 6, drained in time
  const auto q = feed_->read(4, std::nullopt, 100);
  EXPECT_FALSE(q.snapshot);
  EXPECT_EQ(q.events.size(), 2u);
}

}  // namespace
}  // namespace pagoda::router
