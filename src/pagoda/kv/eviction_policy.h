#pragma once
// Which cached, unreferenced block to reclaim when the free list is empty.
//
// The prefix cache hands a policy only *evictable* blocks: cached in the radix
// tree, referenced by no sequence, and without cached children (leaves), so
// evicting one never strands a descendant. A block leaves the candidate set when
// it is referenced again, gets a child, or is removed for another reason.
//
// Two policies:
//  - LruEvictionPolicy: oldest last access first.
//  - ValueAwareEvictionPolicy: GreedyDual-style; priority = inflation +
//    reuse_count x recompute_cost, where recompute_cost grows with the block's
//    depth (a deep block costs more attention to recompute) and `inflation` rises
//    to each victim's priority, so blocks that stop being reused age out.
//    Lowest priority is evicted first; ties by oldest access.
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
// prefix_tokens / 1024 units per token (a rough, model-independent ratio).
double block_recompute_cost(int32_t depth, int32_t block_size);

}  // namespace pagoda::kv
