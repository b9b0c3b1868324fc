// Per-tenant quotas: requests in flight, a tokens-per-minute bucket with
// refunds, refusals that say when to retry, and limits read from the api-keys
// file (per tenant, not per key).

#include <gtest/gtest.h>

#include "pagoda/server/api_keys.h"
#include "pagoda/server/tenant_quotas.h"

namespace pagoda::server {
namespace {

struct FakeTime {
  double now = 1000.0;
};

TEST(TenantQuotas, RequestsInFlightAreCappedPerTenant) {
  FakeTime t;
  TenantQuotas q([&] { return t.now; });
  TenantLimits limits;
  limits.max_requests_in_flight = 2;
  EXPECT_FALSE(q.admit("a", limits, 10).has_value());
  EXPECT_FALSE(q.admit("a", limits, 10).has_value());
  auto refused = q.admit("a", limits, 10);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, Refusal::kTenantQueue);
  EXPECT_TRUE(refused->ever_possible);
  EXPECT_FALSE(q.admit("b", limits, 10).has_value()) << "b has its own count";
  q.release("a", limits, 10, 10);
  EXPECT_EQ(q.requests_in_flight("a"), 1);
  EXPECT_FALSE(q.admit("a", limits, 10).has_value());
}

// A batched request's prompts each count as a request in flight.
TEST(TenantQuotas, ABatchCountsEachPrompt) {
  FakeTime t;
  TenantQuotas q([&] { return t.now; });
  TenantLimits limits;
  limits.max_requests_in_flight = 4;
  EXPECT_FALSE(q.admit("a", limits, 10, 3).has_value());
  EXPECT_EQ(q.requests_in_flight("a"), 3);
  auto full = q.admit("a", limits, 10, 2);
  ASSERT_TRUE(full.has_value());
  EXPECT_TRUE(full->ever_possible) << "fits once the first batch is done";
  auto never = q.admit("a", limits, 10, 5);
  ASSERT_TRUE(never.has_value());
  EXPECT_FALSE(never->ever_possible) << "more prompts than the whole limit";
  EXPECT_NE(never->message.find("at most 4 prompts"), std::string::npos) << never->message;
  q.release("a", limits, 10, 10, 3);
  EXPECT_EQ(q.requests_in_flight("a"), 0);
  EXPECT_FALSE(q.admit("a", limits, 10, 4).has_value());
}

TEST(TenantQuotas, TokensPerMinuteRefillAndRefundAndSayWhenToRetry) {
  FakeTime t;
  TenantQuotas q([&] { return t.now; });
  TenantLimits limits;
  limits.tokens_per_minute = 600;  // 10 per second
  EXPECT_FALSE(q.admit("a", limits, 500).has_value());
  auto refused = q.admit("a", limits, 200);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, Refusal::kTokensPerMinute);
  EXPECT_EQ(refused->retry_after_seconds, 10) << "100 tokens short at 10 per second";
  t.now += 10;
  EXPECT_FALSE(q.admit("a", limits, 200).has_value()) << "refilled";
  // The first request used 50 of its 500: 450 come back.
  q.release("a", limits, 500, 50);
  EXPECT_FALSE(q.admit("a", limits, 400).has_value());
  EXPECT_TRUE(q.admit("a", limits, 100).has_value());
  // Never more than one minute's budget, however long the tenant waits.
  t.now += 3600;
  EXPECT_FALSE(q.admit("a", limits, 600).has_value());
  EXPECT_TRUE(q.admit("a", limits, 1).has_value());
}

TEST(TenantQuotas, ARequestOverTheWholeBudgetIsRefusedForGood) {
  TenantQuotas q;
  TenantLimits limits;
  limits.tokens_per_minute = 1000;
  auto refused = q.admit("a", limits, 1001);
  ASSERT_TRUE(refused.has_value());
  EXPECT_FALSE(refused->ever_possible);
  EXPECT_EQ(q.requests_in_flight("a"), 0) << "nothing reserved on a refusal";
}

TEST(TenantLimitsInTheKeysFile, AreReadPerTenantAndChecked) {
  auto store = ApiKeyStore::parse(R"({"keys": [
      {"key": "k1", "tenant": "a", "limits": {"max_requests_in_flight": 4, "tokens_per_minute": 9000, "max_kv_blocks": 64}},
      {"key": "k2", "tenant": "a"},
      {"key": "k3", "tenant": "b"}]})",
                                  "keys.json");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto a2 = store->identify("Bearer k2");
  ASSERT_TRUE(a2 && a2->limits);
  EXPECT_EQ(a2->limits->max_requests_in_flight, 4) << "a's second key gets a's limits";
  EXPECT_EQ(a2->limits->tokens_per_minute, 9000);
  EXPECT_EQ(a2->limits->max_kv_blocks, 64);
  EXPECT_FALSE(store->identify("Bearer k3")->limits.has_value()) << "b uses the server's defaults";
  ASSERT_EQ(store->tenant_limits().size(), 1u);
  EXPECT_EQ(store->tenants(), (std::vector<std::string>{"a", "b"}));
  for (const char* bad : {
           R"({"keys": [{"key": "k", "tenant": "t", "limits": {"tokens_per_minute": -1}}]})",
           R"({"keys": [{"key": "k", "tenant": "t", "limits": {"tokens_per_minit": 5}}]})",
           R"({"keys": [{"key": "k", "tenant": "t", "limits": {"max_kv_blocks": 1.5}}]})",
           R"({"keys": [{"key": "k", "tenant": "t", "limits": {"max_kv_blocks": 99999999999}}]})",
           R"({"keys": [{"key": "k", "tenant": "t", "limits": []}]})",
           R"({"keys": [{"key": "k", "tenant": "t", "limits": {"max_kv_blocks": 1}},
                        {"key": "j", "tenant": "t", "limits": {"max_kv_blocks": 2}}]})"}) {
    auto s = ApiKeyStore::parse(bad, "keys.json");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("keys["), std::string::npos) << s.status().message();
  }
}

}  // namespace
}  // namespace pagoda::server
