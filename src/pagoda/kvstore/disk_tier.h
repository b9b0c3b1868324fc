#pragma once
// DiskTier: KV blocks in files under one directory, outliving the process.
//
//   DIR/LOCK              flock()ed while a server uses DIR: a second server
//                         pointed at the same DIR refuses to start (a clear
//                         error naming DIR); no read-only mode
//   DIR/index             written at a clean close and removed at open: keys,
//                         sizes and LRU order, so start-up reads one file
//   DIR/blocks/<key>.kvb  one record per block (block_record.h); written as
//                         <key>.tmp and renamed, so a crash leaves no torn .kvb
//
// At open: a valid index is loaded and deleted; without one (a crash, or it was
// deleted or is corrupt) the index is rebuilt by reading every block file's
// header (files whose header or size is wrong, and .tmp leftovers, are
// deleted). Reads check the whole record: a torn, short or corrupt file is a
// miss and is deleted, never served. Size-bounded: the writer thread evicts
// the least recently used blocks (last read or write) to make room. A write
// the disk refuses (full, quota, file size limit) stops writing for
// kDiskFullPause and is counted; reads go on.
//
// Thread safety: all methods from any thread (one mutex over the index; file
// I/O outside it). One writer thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "pagoda/core/status.h"
#include "pagoda/kvstore/block_store.h"

namespace pagoda::kvstore {

struct DiskTierOptions {
  std::filesystem::path dir;
  int64_t capacity_bytes = 0;  // >= one record: the size bound of the block files
  size_t block_bytes = 0;      // payload of one block (host_block_layout.h)
  int32_t max_queued_writes = 512;
};

class DiskTier final : public BlockStore {
 public:
  static constexpr std::chrono::seconds kDiskFullPause{10};

  // kInvalidArgument: bad options; kIoError: DIR cannot be made or written
  // (naming it); kFailedPrecondition: another process holds DIR's lock.
  static StatusOr<std::unique_ptr<DiskTier>> open(const DiskTierOptions& options);
  ~DiskTier() override;  // finishes queued writes, writes the index, releases the lock

  std::string_view name() const override { return "disk"; }
  // Each record is read with one preadv: its header into a local buffer, its
  // payload straight into outs[i], then checked there.
  int32_t read_into(std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs) override;
  void write_async(const kv::StableKey& key, std::vector<std::byte> block) override;
  bool probably_holds(const kv::StableKey& key) const override;
  void flush() override;
  TierIoStats stats() const override;
  std::string describe() const override;

  // How the index was obtained at open: "index" (loaded) or "scan" (rebuilt).
  std::string_view opened_from() const { return opened_from_; }
  std::filesystem::path block_path(const kv::StableKey& key) const;

 private:
  struct Entry {
    int64_t bytes = 0;  // the file's size
    std::list<kv::StableKey>::iterator lru;
  };
  struct Job {
    kv::StableKey key;
    std::vector<std::byte> block;
  };

  explicit DiskTier(const DiskTierOptions& options);
  Status lock_and_load();
  bool load_index();
  void rebuild_index();
  Status write_index() const;
  void writer_loop();
  void write_one(Job& job);
  // Index updates; the caller holds mutex_.
  void add_entry_locked(const kv::StableKey& key, int64_t bytes);
  void remove_entry_locked(const kv::StableKey& key);
  void touch_locked(const kv::StableKey& key);

  DiskTierOptions options_;
  std::filesystem::path blocks_dir_;
  int lock_fd_ = -1;
  std::string opened_from_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, idle_cv_;
  std::unordered_map<kv::StableKey, Entry, kv::StableKeyHash> entries_;
  std::list<kv::StableKey> lru_;  // front: most recently used
  std::unordered_set<kv::StableKey, kv::StableKeyHash> queued_;
  std::deque<Job> queue_;
  bool busy_ = false;  // the writer holds a job
  bool stopping_ = false;
  std::chrono::steady_clock::time_point paused_until_{};
  TierIoStats stats_;
  std::thread writer_;
};

}  // namespace pagoda::kvstore
