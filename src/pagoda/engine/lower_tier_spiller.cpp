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
    for (const Spill& spill : spills) ++unread_[spill.host_block];
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
  read_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void LowerTierSpiller::wait_for(std::span<const int32_t> host_blocks) {
  std::unique_lock lock(mutex_);
  read_.wait(lock, [&] {
    for (int32_t b : host_blocks)
      if (unread_.contains(b)) return false;
    return true;
  });
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
      if (queue_.empty()) read_.notify_all();
      // Stop only once everything submitted is spilled: a server stopping stores its last blocks.
      work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      batch.swap(queue_);
      queue_.clear();
      busy_ = true;
    }
    for (const Spill& s : batch) {
      // The first read waits for the copies (the copy streams on a GPU, not the forward); the rest are ready.
      const bool ok = runner_.read_host_block(s.host_block, buffer).ok();
      {
        std::lock_guard lock(mutex_);
        auto it = unread_.find(s.host_block);
        if (--it->second == 0) unread_.erase(it);
        ++(ok ? spilled_ : failed_);
      }
      read_.notify_all();
      // The bytes are in `buffer`: the host block may be overwritten from here on.
      if (ok) tiers_.store(s.key, buffer);
    }
    batch.clear();
  }
}

}  // namespace pagoda::engine
