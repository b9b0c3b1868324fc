#include "pagoda/server/kv_event_feed.h"

#include <algorithm>
#include <random>

namespace pagoda::server {

namespace {

uint64_t random_instance_id() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id == 0 ? 1 : id;
}

KvFeedEvent feed_event(const kv::KvEvent& e) {
  return KvFeedEvent{e.sequence_number, e.kind == kv::KvEvent::Kind::kBlockStored, e.key_hash, e.parent_key_hash};
}

}  // namespace

KvEventFeed::KvEventFeed(engine::Engine& engine, size_t capacity)
    : engine_(engine), capacity_(std::max<size_t>(capacity, 1)), instance_id_(random_instance_id()) {}

int32_t KvEventFeed::intern_namespace(const std::string& name) {
  const auto it = namespace_ids_.find(name);
  if (it != namespace_ids_.end()) return it->second;
  int32_t id = static_cast<int32_t>(namespace_names_.size());
  if (!free_namespace_ids_.empty()) {
    id = free_namespace_ids_.back();
    free_namespace_ids_.pop_back();
  } else {
    namespace_names_.emplace_back();
    namespace_last_.push_back(0);
    namespace_covered_from_.push_back(0);
    namespace_in_ring_.push_back(0);
    namespace_read_.push_back(false);
  }
  namespace_names_[id] = name;
  namespace_ids_.emplace(name, id);
  namespace_last_[id] = new_namespace_start_;
  namespace_covered_from_[id] = new_namespace_start_;
  namespace_in_ring_[id] = 0;
  namespace_read_[id] = false;
  return id;
}

void KvEventFeed::pop_oldest() {
  const int32_t ns = ring_.front().namespace_id;
  ring_.pop_front();
  if (--namespace_in_ring_[ns] > 0 || namespace_read_[ns]) return;
  // Nothing of it is left to answer for and no reader follows it: forgotten.
  // A reader that asks for it later has lost its past events: namespaces seen
  // from now on start as after a loss, so their first reader gets a snapshot.
  namespace_ids_.erase(namespace_names_[ns]);
  namespace_names_[ns].clear();
  free_namespace_ids_.push_back(ns);
  new_namespace_start_ = 1;
}

void KvEventFeed::clear_ring() {
  while (!ring_.empty()) pop_oldest();
}

size_t KvEventFeed::namespaces_tracked() {
  std::lock_guard lock(mutex_);
  return namespace_ids_.size();
}

void KvEventFeed::mark_loss_for_every_namespace() {
  for (size_t id = 0; id < namespace_last_.size(); ++id) namespace_covered_from_[id] = ++namespace_last_[id];
  new_namespace_start_ = 1;
}

void KvEventFeed::append(std::vector<kv::KvEvent> events, uint64_t manager_last) {
  if (!events.empty() && events.front().sequence_number != last_ + 1) {
    // The manager dropped events nobody drained in time: the ring can no
    // longer answer for anything before this batch.
    clear_ring();
    covered_from_ = events.front().sequence_number - 1;
    mark_loss_for_every_namespace();
  }
  for (kv::KvEvent& e : events) {
    const int32_t ns = intern_namespace(e.tenant_namespace);
    ring_.push_back(Entry{feed_event(e), ns, ++namespace_last_[ns]});
    ++namespace_in_ring_[ns];
  }
  const uint64_t newest = events.empty() ? last_ : events.back().sequence_number;
  if (manager_last > newest) {  // drained by someone else: nothing before now can be answered
    clear_ring();
    covered_from_ = manager_last;
    mark_loss_for_every_namespace();
  }
  last_ = std::max(last_, manager_last);
  while (ring_.size() > capacity_) {
    covered_from_ = ring_.front().event.sequence_number;
    namespace_covered_from_[ring_.front().namespace_id] = ring_.front().namespace_sequence;
    pop_oldest();
  }
}

KvFeedPage KvEventFeed::read(uint64_t since, const std::optional<std::string>& only_namespace, size_t max_events) {
  std::lock_guard lock(mutex_);
  max_events = std::max<size_t>(max_events, 1);
  KvFeedPage page;
  page.since = since;
  const int32_t wanted_ns = only_namespace ? intern_namespace(*only_namespace) : -1;
  if (wanted_ns >= 0) namespace_read_[wanted_ns] = true;
  // A scoped reader counts in its namespace's own sequence (see the header).
  auto newest = [&] { return wanted_ns < 0 ? last_ : namespace_last_[wanted_ns]; };
  auto number = [&](const Entry& e) { return wanted_ns < 0 ? e.event.sequence_number : e.namespace_sequence; };
  std::vector<kv::KvEvent> snapshot;
  engine_.visit_kv_cache([&](kv::KvCacheManager& kv) {
    append(kv.drain_events(), kv.last_event_number());
    page.snapshot = wanted_ns < 0 ? needs_snapshot(since)
                                  : since > namespace_last_[wanted_ns] || since < namespace_covered_from_[wanted_ns];
    if (page.snapshot) snapshot = kv.cached_blocks();  // consistent with last_: same instant
  });
  page.last = newest();
  if (page.snapshot) {
    page.events.reserve(snapshot.size());
    for (const kv::KvEvent& e : snapshot)
      if (!only_namespace || e.tenant_namespace == *only_namespace) page.events.push_back(feed_event(e));
    return page;
  }
  // Global numbers grow along the ring: an admin reader starts at `since`.
  auto it = wanted_ns >= 0 ? ring_.begin()
                           : std::partition_point(ring_.begin(), ring_.end(),
                                                  [since](const Entry& e) { return e.event.sequence_number <= since; });
  for (; it != ring_.end(); ++it) {
    const Entry& e = *it;
    if (wanted_ns >= 0 && e.namespace_id != wanted_ns) continue;
    if (number(e) <= since) continue;
    if (page.events.size() == max_events) {
      page.more = true;
      page.last = page.events.back().sequence_number;
      break;
    }
    page.events.push_back(e.event);
    page.events.back().sequence_number = number(e);
  }
  return page;
}

}  // namespace pagoda::server
