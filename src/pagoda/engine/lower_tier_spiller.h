#pragma once
// LowerTierSpiller: hands the host blocks that device->host transfers wrote
// to the tiers below the host (disk, redis) from a thread of its own, so that
// neither the wait for the copies nor the copy out of the host pool is on the
// engine thread's path: on a GPU the engine queues a step's transfers, hands
// their host blocks here and launches the forward at once; this thread waits
// for the copy streams alone (ModelRunner::read_host_block), copies each
// block out while the forward runs, and queues it for the tiers' writers.
//
// The engine must call wait_for(blocks) before anything overwrites host
// blocks: with the device->host destinations of its next transfer list, and
// with the blocks it is about to write_host_block(). Only a block still to be
// read makes it wait (a reclaimed host block handed here a moment ago, which
// is rare), so a step never waits for the previous step's spills as a whole;
// a block read late holds what its key names (the key is taken when the spill
// is submitted, from the KV manager's metadata of that moment). Reads and the
// runner's transfers run at the same time (ModelRunner::read_host_block).
//
// Thread safety: submit, wait_for and wait_idle from one thread (the
// engine's); the worker calls only ModelRunner::read_host_block and
// LowerTiers::store.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pagoda/kv/stable_key.h"
#include "pagoda/kvstore/lower_tiers.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::engine {

class LowerTierSpiller {
 public:
  struct Spill {
    int32_t host_block;
    kv::StableKey key;
  };
  LowerTierSpiller(runtime::ModelRunner& runner, kvstore::LowerTiers& tiers);
  // Finishes the spills submitted so far, then stops the thread.
  ~LowerTierSpiller();
  LowerTierSpiller(const LowerTierSpiller&) = delete;
  LowerTierSpiller& operator=(const LowerTierSpiller&) = delete;

  // Queues `spills` (read in order, after the transfers already handed to the runner).
  void submit(std::vector<Spill> spills);
  // Blocks until every spill submitted so far has been read out of the host pool.
  void wait_idle();
  // Blocks until no spill still to be read names one of `host_blocks`.
  void wait_for(std::span<const int32_t> host_blocks);
  // Blocks handed to the tiers / whose read failed, so far (any thread).
  int64_t spilled() const;
  int64_t failed() const;

 private:
  void loop();

  runtime::ModelRunner& runner_;
  kvstore::LowerTiers& tiers_;
  mutable std::mutex mutex_;
  std::condition_variable work_;  // spills queued or stop
  std::condition_variable read_;  // a block was read (or the queue ran empty)
  std::vector<Spill> queue_;
  std::unordered_map<int32_t, int32_t> unread_;  // host block -> spills of it not yet read
  bool busy_ = false;
  bool stop_ = false;
  int64_t spilled_ = 0;
  int64_t failed_ = 0;
  std::thread thread_;
};

}  // namespace pagoda::engine
