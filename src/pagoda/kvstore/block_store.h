#pragma once
// BlockStore: one KV tier below the host tier (disk_tier.h, redis_tier.h),
// holding block records (block_record.h) under their stable keys
// (kv/stable_key.h). The engine reads from it when a request arrives (a hit
// is loaded into the host tier and promoted from there like any host hit) and
// hands it every block the host tier receives, to be written by the tier's own
// writer thread: writes never wait on I/O, and a full queue drops the write
// (counted).
//
// Thread safety: every method may be called from any thread, reads from
// several at once (the engine's reader pool, engine/lower_tier_loader.h);
// write_async from the engine's threads, stats from any.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/kv/stable_key.h"

namespace pagoda::kvstore {

// Counts of one tier since it was opened; latencies in fixed buckets (seconds).
struct TierIoStats {
  static constexpr std::array<double, 12> kLatencyBounds = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
                                                             5e-3,  10e-3,  25e-3,  50e-3,  100e-3, 1.0};
  bool enabled = false;          // the tier is configured
  bool connected = true;         // redis: the last command reached the server
  int64_t hit_blocks = 0;        // blocks read back intact
  int64_t miss_blocks = 0;       // lookups that ended a run (absent, unreachable)
  int64_t corrupt_blocks = 0;    // records refused (torn, short, wrong key, bad checksum): deleted, a miss
  int64_t bytes_read = 0;        // payload bytes of hits
  int64_t bytes_written = 0;     // payload bytes written
  int64_t blocks_written = 0;
  int64_t writes_dropped = 0;    // queue full, tier down or full (disk), not written
  int64_t write_errors = 0;      // writes the OS or server refused
  int64_t blocks_evicted = 0;    // removed to stay under the size bound (disk)
  int64_t stored_blocks = 0;     // gauge (disk: what the index holds)
  int64_t stored_bytes = 0;      // gauge, records incl. headers (disk)
  int64_t capacity_bytes = 0;    // disk: the size bound
  bool writes_stopped = false;   // disk: the last write found the disk full
  // Per block read: how long a hit took (read + verify).
  std::array<int64_t, kLatencyBounds.size() + 1> read_latency_counts{};  // last bucket: +Inf
  double read_latency_sum = 0.0;
  void observe_read(double seconds) {
    size_t i = 0;
    while (i < kLatencyBounds.size() && seconds > kLatencyBounds[i]) ++i;
    ++read_latency_counts[i];
    read_latency_sum += seconds;
  }
};

class BlockStore {
 public:
  virtual ~BlockStore() = default;
  virtual std::string_view name() const = 0;  // "disk", "redis": the metrics' tier label
  // Reads keys[0], keys[1], ... into outs[0], outs[1], ... (each exactly
  // one block's payload, anywhere: a host-pool block is written in place)
  // until the first block that is absent or refused; returns how many were
  // read. A refused record is deleted and is a miss; outs[i] past the count
  // hold garbage. Never fails otherwise (an unreachable tier is a miss).
  virtual int32_t read_into(std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs) = 0;
  // read_into with the blocks in consecutive `block_bytes` slices of `out`
  // (out.size() == keys.size() * block_bytes; 0 otherwise).
  int32_t read_prefix(std::span<const kv::StableKey> keys, std::span<std::byte> out) {
    if (keys.empty() || out.size() % keys.size() != 0) return 0;
    const size_t bb = out.size() / keys.size();
    std::vector<std::span<std::byte>> outs;
    outs.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) outs.push_back(out.subspan(i * bb, bb));
    return read_into(keys, outs);
  }
  // Queues `block` for writing under `key`; returns at once. Skips a key this
  // tier knows it holds; drops (counted) when the queue is full.
  virtual void write_async(const kv::StableKey& key, std::vector<std::byte> block) = 0;
  // Whether the tier is known to hold `key` already (cheap; false if unsure).
  virtual bool probably_holds(const kv::StableKey& key) const = 0;
  // Waits until every write queued so far is done (tests, benchmarks).
  virtual void flush() = 0;
  virtual TierIoStats stats() const = 0;
  // One phrase for the start-up "KV tiers" line.
  virtual std::string describe() const = 0;
};

}  // namespace pagoda::kvstore
