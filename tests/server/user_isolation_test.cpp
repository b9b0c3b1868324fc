// Isolation inside a tenant, the server's side: which keys may salt their
// namespace with a user id (api-keys "user_salt"), what X-Pagoda-User does to
// the namespace, and the timer that holds first tokens back to a floor.

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "pagoda/server/api_keys.h"
#include "pagoda/server/first_token_floor.h"
#include "pagoda/server/user_salt.h"

namespace pagoda::server {
namespace {

using namespace std::chrono_literals;

ApiKeyStore keys() {
  auto store = ApiKeyStore::parse(R"({"keys": [
      {"key": "sk-plain", "tenant": "acme"},
      {"key": "sk-app", "tenant": "acme", "user_salt": true},
      {"key": "sk-strict", "tenant": "acme", "user_salt": "required"},
      {"key": "sk-off", "tenant": "acme", "user_salt": false}]})",
                                  "keys.json");
  EXPECT_TRUE(store.ok()) << store.status().to_string();
  return *store;
}

HttpRequest request(std::optional<std::string> user) {
  HttpRequest r;
  r.method = "POST";
  r.path = "/v1/completions";
  if (user) r.headers.emplace_back("x-pagoda-user", *user);  // header names are case-insensitive
  return r;
}

std::variant<RequestNamespace, ApiError> resolve(const std::string& key, std::optional<std::string> user) {
  const auto id = keys().identify("Bearer " + key);
  EXPECT_TRUE(id.has_value()) << key;
  return request_namespace(*id, request(std::move(user)));
}

TEST(UserSalt, TheRightIsReadPerKeyAndMustBeTrueFalseOrRequired) {
  const ApiKeyStore store = keys();
  EXPECT_EQ(store.identify("Bearer sk-plain")->user_salt, UserSalt::kNotAllowed);
  EXPECT_EQ(store.identify("Bearer sk-app")->user_salt, UserSalt::kAllowed);
  EXPECT_EQ(store.identify("Bearer sk-strict")->user_salt, UserSalt::kRequired);
  EXPECT_EQ(store.identify("Bearer sk-off")->user_salt, UserSalt::kNotAllowed);
  for (const char* bad : {R"({"keys": [{"key": "k", "tenant": "t", "user_salt": "yes"}]})",
                          R"({"keys": [{"key": "k", "tenant": "t", "user_salt": 1}]})",
                          R"({"keys": [{"key": "k", "tenant": "t", "user_salt": null}]})"}) {
    auto s = ApiKeyStore::parse(bad, "keys.json");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("keys[0].user_salt"), std::string::npos) << s.status().message();
  }
}

TEST(UserSalt, AKeyWithoutTheRightIsRefusedNamingTheHeader) {
  for (const char* key : {"sk-plain", "sk-off"}) {
    auto r = resolve(key, "alice");
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << key;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.http_status, 403);
    EXPECT_EQ(e.code, "user_salt_not_allowed");
    EXPECT_EQ(e.param, std::string(kUserSaltHeader));
    EXPECT_NE(e.message.find("X-Pagoda-User"), std::string::npos);
    // Without the header the same key works, in the tenant's namespace.
    auto plain = resolve(key, std::nullopt);
    ASSERT_TRUE(std::holds_alternative<RequestNamespace>(plain));
    EXPECT_EQ(std::get<RequestNamespace>(plain).cache_namespace, ApiKeyStore::cache_namespace("acme"));
  }
}

