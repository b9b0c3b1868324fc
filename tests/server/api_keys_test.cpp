// The api-keys file: the original format keeps working, "admin" marks keys
// that may read server-wide figures, and per-tenant usage stays per tenant.

#include <gtest/gtest.h>

#include "pagoda/server/api_keys.h"
#include "pagoda/server/tenant_usage.h"

namespace pagoda::server {
namespace {

TEST(ApiKeysAdmin, FilesWithoutAdminStillLoadAndNoKeyIsAdmin) {
  auto store = ApiKeyStore::parse(R"({"keys": [{"key": "sk-a", "tenant": "alice"}]})", "keys.json");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto id = store->identify("Bearer sk-a");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->tenant, "alice");
  EXPECT_FALSE(id->admin);
}

TEST(ApiKeysAdmin, AdminFlagIsReadPerKey) {
  auto store = ApiKeyStore::parse(
      R"({"keys": [{"key": "sk-a", "tenant": "alice", "admin": false}, {"key": "sk-ops", "tenant": "ops", "admin": true}]})",
      "keys.json");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_FALSE(store->identify("Bearer sk-a")->admin);
  EXPECT_TRUE(store->identify("Bearer sk-ops")->admin);
  EXPECT_FALSE(store->identify("Bearer sk-op").has_value());
  EXPECT_FALSE(store->identify("Bearer sk-opsx").has_value());
  EXPECT_FALSE(store->identify("sk-ops").has_value()) << "the Bearer scheme is required";
}

TEST(ApiKeysAdmin, AdminMustBeABoolean) {
  for (const char* bad : {R"({"keys": [{"key": "k", "tenant": "t", "admin": "yes"}]})",
                          R"({"keys": [{"key": "k", "tenant": "t", "admin": 1}]})",
                          R"({"keys": [{"key": "k", "tenant": "t", "admin": null}]})"}) {
    auto s = ApiKeyStore::parse(bad, "keys.json");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("keys[0].admin"), std::string::npos) << s.status().message();
  }
}

TEST(ApiKeysLimits, MinPriorityIsAnyIntegerAndNamedWhenBad) {
  auto store = ApiKeyStore::parse(
      R"({"keys": [{"key": "sk-a", "tenant": "a", "limits": {"min_priority": -3}}, {"key": "sk-b", "tenant": "b"}]})",
      "keys.json");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ(store->identify("Bearer sk-a")->limits->min_priority, -3);
  EXPECT_FALSE(store->identify("Bearer sk-b")->limits.has_value());
  for (const char* bad : {R"({"keys": [{"key": "k", "tenant": "t", "limits": {"min_priority": "low"}}]})",
                          R"({"keys": [{"key": "k", "tenant": "t", "limits": {"min_priority": 1e12}}]})",
                          R"({"keys": [{"key": "k", "tenant": "t", "limits": {"min_priority": 4294967296}}]})"}) {
    auto s = ApiKeyStore::parse(bad, "keys.json");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("keys[0].limits.min_priority"), std::string::npos) << s.status().message();
  }
}

TEST(ApiKeysAdmin, WithoutKeysEveryoneIsTheDefaultTenantAndAdmin) {
  auto id = ApiKeyStore().identify("");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->tenant, "default");
  EXPECT_TRUE(id->admin);
}

TEST(TenantUsageBook, TenantsSeeOnlyTheirOwnCounters) {
  TenantUsageBook book;
  book.record_accepted("alice");
  book.record_finished("alice", engine::Usage{10, 5, 4});
  book.record_refused("alice", Refusal::kTokensPerMinute);
  const TenantCounters a = book.counters("alice");
  EXPECT_EQ(a.requests_accepted, 1);
  EXPECT_EQ(a.requests_finished, 1);
  EXPECT_EQ(a.prompt_tokens, 10);
  EXPECT_EQ(a.completion_tokens, 5);
  EXPECT_EQ(a.cached_prompt_tokens, 4);
  EXPECT_EQ(a.requests_refused[static_cast<int>(Refusal::kTokensPerMinute)], 1);
  const TenantCounters b = book.counters("bob");
  EXPECT_EQ(b.requests_accepted, 0);
  EXPECT_EQ(b.prompt_tokens, 0);
}

}  // namespace
}  // namespace pagoda::server
