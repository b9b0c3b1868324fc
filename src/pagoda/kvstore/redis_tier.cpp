#include "pagoda/kvstore/redis_tier.h"

#include <hiredis/hiredis.h>

#include <charconv>
#include <fmt/format.h>

#include "pagoda/kvstore/block_record.h"

namespace pagoda::kvstore {
namespace {

constexpr size_t kReadBatch = 32;
constexpr size_t kWriteBatch = 64;
constexpr size_t kWrittenMemory = 1 << 16;

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// The next pipelined reply; null when the connection failed.
Reply next_reply(redisContext* ctx) {
  void* raw = nullptr;
  if (redisGetReply(ctx, &raw) != REDIS_OK) return nullptr;
  return Reply(static_cast<redisReply*>(raw));
}

}  // namespace

StatusOr<RedisEndpoint> parse_redis_url(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.substr(0, kScheme.size()) != kScheme)
    return invalid_argument_error("--kv-offload-redis {}: expected redis://HOST:PORT[/DB]", url);
  std::string_view rest = url.substr(kScheme.size());
  RedisEndpoint e;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      const auto [p, ec] = std::from_chars(db.data(), db.data() + db.size(), e.db);
      if (ec != std::errc() || p != db.data() + db.size() || e.db < 0)
        return invalid_argument_error("--kv-offload-redis {}: database '{}' is not a number >= 0", url, db);
    }
    rest = rest.substr(0, slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    const std::string_view port = rest.substr(colon + 1);
    const auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), e.port);
    if (ec != std::errc() || p != port.data() + port.size() || e.port < 1 || e.port > 65535)
      return invalid_argument_error("--kv-offload-redis {}: port '{}' is not in [1, 65535]", url, port);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return invalid_argument_error("--kv-offload-redis {}: no host", url);
  e.host = std::string(rest);
  return e;
}

std::string RedisTier::redis_key(const kv::StableKey& key) { return "pagoda:kv:1:" + kv::stable_key_hex(key); }

RedisTier::RedisTier(const RedisTierOptions& options) : options_(options) {
  stats_.enabled = true;
}

StatusOr<redisContext*> RedisTier::connect() const {
  const RedisEndpoint& e = options_.endpoint;
  redisContext* ctx = redisConnectWithTimeout(e.host.c_str(), e.port, to_timeval(options_.timeout));
  if (ctx == nullptr) return io_error("redis {}:{}: cannot allocate a connection", e.host, e.port);
  if (ctx->err != 0) {
    const std::string why = ctx->errstr;
    redisFree(ctx);
    return io_error("redis {}:{}: {}", e.host, e.port, why);
  }
  redisSetTimeout(ctx, to_timeval(options_.timeout));
  if (e.db != 0) {
    Reply r(static_cast<redisReply*>(redisCommand(ctx, "SELECT %d", e.db)));
    if (!r || r->type == REDIS_REPLY_ERROR) {
      const std::string why = r ? std::string(r->str, r->len) : std::string(ctx->errstr);
      redisFree(ctx);
      return io_error("redis {}:{}: SELECT {}: {}", e.host, e.port, e.db, why);
    }
  }
  return ctx;
}

StatusOr<std::unique_ptr<RedisTier>> RedisTier::open(const RedisTierOptions& options) {
  if (options.block_bytes == 0) return invalid_argument_error("redis KV tier: block size in bytes is 0");
  if (options.ttl_seconds < 0)
    return invalid_argument_error("--kv-offload-redis-ttl {}: must be >= 0 seconds (0: no expiry)", options.ttl_seconds);
  std::unique_ptr<RedisTier> tier(new RedisTier(options));
  PAGODA_ASSIGN_OR_RETURN(tier->reader_.ctx, tier->connect());
  tier->writer_ = std::thread([t = tier.get()] { t->writer_loop(); });
  return tier;
}

RedisTier::~RedisTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  drop(reader_);
  drop(writer_conn_);
}

void RedisTier::drop(Connection& c) {
  if (c.ctx != nullptr) redisFree(c.ctx);
  c.ctx = nullptr;
  c.next_try = std::chrono::steady_clock::now() + kReconnectInterval;
}

redisContext* RedisTier::ensure(Connection& c) {
  if (c.ctx != nullptr) return c.ctx;
  const auto now = std::chrono::steady_clock::now();
  if (now < c.next_try) return nullptr;
  auto ctx = connect();
  if (!ctx.ok()) {
    c.next_try = now + kReconnectInterval;
    return nullptr;
  }
  c.ctx = *ctx;
  return c.ctx;
}

int32_t RedisTier::read_into(std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs) {
  const size_t bb = options_.block_bytes;
  if (outs.size() != keys.size() || keys.empty()) return 0;
  for (const std::span<std::byte>& out : outs)
    if (out.size() != bb) return 0;
  std::lock_guard read_lock(read_mutex_);
  // A connection made before a server restart fails on first use: then one
  // fresh connection is tried at once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool fresh = reader_.ctx == nullptr;
    redisContext* ctx = ensure(reader_);
    if (ctx == nullptr) break;
    bool failed = false;
    const int32_t n = read_into_on(ctx, keys, outs, failed);
    if (!failed) return n;
    drop(reader_);
    if (fresh || n > 0) return n;
    reader_.next_try = {};
  }
  std::lock_guard lock(mutex_);
  stats_.connected = false;
  ++stats_.miss_blocks;
  written_.clear();  // it may come back empty
  return 0;
}

