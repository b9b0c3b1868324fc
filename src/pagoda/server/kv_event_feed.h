#pragma once
// KvEventFeed: the KV manager's numbered block events, kept for readers on
// other threads: GET /v1/kv/events, which `pagoda route` polls to know which
// replica holds which prefix.
//
// The manager records an event whenever a block enters or leaves the prefix
// cache (kv::KvEvent: numbered from 1, never reused). read() first drains the
// manager on the engine thread (Engine::visit_kv_cache) into a bounded ring,
// then answers "what happened after event `since`":
//   - incremental: the events numbered (since, last], oldest first, at most
//     `max_events` of them (`more`: read again from `last` for the rest);
//   - snapshot: when the events after `since` are no longer all here (the
//     ring overflowed, the manager dropped some, or `since` is ahead of this
//     feed: the reader knew another process), every block cached now,
//     consistent with `last`. The reader replaces what it held with it.
// A reader continues from `last` either way. A reader restricted to one
// tenant (a non-admin api key) sees the events of its tenant's namespace
// group: the tenant's own namespace and every salted user namespace of it
// (`<tenant namespace>/...`, server/api_keys.h), never another tenant's,
// numbered in the group's own sequence (`since`, `last` and each `seq` too):
// with global numbers, the gaps between its own events would count what every
// other tenant cached or lost meanwhile. When events are lost before anyone
// read them, every group's sequence skips one number, so each of its readers
// gets a snapshot.
//
// Groups are tracked while the ring holds an event of theirs, and for the
// feed's life once a reader asked for them (a tenant's group). A salted user
// namespace is never tracked on its own: it counts in its tenant's group, so
// salted users do not pile up here.
//
// What leaves this class: kinds and key hashes. A key hash chains the
// namespace's seed (kv::namespace_seed) with every token up to the end of the
// block (kv::chain_block_hash), so the same text in two namespaces gives
// unrelated hashes. Namespace names, block ids and tokens never leave.
//
// Thread safety: read() from any thread but the engine's (it waits for the
// engine thread); concurrent reads are serialized.

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagoda/engine/engine.h"

namespace pagoda::server {

struct KvFeedEvent {
  uint64_t sequence_number = 0;  // 0 in a snapshot
  bool stored = true;            // false: the block left the cache
  uint64_t key_hash = 0;
  uint64_t parent_key_hash = 0;  // 0 for the first block of a prompt
};

struct KvFeedPage {
  uint64_t since = 0;     // as asked
  uint64_t last = 0;      // continue from here
  bool snapshot = false;  // events holds every cached block (all stored, parents first)
  bool more = false;      // incremental page cut at max_events
  std::vector<KvFeedEvent> events;
};

class KvEventFeed {
 public:
  // `capacity`: events kept for readers that fall behind (older ones are
  // dropped; such a reader gets a snapshot).
  explicit KvEventFeed(engine::Engine& engine, size_t capacity = size_t{1} << 16);

  // A random id drawn at construction: a reader that sees it change is talking
  // to a new process (a restarted replica) and must start again from 0.
  uint64_t instance_id() const { return instance_id_; }

  // `only_tenant`: the reader's tenant namespace (ApiKeyStore::cache_namespace
  // of its tenant): it gets the events of that namespace's group; nullopt:
  // every namespace (admin). A namespace that is itself a member of a group
  // (a salted user's) is answered with no events: users read nothing here.
  // max_events >= 1.
  KvFeedPage read(uint64_t since, const std::optional<std::string>& only_tenant, size_t max_events);
  // Tenant groups tracked now (see above).
  size_t groups_tracked();

  // The namespace group a KV namespace belongs to: for the server's
  // length-prefixed names (`tenant:<len>:<name>[/user:<len>:<id>]`) the
  // tenant's namespace; for any other name the part before its first '/'
  // (the KV manager's rule: a group's members are `<group>/<anything>`).
  static std::string_view group_of(std::string_view tenant_namespace);

 private:
  struct Entry {
    KvFeedEvent event;
    int32_t group_id = -1;
    uint64_t group_sequence = 0;  // its number in its group's own sequence
  };
  // Every group's sequence skips a number: events were lost unread.
  void mark_loss_for_every_group();
  int32_t intern_group(std::string_view name);
  // Drops the oldest ring entry (and, with it gone, its group unless tracked for a reader).
  void pop_oldest();
  void clear_ring();
  // Appends drained events; `manager_last` is the manager's newest number.
  void append(std::vector<kv::KvEvent> events, uint64_t manager_last);
  bool needs_snapshot(uint64_t since) const { return since > last_ || since < covered_from_; }

  engine::Engine& engine_;
  const size_t capacity_;
  const uint64_t instance_id_;
  // Held for a whole read(). The part of a read that runs on the engine thread
  // touches the members below while the reader holds it and waits for that part.
  std::mutex mutex_;
  std::deque<Entry> ring_;
  uint64_t last_ = 0;       // number of the newest event seen
  uint64_t covered_from_ = 0;  // the ring holds every event numbered > covered_from_
  std::vector<std::string> group_names_;
  std::unordered_map<std::string, int32_t> group_ids_;
  // Per group id: its newest event's own number, and the ring holds every
  // event of it numbered above covered_from (as last_ / covered_from_ do globally).
  std::vector<uint64_t> group_last_;
  std::vector<uint64_t> group_covered_from_;
  std::vector<int64_t> group_in_ring_;  // ring entries per group id
  std::vector<bool> group_read_;        // a reader asked for it: kept
  std::vector<int32_t> free_group_ids_;
  uint64_t new_group_start_ = 0;  // 1 once events were lost: a group seen later may have lost some
};

}  // namespace pagoda::server
