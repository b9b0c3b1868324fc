#pragma once
// RedisTier: KV blocks in a redis server, shared by every pagoda process that
// points at it (replicas, restarts). Values are block records
// (block_record.h) under "pagoda:kv:1:<stable key hex>", so the tenant
// namespace and the model fingerprint are part of every key.
//
// Reads run on the caller's thread: one pipelined GET per block of a run (in
// batches), the run ending at the first block absent or refused (a refused
// record is deleted). Writes go through a bounded queue to a writer thread
// with its own connection, which pipelines SETs (with EX ttl when a TTL is
// given). A connection that fails marks the tier down: lookups are misses and
// writes are dropped (counted) until a reconnect, tried at most once per
// kReconnectInterval, succeeds.
//
// Thread safety: all methods from any thread (one connection per side, each
// under its own mutex).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include "pagoda/core/status.h"
#include "pagoda/kvstore/block_store.h"

struct redisContext;

namespace pagoda::kvstore {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
};
// "redis://HOST:PORT[/DB]" (PORT optional: 6379). kInvalidArgument naming the flag.
StatusOr<RedisEndpoint> parse_redis_url(std::string_view url);

struct RedisTierOptions {
  RedisEndpoint endpoint;
  int64_t ttl_seconds = 0;  // 0: no expiry
  size_t block_bytes = 0;
  int32_t max_queued_writes = 512;
  std::chrono::milliseconds timeout{500};  // connect and each command
};

class RedisTier final : public BlockStore {
 public:
  static constexpr std::chrono::seconds kReconnectInterval{1};
  // Connects (and SELECTs the db) once to check the server is there: kIoError
  // naming the host and port when it is not.
  static StatusOr<std::unique_ptr<RedisTier>> open(const RedisTierOptions& options);
  ~RedisTier() override;

  std::string_view name() const override { return "redis"; }
  int32_t read_into(std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs) override;
  void write_async(const kv::StableKey& key, std::vector<std::byte> block) override;
  bool probably_holds(const kv::StableKey& key) const override;
  void flush() override;
  TierIoStats stats() const override;
  std::string describe() const override;

  static std::string redis_key(const kv::StableKey& key);

 private:
  struct Connection {
    redisContext* ctx = nullptr;
    std::chrono::steady_clock::time_point next_try{};
  };
  struct Job {
    kv::StableKey key;
    std::vector<std::byte> block;
  };
  explicit RedisTier(const RedisTierOptions& options);
  // A live connection, reconnecting when allowed; nullptr while down.
  redisContext* ensure(Connection& c);
  void drop(Connection& c);
  StatusOr<redisContext*> connect() const;
  void writer_loop();
  void write_batch(std::vector<Job>& jobs);
  // One attempt on `ctx`; false (or `failed`) when the connection broke.
  bool write_batch_on(redisContext* ctx, const std::vector<Job>& jobs, std::vector<bool>& stored, int64_t& errors);
  int32_t read_into_on(redisContext* ctx, std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs,
                         bool& failed);

  RedisTierOptions options_;
  std::mutex read_mutex_;
  Connection reader_;
  Connection writer_conn_;  // writer thread only

  mutable std::mutex mutex_;  // queue, stats, written keys
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::unordered_set<kv::StableKey, kv::StableKeyHash> written_;  // bounded memory of keys this process stored
  TierIoStats stats_;
  std::thread writer_;
};

}  // namespace pagoda::kvstore