int32_t RedisTier::read_into_on(redisContext* ctx, std::span<const kv::StableKey> keys,
                                std::span<const std::span<std::byte>> outs, bool& failed) {
  const size_t bb = options_.block_bytes;
  int32_t n = 0;
  std::vector<std::string> names;
  for (size_t base = 0; base < keys.size(); base += kReadBatch) {
    const size_t count = std::min(kReadBatch, keys.size() - base);
    const auto start = std::chrono::steady_clock::now();
    names.clear();
    for (size_t i = 0; i < count; ++i) {
      names.push_back(redis_key(keys[base + i]));
      redisAppendCommand(ctx, "GET %b", names.back().data(), names.back().size());
    }
    bool run_on = true;
    std::vector<size_t> refused;
    int64_t hits = 0;
    for (size_t i = 0; i < count; ++i) {
      Reply r = next_reply(ctx);  // every reply is read, to keep the connection in step
      if (!r) {
        failed = true;
        return n;
      }
      if (!run_on) continue;
      if (r->type != REDIS_REPLY_STRING) {
        run_on = false;
        continue;
      }
      const std::span<const std::byte> record(reinterpret_cast<const std::byte*>(r->str), r->len);
      if (!decode_record(record, keys[base + i], outs[base + i]).ok()) {
        refused.push_back(i);
        run_on = false;
        continue;
      }
      ++hits;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t i : refused) {
      Reply r(static_cast<redisReply*>(redisCommand(ctx, "DEL %b", names[i].data(), names[i].size())));
      if (!r) failed = true;
    }
    std::lock_guard lock(mutex_);
    stats_.connected = !failed;
    stats_.corrupt_blocks += static_cast<int64_t>(refused.size());
    stats_.hit_blocks += hits;
    stats_.bytes_read += hits * static_cast<int64_t>(bb);
    for (int64_t i = 0; i < hits; ++i) stats_.observe_read(seconds / static_cast<double>(count));
    n += static_cast<int32_t>(hits);
    if (!run_on || failed) {
      ++stats_.miss_blocks;
      return n;
    }
  }
  return n;
}

void RedisTier::write_async(const kv::StableKey& key, std::vector<std::byte> block) {
  if (block.size() != options_.block_bytes) return;
  {
    std::lock_guard lock(mutex_);
    if (written_.contains(key)) return;
    if (static_cast<int32_t>(queue_.size()) >= options_.max_queued_writes) {
      ++stats_.writes_dropped;
      return;
    }
    queue_.push_back(Job{key, std::move(block)});
  }
  work_cv_.notify_one();
}

bool RedisTier::probably_holds(const kv::StableKey& key) const {
  std::lock_guard lock(mutex_);
  return written_.contains(key);
}

void RedisTier::flush() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void RedisTier::writer_loop() {
  std::unique_lock lock(mutex_);
  std::vector<Job> batch;
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    batch.clear();
    while (!queue_.empty() && batch.size() < kWriteBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    busy_ = true;
    lock.unlock();
    write_batch(batch);
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void RedisTier::write_batch(std::vector<Job>& jobs) {
  std::vector<bool> stored(jobs.size(), false);
  int64_t errors = 0;
  bool failed = true;
  // A connection made before a server restart fails on first use: then one
  // fresh connection is tried at once.
  for (int attempt = 0; attempt < 2 && failed; ++attempt) {
    const bool fresh = writer_conn_.ctx == nullptr;
    redisContext* ctx = ensure(writer_conn_);
    if (ctx == nullptr) break;
    if (fresh) {  // the server may have restarted empty: forget what it held
      std::lock_guard lock(mutex_);
      written_.clear();
    }
    errors = 0;
    failed = !write_batch_on(ctx, jobs, stored, errors);
    if (!failed) break;
    drop(writer_conn_);
    if (fresh) break;
    writer_conn_.next_try = {};
  }
  std::lock_guard lock(mutex_);
  stats_.connected = !failed;
  stats_.write_errors += errors + (failed ? 1 : 0);
  if (failed) written_.clear();  // it may come back empty
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (failed || !stored[i]) {
      ++stats_.writes_dropped;
      continue;
    }
    ++stats_.blocks_written;
    stats_.bytes_written += static_cast<int64_t>(jobs[i].block.size());
    if (written_.size() >= kWrittenMemory) written_.clear();
    written_.insert(jobs[i].key);
  }
}

bool RedisTier::write_batch_on(redisContext* ctx, const std::vector<Job>& jobs, std::vector<bool>& stored,
                               int64_t& errors) {
  for (const Job& job : jobs) {
    const std::vector<std::byte> record = encode_record(job.key, job.block);
    const std::string name = redis_key(job.key);
    if (options_.ttl_seconds > 0)
      redisAppendCommand(ctx, "SET %b %b EX %lld", name.data(), name.size(), record.data(), record.size(),
                         static_cast<long long>(options_.ttl_seconds));
    else
      redisAppendCommand(ctx, "SET %b %b", name.data(), name.size(), record.data(), record.size());
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    Reply r = next_reply(ctx);
    if (!r) return false;
    if (r->type == REDIS_REPLY_ERROR) ++errors;
    else stored[i] = true;
  }
  return true;
}

TierIoStats RedisTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::string RedisTier::describe() const {
  const RedisEndpoint& e = options_.endpoint;
  return fmt::format("redis {}:{}/{} (ttl {})", e.host, e.port, e.db,
                     options_.ttl_seconds > 0 ? fmt::format("{} s", options_.ttl_seconds) : std::string("none"));
}

}  // namespace pagoda::kvstore