TEST(UserSalt, SaltedUsersGetNamespacesOfTheirOwn) {
  std::set<std::string> seen;
  for (const char* user : {"alice", "bob", "Alice", "alice2", "a"}) {
    auto r = resolve("sk-app", std::string(user));
    ASSERT_TRUE(std::holds_alternative<RequestNamespace>(r)) << user;
    const RequestNamespace& ns = std::get<RequestNamespace>(r);
    EXPECT_EQ(ns.user, user);
    EXPECT_TRUE(seen.insert(ns.cache_namespace).second) << user;
    // The strict key lands in the same namespace for the same user.
    auto strict = resolve("sk-strict", std::string(user));
    ASSERT_TRUE(std::holds_alternative<RequestNamespace>(strict));
    EXPECT_EQ(std::get<RequestNamespace>(strict).cache_namespace, ns.cache_namespace);
  }
  auto unsalted = resolve("sk-app", std::nullopt);
  ASSERT_TRUE(std::holds_alternative<RequestNamespace>(unsalted));
  EXPECT_TRUE(seen.insert(std::get<RequestNamespace>(unsalted).cache_namespace).second)
      << "the tenant's own namespace is none of its users'";
}

TEST(UserSalt, NoTenantAndUserPairAliasesAnother) {
  std::set<std::string> seen;
  for (const auto& [tenant, user] : std::vector<std::pair<std::string, std::string>>{
           {"a", "b/user:1:c"}, {"a/user:1:b", "c"}, {"a", ""}, {"a/user:0:", ""}, {"ab", "c"}, {"a", "bc"}})
    EXPECT_TRUE(seen.insert(ApiKeyStore::cache_namespace(tenant, user)).second) << tenant << " + " << user;
}

TEST(UserSalt, RequiredKeysMustNameTheUserAndBadIdsAreRefused) {
  auto missing = resolve("sk-strict", std::nullopt);
  ASSERT_TRUE(std::holds_alternative<ApiError>(missing));
  EXPECT_EQ(std::get<ApiError>(missing).http_status, 400);
  EXPECT_EQ(std::get<ApiError>(missing).code, "user_required");
  for (const std::string& bad : {std::string(""), std::string(257, 'u'), std::string("a b"), std::string("a\x01"),
                                std::string("caf\xc3\xa9")}) {
    auto r = resolve("sk-app", bad);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << bad;
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400);
    EXPECT_EQ(std::get<ApiError>(r).code, "invalid_user");
    EXPECT_EQ(std::get<ApiError>(r).param, std::string(kUserSaltHeader));
  }
  EXPECT_TRUE(std::holds_alternative<RequestNamespace>(resolve("sk-app", std::string(256, 'u'))));
}

TEST(UserSalt, WithoutKeysEveryCallerMaySalt) {
  const ApiKeyStore none;
  const auto id = none.identify("");
  ASSERT_TRUE(id.has_value());
  auto r = request_namespace(*id, request("alice"));
  ASSERT_TRUE(std::holds_alternative<RequestNamespace>(r));
  EXPECT_EQ(std::get<RequestNamespace>(r).cache_namespace, ApiKeyStore::cache_namespace("default", "alice"));
}

TEST(WakeTimer, WakesEachCallbackNoEarlierThanItsTimeAndInOrder) {
  WakeTimer timer;
  const auto start = std::chrono::steady_clock::now();
  std::mutex mutex;
  std::vector<std::pair<int, std::chrono::steady_clock::duration>> woke;
  for (int i : {3, 1, 2, 0}) {
    timer.wake_at(start + i * 40ms, [&, i] {
      std::lock_guard lock(mutex);
      woke.emplace_back(i, std::chrono::steady_clock::now() - start);
    });
  }
  for (int spin = 0; spin < 200; ++spin) {
    {
      std::lock_guard lock(mutex);
      if (woke.size() == 4) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard lock(mutex);
  ASSERT_EQ(woke.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(woke[i].first, i);
    EXPECT_GE(woke[i].second, i * 40ms) << i;
  }
  EXPECT_EQ(timer.pending(), 0u);
}

TEST(WakeTimer, CallbacksNotYetDueAreDroppedOnDestruction) {
  std::atomic<int> woke{0};
  {
    WakeTimer timer;
    timer.wake_at(std::chrono::steady_clock::now() + 1h, [&] { ++woke; });
    EXPECT_EQ(timer.pending(), 1u);
  }
  EXPECT_EQ(woke.load(), 0);
}

}  // namespace
}  // namespace pagoda::server
