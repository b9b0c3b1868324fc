// The redis tier against a redis-server of its own: pipelined writes read
// back; a corrupt value is a miss and deleted; keys carry the namespace;
// the server killed mid-run makes reads misses and drops writes (no error,
// no hang), and a restarted server is reconnected to.

#include <hiredis/hiredis.h>

#include <gtest/gtest.h>

#include "pagoda/kvstore/redis_tier.h"
#include "redis_server.h"

namespace pagoda::kvstore {
namespace {

constexpr size_t kBlockBytes = 2048;

kv::StableKey key_of(int i, std::string_view ns = "ns") {
  return kv::stable_block_key(kv::stable_namespace_root("fp", ns), &i, 1);
}
std::vector<std::byte> block_of(int i) {
  std::vector<std::byte> b(kBlockBytes);
  for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::byte>((j * 13 + static_cast<size_t>(i)) & 0xff);
  return b;
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(server_.start());
  }
  // 300 ms per command keeps the server-down cases short; a test that needs every write to land
  // gives more (a loaded or sanitized run can take longer than 300 ms for one round trip).
  std::unique_ptr<RedisTier> open(std::chrono::milliseconds timeout = std::chrono::milliseconds(300)) {
    auto endpoint = parse_redis_url(server_.url());
    EXPECT_TRUE(endpoint.ok());
    auto t = RedisTier::open({.endpoint = *endpoint, .ttl_seconds = 60, .block_bytes = kBlockBytes,
                              .timeout = timeout});
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }
  int read_run(RedisTier& t, int n, std::string_view ns = "ns") {
    std::vector<kv::StableKey> keys;
    for (int i = 0; i < n; ++i) keys.push_back(key_of(i, ns));
    std::vector<std::byte> out(static_cast<size_t>(n) * kBlockBytes);
    const int32_t got = t.read_prefix(keys, out);
    for (int i = 0; i < got; ++i) {
      const auto expect = block_of(i);
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), out.begin() + static_cast<std::ptrdiff_t>(i * kBlockBytes)));
    }
    return got;
  }
  testing::RedisServer server_;
};

TEST(RedisUrlTest, ParsesAndRefusesByField) {
  auto e = parse_redis_url("redis://10.0.0.5:7000/3");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "10.0.0.5");
  EXPECT_EQ(e->port, 7000);
  EXPECT_EQ(e->db, 3);
  EXPECT_EQ(parse_redis_url("redis://cache").value().port, 6379);
  for (const char* bad : {"http://x:1", "redis://:80", "redis://h:0", "redis://h:99999", "redis://h:1/x"})
    EXPECT_EQ(parse_redis_url(bad).status().code(), StatusCode::kInvalidArgument) << bad;
}

TEST(RedisUnreachableTest, OpenFailsWithTheAddress) {
  const int port = testing::free_loopback_port();
  auto t = RedisTier::open({.endpoint = {.host = "127.0.0.1", .port = port}, .block_bytes = kBlockBytes});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(std::to_string(port)), std::string::npos) << t.status().to_string();
}

TEST_F(RedisTierTest, WritesReadBackAcrossClientsAndTenantsDoNotMeet) {
  auto writer = open(std::chrono::seconds(5));
  for (int i = 0; i < 5; ++i) writer->write_async(key_of(i), block_of(i));
  writer->flush();
  EXPECT_EQ(writer->stats().blocks_written, 5);
  auto reader = open(std::chrono::seconds(5));  // another process would see the same
  EXPECT_EQ(read_run(*reader, 7), 5);
  EXPECT_EQ(reader->stats().hit_blocks, 5);
  EXPECT_EQ(read_run(*reader, 3, "other-tenant"), 0);
  EXPECT_NE(RedisTier::redis_key(key_of(0)), RedisTier::redis_key(key_of(0, "other-tenant")));
}

TEST_F(RedisTierTest, ACorruptValueIsAMissAndDeleted) {
  auto t = open();
  for (int i = 0; i < 3; ++i) t->write_async(key_of(i), block_of(i));
  t->flush();
  redisContext* c = redisConnect("127.0.0.1", server_.port());
  ASSERT_TRUE(c != nullptr && c->err == 0);
  const std::string name = RedisTier::redis_key(key_of(1));
  freeReplyObject(redisCommand(c, "SETRANGE %b 100 %b", name.data(), name.size(), "garbage", size_t{7}));
  EXPECT_EQ(read_run(*t, 3), 1);
  EXPECT_EQ(t->stats().corrupt_blocks, 1);
  auto* exists = static_cast<redisReply*>(redisCommand(c, "EXISTS %b", name.data(), name.size()));
  ASSERT_NE(exists, nullptr);
  EXPECT_EQ(exists->integer, 0);
  freeReplyObject(exists);
  redisFree(c);
}

TEST_F(RedisTierTest, ServerDownIsAMissAndItIsReconnectedLater) {
  auto t = open();
  for (int i = 0; i < 2; ++i) t->write_async(key_of(i), block_of(i));
  t->flush();
  const int port = server_.port();
  server_.stop();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(read_run(*t, 2), 0);
  t->write_async(key_of(5), block_of(5));
  t->flush();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));  // bounded by the timeouts
  EXPECT_FALSE(t->stats().connected);
  EXPECT_GE(t->stats().writes_dropped, 1);
  // A fresh (empty) server on the same port: after the reconnect interval,
  // writes and reads work again.
  ASSERT_TRUE(server_.start(port));
  std::this_thread::sleep_for(RedisTier::kReconnectInterval + std::chrono::milliseconds(100));
  for (int i = 0; i < 2; ++i) t->write_async(key_of(i), block_of(i));
  t->flush();
  EXPECT_EQ(read_run(*t, 2), 2);
  EXPECT_TRUE(t->stats().connected);
}

}  // namespace
}  // namespace pagoda::kvstore
