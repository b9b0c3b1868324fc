#pragma once
// Which cached, unreferenced block to reclaim when the free list is empty.
//
// The prefix cache hands a policy only *evictable* blocks: cached in the radix
// tree, referenced by no sequence, and without cached children (leaves), so
// evicting one never strands a descendant. A block leaves the candidate set when
// it is referenced again, gets a child, or is removed for another reason.
//
// Two policies:
//  - lru: oldest last access first. Because a block's parent keeps the
//    conversation's old access time, LRU eats a stale conversation from its
//    tail to its root before touching a fresher one.
//  - value_aware: LRU anchored, plus value. A block's value is
//    branch_count x recompute_cost(depth) / recompute_cost(0): how many
//    distinct continuations it served (a shared system prompt serves many, a
//    turn of one conversation serves one) times what recomputing it costs. A
//    block is ranked as if it had been accessed (value - 1) "eviction horizons"
//    later, where the horizon is a running average of how long victims sat
//    unused. So a prefix shared by k conversations survives about k times as
//    long unused, and still ages out. Reuse by the same conversation (its own
//    follow-ups) earns nothing extra: that signal is recency, which LRU has.
//    (A GreedyDual reuse_count x cost variant was measured first and lost to
//    LRU on the multi-turn trace: it protected dead conversations' interior
//    blocks; see docs/KV_CACHE.md.)
//
// Thread safety: none; owned and called by one KvCacheManager.

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/kv_types.h"

namespace pagoda::kv {

// What a policy may know about a candidate.
struct EvictionCandidate {
  BlockId block = kNoBlock;
  uint64_t last_access_ns = 0;  // from the manager's Clock
  uint32_t reuse_count = 0;     // times the block was matched by a later prompt
  uint32_t branch_count = 0;    // distinct continuations (children) ever cached under it
  int32_t depth = 0;            // 0 for the first block of a prompt
  int32_t block_size = 16;
};

enum class EvictionPolicyKind : uint8_t { kLru, kValueAware };
std::string_view eviction_policy_kind_name(EvictionPolicyKind kind);

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // Prepares for block ids in [0, num_blocks); forgets every candidate.
  virtual void reset(int32_t num_blocks) = 0;
  // `candidate.block` became evictable. Must not already be a candidate.
  virtual void add(const EvictionCandidate& candidate) = 0;
  // `block` is no longer evictable; no-op if it is not a candidate.
  virtual void remove(BlockId block) = 0;
  // Removes and returns the block to evict next; nullopt when empty.
  virtual std::optional<BlockId> pop_victim() = 0;
  virtual bool contains(BlockId block) const = 0;
  virtual int32_t size() const = 0;
  // Internal consistency of the policy's own structures.
  virtual Status verify_integrity() const = 0;
};

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionPolicyKind kind);

// Recompute cost of one block at `depth`, in token-equivalents: the linear
// layers cost one unit per token, attention over the prefix costs
// prefix_tokens / 32768 units per token (for a Llama-3-8B shape the attention
// FLOPs per token, 4 x layers x d_model x context, equal the linear FLOPs,
// 2 x params, at about 32K tokens of context).
double block_recompute_cost(int32_t depth, int32_t block_size);

}  // namespace pagoda::kv
