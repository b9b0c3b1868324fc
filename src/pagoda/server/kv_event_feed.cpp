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

std::string_view KvEventFeed::group_of(std::string_view ns) {
  constexpr std::string_view kTenant = "tenant:";
  if (ns.starts_with(kTenant)) {
    // tenant:<len>:<name>: the name may hold '/', so its length decides where it ends.
    size_t at = kTenant.size();
    uint64_t len = 0;
    const size_t digits_from = at;
    while (at < ns.size() && ns[at] >= '0' && ns[at] <= '9' && at - digits_from < 12) len = len * 10 + (ns[at++] - '0');
    if (at > digits_from && at < ns.size() && ns[at] == ':' && len <= ns.size() - at - 1) {
      const size_t end = at + 1 + len;
      if (end == ns.size() || ns[end] == '/') return ns.substr(0, end);
    }
    return ns;  // not the server's form: a group of its own
  }
  const size_t slash = ns.find('/');
  return slash == std::string_view::npos ? ns : ns.substr(0, slash);
}

int32_t KvEventFeed::intern_group(std::string_view name) {
  const auto it = group_ids_.find(std::string(name));
  if (it != group_ids_.end()) return it->second;
  int32_t id = static_cast<int32_t>(group_names_.size());
  if (!free_group_ids_.empty()) {
    id = free_group_ids_.back();
    free_group_ids_.pop_back();
  } else {
    group_names_.emplace_back();
    group_last_.push_back(0);
    group_covered_from_.push_back(0);
    group_in_ring_.push_back(0);
    group_read_.push_back(false);
  }
  group_names_[id] = std::string(name);
  group_ids_.emplace(group_names_[id], id);
  group_last_[id] = new_group_start_;
  group_covered_from_[id] = new_group_start_;
  group_in_ring_[id] = 0;
  group_read_[id] = false;
  return id;
}

void KvEventFeed::pop_oldest() {
  const int32_t g = ring_.front().group_id;
  ring_.pop_front();
  if (--group_in_ring_[g] > 0 || group_read_[g]) return;
  // Nothing of it is left to answer for and no reader follows it: forgotten.
  // A reader that asks for it later has lost its past events: groups seen
  // from now on start as after a loss, so their first reader gets a snapshot.
  group_ids_.erase(group_names_[g]);
  group_names_[g].clear();
  free_group_ids_.push_back(g);
  new_group_start_ = 1;
}

void KvEventFeed::clear_ring() {
  while (!ring_.empty()) pop_oldest();
}

size_t KvEventFeed::groups_tracked() {
  std::lock_guard lock(mutex_);
  return group_ids_.size();
}

void KvEventFeed::mark_loss_for_every_group() {
  for (size_t id = 0; id < group_last_.size(); ++id) group_covered_from_[id] = ++group_last_[id];
  new_group_start_ = 1;
}

void KvEventFeed::append(std::vector<kv::KvEvent> events, uint64_t manager_last) {
  if (!events.empty() && events.front().sequence_number != last_ + 1) {
    // The manager dropped events nobody drained in time: the ring can no
    // longer answer for anything before this batch.
    clear_ring();
    covered_from_ = events.front().sequence_number - 1;
    mark_loss_for_every_group();
  }
  for (kv::KvEvent& e : events) {
    const int32_t g = intern_group(group_of(e.tenant_namespace));
    ring_.push_back(Entry{feed_event(e), g, ++group_last_[g]});
    ++group_in_ring_[g];
  }
  const uint64_t newest = events.empty() ? last_ : events.back().sequence_number;
  if (manager_last > newest) {  // drained by someone else: nothing before now can be answered
    clear_ring();
    covered_from_ = manager_last;
    mark_loss_for_every_group();
  }
  last_ = std::max(last_, manager_last);
  while (ring_.size() > capacity_) {
    covered_from_ = ring_.front().event.sequence_number;
    group_covered_from_[ring_.front().group_id] = ring_.front().group_sequence;
    pop_oldest();
  }
}

KvFeedPage KvEventFeed::read(uint64_t since, const std::optional<std::string>& only_tenant, size_t max_events) {
  std::lock_guard lock(mutex_);
  max_events = std::max<size_t>(max_events, 1);
  KvFeedPage page;
  page.since = since;
  // A user's namespace is a member of its tenant's group, never a scope of its own.
  if (only_tenant && group_of(*only_tenant) != *only_tenant) return page;
  const int32_t wanted = only_tenant ? intern_group(*only_tenant) : -1;
  if (wanted >= 0) group_read_[wanted] = true;
  // A scoped reader counts in its group's own sequence (see the header).
  auto newest = [&] { return wanted < 0 ? last_ : group_last_[wanted]; };
  auto number = [&](const Entry& e) { return wanted < 0 ? e.event.sequence_number : e.group_sequence; };
  std::vector<kv::KvEvent> snapshot;
  engine_.visit_kv_cache([&](kv::KvCacheManager& kv) {
    append(kv.drain_events(), kv.last_event_number());
    page.snapshot = wanted < 0 ? needs_snapshot(since) : since > group_last_[wanted] || since < group_covered_from_[wanted];
    if (page.snapshot) snapshot = kv.cached_blocks();  // consistent with last_: same instant
  });
  page.last = newest();
  if (page.snapshot) {
    page.events.reserve(snapshot.size());
    for (const kv::KvEvent& e : snapshot)
      if (!only_tenant || group_of(e.tenant_namespace) == *only_tenant) page.events.push_back(feed_event(e));
    return page;
  }
  // Global numbers grow along the ring: an admin reader starts at `since`.
  auto it = wanted >= 0 ? ring_.begin()
                        : std::partition_point(ring_.begin(), ring_.end(),
                                               [since](const Entry& e) { return e.event.sequence_number <= since; });
  for (; it != ring_.end(); ++it) {
    const Entry& e = *it;
    if (wanted >= 0 && e.group_id != wanted) continue;
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
