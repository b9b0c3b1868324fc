#pragma once
// PrefixIndex: what the router believes one backend holds in its prefix cache,
// as the set of key hashes of its cached blocks, kept in step with the
// backend's KV event pages (GET /v1/kv/events, backend_reports.h).
//
// A key hash covers the namespace and every token up to the end of its block,
// and a cached block's parent is always cached (kv_cache_manager.h), so the
// prefix a backend holds for a prompt is the run of the prompt's block keys,
// from the first, that are in the set.
//
// Staying in step (apply()):
//   - the index asks for events after next_since(); a page must answer exactly
//     that `since`, else it is stale and ignored;
//   - a snapshot page replaces the set (the backend found a gap: events the
//     index never got) and counts a resync;
//   - a page from another backend instance (the replica restarted) empties the
//     set and asks again from 0 (also a resync), unless it is a snapshot, which
//     is applied at once;
//   - an incremental page whose numbers do not rise past `since` is corrupt:
//     the set is emptied and the index asks again from 0.
// Until the first page is applied the index is not synced and matches nothing.
//
// Events lag: a backend reports a prompt's blocks once it has computed them,
// and the router reads them one poll later. So that the next turn of a
// conversation, sent right after the previous answer, still finds its
// backend, note_routed() records the blocks of a prompt just sent there as
// expected, for a short time (or until an event confirms or removes them);
// match_blocks() counts them as held.
//
// Thread safety: all methods may be called from any thread (a reader-writer
// lock: routing decisions read, the backend's monitor writes).

#include <chrono>
#include <cstdint>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "pagoda/router/backend_reports.h"

namespace pagoda::router {

class PrefixIndex {
 public:
  enum class ApplyResult { kApplied, kStale, kResync };

  ApplyResult apply(const KvEventsPage& page);
  // Forgets everything (the backend left, or its events are unavailable).
  void reset();

  uint64_t next_since() const;
  bool synced() const;
  int32_t block_size() const;  // 0 until synced
  size_t num_blocks() const;
  int64_t resyncs() const;

  // How many leading keys of `chain` (a prompt's block keys, first block
  // first) are cached or expected. 0 when not synced.
  int32_t match_blocks(std::span<const uint64_t> chain) const;
  // The prompt with these block keys was just sent to this backend: expect
  // them until `expires` (no-op when not synced).
  void note_routed(std::span<const uint64_t> chain, std::chrono::steady_clock::time_point expires);
  size_t num_expected() const;

 private:
  void clear_locked();
  void forget_expired_locked(std::chrono::steady_clock::time_point now);

  mutable std::shared_mutex mutex_;
  std::unordered_set<uint64_t> keys_;
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> expected_;
  uint64_t instance_ = 0;
  uint64_t next_since_ = 0;
  int32_t block_size_ = 0;
  bool synced_ = false;
  int64_t resyncs_ = 0;
};

}  // namespace pagoda::router
