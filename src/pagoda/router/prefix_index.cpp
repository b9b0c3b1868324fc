#include "pagoda/router/prefix_index.h"

#include <mutex>

namespace pagoda::router {

void PrefixIndex::clear_locked() {
  keys_.clear();
  next_since_ = 0;
  synced_ = false;
  block_size_ = 0;
}

void PrefixIndex::reset() {
  std::unique_lock lock(mutex_);
  clear_locked();
  expected_.clear();
  instance_ = 0;
}

void PrefixIndex::forget_expired_locked(std::chrono::steady_clock::time_point now) {
  for (auto it = expected_.begin(); it != expected_.end();) {
    if (it->second <= now) it = expected_.erase(it);
    else ++it;
  }
}

void PrefixIndex::note_routed(std::span<const uint64_t> chain, std::chrono::steady_clock::time_point expires) {
  std::unique_lock lock(mutex_);
  if (!synced_) return;
  for (uint64_t key : chain)
    if (keys_.count(key) == 0) expected_[key] = expires;
}

size_t PrefixIndex::num_expected() const {
  std::shared_lock lock(mutex_);
  return expected_.size();
}

PrefixIndex::ApplyResult PrefixIndex::apply(const KvEventsPage& page) {
  std::unique_lock lock(mutex_);
  forget_expired_locked(std::chrono::steady_clock::now());
  if (instance_ != 0 && page.instance != instance_) {
    ++resyncs_;
    clear_locked();
    instance_ = page.instance;
    if (!page.snapshot) return ApplyResult::kResync;  // ask again from 0
  } else if (page.since != next_since_) {
    return ApplyResult::kStale;
  }
  instance_ = page.instance;
  if (page.snapshot) {
    if (synced_) ++resyncs_;
    keys_.clear();
    for (const auto& e : page.events)
      if (e.stored) keys_.insert(e.key_hash);
  } else {
    uint64_t previous = page.since;
    for (const auto& e : page.events) {
      if (e.sequence_number <= previous || e.sequence_number > page.last) {
        ++resyncs_;
        clear_locked();
        return ApplyResult::kResync;
      }
      previous = e.sequence_number;
      if (e.stored) keys_.insert(e.key_hash);
      else keys_.erase(e.key_hash);
      expected_.erase(e.key_hash);  // confirmed, or gone
    }
  }
  next_since_ = page.last;
  block_size_ = page.block_size;
  synced_ = true;
  return ApplyResult::kApplied;
}

uint64_t PrefixIndex::next_since() const {
  std::shared_lock lock(mutex_);
  return next_since_;
}
bool PrefixIndex::synced() const {
  std::shared_lock lock(mutex_);
  return synced_;
}
int32_t PrefixIndex::block_size() const {
  std::shared_lock lock(mutex_);
  return block_size_;
}
size_t PrefixIndex::num_blocks() const {
  std::shared_lock lock(mutex_);
  return keys_.size();
}
int64_t PrefixIndex::resyncs() const {
  std::shared_lock lock(mutex_);
  return resyncs_;
}

int32_t PrefixIndex::match_blocks(std::span<const uint64_t> chain) const {
  std::shared_lock lock(mutex_);
  if (!synced_) return 0;
  const auto now = std::chrono::steady_clock::now();
  int32_t n = 0;
  for (uint64_t key : chain) {
    if (keys_.count(key) == 0) {
      const auto it = expected_.find(key);
      if (it == expected_.end() || it->second <= now) break;
    }
    ++n;
  }
  return n;
}

}  // namespace pagoda::router
