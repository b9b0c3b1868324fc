#pragma once
// LowerTierLoader: reads a request's prompt blocks from the tiers below the
// host (disk, then redis) on a small pool of reader threads, so that a hit
// never stalls the engine thread (every other sequence keeps stepping while
// the blocks come in) and the waiting sequence holds no step.
//
// The engine prepares a Load on its thread: the stable keys of the prompt
// blocks that the device and host tiers miss, and for the run the disk's index
// holds, host blocks it reserved (KvCacheManager::reserve_host_blocks) with
// their memory (ModelRunner::host_blocks_for_writing). The disk part is split
// into chunks read in parallel, each record straight into its pinned host
// block (DiskTier::read_into: one preadv, checked in place; no staging copy).
// When the whole disk part came in and a redis tier exists, the run continues
// from redis (pipelined GETs, rounds of 32) into the load's own buffer; redis
// hits are queued for the disk tier too. A finished load is handed back
// through take_finished(); the engine adopts what was read into the host tier
// (then promotes it like any host hit) and schedules the sequence.
//
// A read that fails, or a record that is torn, short or corrupt, ends the run
// there (a miss, recomputed; never wrong K/V): `disk_read` counts the blocks
// read intact from the start of the run, and a chunk after a failed one is
// not counted even if it was read. cancel() skips what has not started yet
// (an aborted request); the load still comes back through take_finished(), so
// the engine gives its reserved blocks back only once no reader writes them.
//
// Thread safety: submit, cancel, take_finished, in_flight and wait_idle from
// the engine's thread (any one thread); the readers call only the tiers'
// read_into / write_async and `on_finished` (from a reader thread, after a
// load is ready to take).

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "pagoda/kv/kv_types.h"
#include "pagoda/kv/stable_key.h"
#include "pagoda/kvstore/lower_tiers.h"

namespace pagoda::engine {

class LowerTierLoader {
 public:
  struct Load {
    kv::SequenceId sequence = 0;
    int32_t first_block = 0;           // the prompt block keys[0] names
    std::vector<kv::StableKey> keys;   // the prompt's blocks after those cached when it arrived
    // keys[0, disk_hosts.size()) are read from disk into these reserved host
    // blocks, whose memory is disk_memory (one block each).
    std::vector<int32_t> disk_hosts;
    std::vector<std::span<std::byte>> disk_memory;
    // A runner that cannot hand out its host blocks' memory (a host block split
    // over tensor-parallel ranks): disk_memory points into this buffer, and the
    // engine writes the blocks into the host pool when it takes the load back.
    std::vector<std::byte> disk_staging;
    bool try_redis = false;  // continue the run from redis once every disk block came in
    // Results (valid once taken back).
    int32_t disk_read = 0;   // disk_hosts[0, disk_read) hold K/V read intact
    int32_t redis_read = 0;  // keys[disk_read, disk_read + redis_read) are in redis_data
    std::vector<std::byte> redis_data;
    bool cancelled = false;
  };

  // `threads` >= 1 readers. `on_finished` is called (from a reader) after each
  // load becomes ready to take; it must not call back into the loader.
  LowerTierLoader(kvstore::LowerTiers& tiers, int32_t threads, std::function<void()> on_finished);
  // Skips the reads not started, waits for those in progress, stops the threads.
  ~LowerTierLoader();
  LowerTierLoader(const LowerTierLoader&) = delete;
  LowerTierLoader& operator=(const LowerTierLoader&) = delete;

  void submit(std::unique_ptr<Load> load);
  // The loads for `sequence` skip their reads not yet started (no-op if none).
  void cancel(kv::SequenceId sequence);
  // Loads finished since the last call, in the order they finished.
  std::vector<std::unique_ptr<Load>> take_finished();
  // Loads submitted and not yet taken back.
  int32_t in_flight() const;
  // Blocks until every load submitted so far is ready to take.
  void wait_idle();

 private:
  struct Job;
  struct Task {
    Job* job = nullptr;
    int32_t chunk = -1;  // a disk chunk, or -1: the redis part
  };
  void loop();
  void run_disk_chunk(Job& job, int32_t chunk);
  void run_redis(Job& job);
  // After the job's disk chunks: queues its redis part, or finishes it. Holds mutex_.
  void disk_done_locked(Job& job);
  void finish_locked(Job& job);

  kvstore::LowerTiers& tiers_;
  std::function<void()> on_finished_;
  mutable std::mutex mutex_;
  std::condition_variable work_;  // tasks queued or stop
  std::condition_variable idle_;  // a load finished
  std::deque<Task> tasks_;
  std::vector<std::unique_ptr<Job>> jobs_;  // submitted, not finished
  std::vector<std::unique_ptr<Load>> finished_;
  int32_t in_flight_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pagoda::engine
