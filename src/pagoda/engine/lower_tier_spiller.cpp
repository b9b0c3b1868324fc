#include "pagoda/engine/lower_tier_spiller.h"

#include <utility>

namespace pagoda::engine {

LowerTierSpiller::LowerTierSpiller(runtime::ModelRunner& runner, kvstore::LowerTiers& tiers)
    : runner_(runner), tiers_(tiers), thread_([this] { loop(); }) {}

LowerTierSpiller::~LowerTierSpiller() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();
}

void LowerTierSpiller::submit(std::vector<Spill> spills) {
  if (spills.empty()) return;
  {
    std::lock_guard lock(mutex_);
    if (queue_.empty()) {
      queue_ = std::move(spills);
    } else {
      queue_.insert(queue_.end(), spills.begin(), spills.end());
    }
  }
  work_.notify_one();
}

void LowerTierSpiller::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

int64_t LowerTierSpiller::spilled() const {
  std::lock_guard lock(mutex_);
  return spilled_;
}

int64_t LowerTierSpiller::failed() const {
  std::lock_guard lock(mutex_);
  return failed_;
}

void LowerTierSpiller::loop() {
  std::vector<std::byte> buffer(tiers_.block_bytes());
  std::vector<Spill> batch;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
      // Stop only once everything submitted is spilled: a server stopping stores its last blocks.
      work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      batch.swap(queue_);
      queue_.clear();
      busy_ = true;
    }
    int64_t ok = 0, bad = 0;
    for (const Spill& s : batch) {
      // The first read waits for the copies (the copy streams on a GPU, not the forward); the rest are ready.
      if (runner_.read_host_block(s.host_block, buffer).ok()) {
        tiers_.store(s.key, buffer);
        ++ok;
      } else {
        ++bad;
      }
    }
    batch.clear();
    std::lock_guard lock(mutex_);
    spilled_ += ok;
    failed_ += bad;
  }
}

}  // namespace pagoda::engine
