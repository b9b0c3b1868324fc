#pragma once
// PrefixCache: the radix tree over full blocks of tokens (RadixAttention-style),
// one root per tenant namespace.
//
// A node is a cached block: its key is (namespace, parent block, the block's
// block_size tokens). Nodes are found through a hash of the whole prefix
// (namespace seed, then every token), but a hash only proposes: namespace id,
// parent and tokens are compared before a block is trusted, so a collision can
// cost a miss, never a wrong reuse. Namespace seeds hash the length-prefixed
// name, and ids are compared as whole strings, so ("org_1", "2345...") can never
// meet ("org_12345", ...).
//
// The cache also tracks which cached blocks are evictable (unreferenced leaves)
// and feeds them to the EvictionPolicy; KvCacheManager tells it when a cached
// block's ref count goes 0 -> 1 or 1 -> 0. It remembers the keys of recently
// removed blocks and a namespace-free count of every cached prefix, only to tag
// misses with a reason.
//
// Thread safety: none (owned by one KvCacheManager).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/clock.h"
#include "pagoda/kv/eviction_policy.h"
#include "pagoda/kv/kv_types.h"
#include "pagoda/kv/prefix_hash_table.h"

namespace pagoda::kv {

// Hash of a length-prefixed namespace name: the seed of its key chain.
uint64_t namespace_seed(std::string_view tenant_namespace);
// Key of the next block given the previous key (or the seed) and its tokens.
// Never 0. Equals chain_combine(previous, block_content_hash(tokens)).
uint64_t chain_block_hash(uint64_t previous, const TokenId* tokens, int32_t block_size);
uint64_t block_content_hash(const TokenId* tokens, int32_t block_size);
uint64_t chain_combine(uint64_t previous, uint64_t content_hash);

class PrefixCache {
 public:
  using EventSink = std::function<void(KvEvent::Kind, BlockId, uint64_t key, uint64_t parent_key, int32_t ns_id)>;

  PrefixCache(BlockPool& pool, int32_t block_size, std::unique_ptr<EvictionPolicy> policy, const Clock& clock,
              int32_t evicted_key_memory);

  void set_event_sink(EventSink sink) { event_sink_ = std::move(sink); }

  // Namespace ids are dense, never reused; the name is kept.
  int32_t intern_namespace(std::string_view tenant_namespace);
  int32_t find_namespace(std::string_view tenant_namespace) const;  // -1 if never seen
  const std::string& namespace_name(int32_t ns_id) const { return namespaces_[ns_id].name; }

  // Longest chain of cached blocks matching tokens[0, max_blocks * block_size).
  // Fills cached_tokens, blocks and reason (kHit when all max_blocks matched;
  // kShorterThanBlock when max_blocks == 0). `content_hashes`, when it holds
  // block_content_hash of the first blocks (block_hashes.h), saves hashing them.
  PrefixMatch match(std::string_view tenant_namespace, std::span<const TokenId> tokens, int32_t max_blocks,
                    std::span<const uint64_t> content_hashes = {}) const;

  enum class InsertOutcome { kInserted, kDuplicate, kNotCacheable };
  struct InsertResult {
    InsertOutcome outcome = InsertOutcome::kNotCacheable;
    BlockId existing = kNoBlock;  // for kDuplicate: the cached block with the same key
  };
  // Caches `block` (full, written, referenced) under `parent` (a cached block,
  // or kNoBlock for the first block of a prompt). kDuplicate: an equal block is
  // cached already (the caller may reference it instead). kNotCacheable: parent not
  // cached, or a hash collision with different content.
  InsertResult insert(BlockId block, int32_t ns_id, BlockId parent, const TokenId* tokens);

  // A cached block's ref count went 0 -> 1 (it is no longer evictable).
  void on_referenced(BlockId block);
  // A cached block's ref count went 1 -> 0 (evictable once it is a leaf).
  void on_unreferenced(BlockId block);
  // Marks a match hit on a cached block (reuse count, last access).
  void touch(BlockId block, bool reused);

  // Evicts the policy's victim onto the pool's free list; false if none.
  bool evict_one();
  // Removes `root` and every cached descendant. Unreferenced ones go to the
  // free list; referenced ones just lose their key. Returns blocks removed.
  int32_t remove_subtree(BlockId root, RemovalReason reason);
  int32_t drop_namespace(std::string_view tenant_namespace);

  int32_t num_cached() const { return num_cached_; }
  int32_t num_evictable() const { return num_evictable_; }  // cached and unreferenced
  int32_t block_size() const { return block_size_; }
  const TokenId* block_tokens(BlockId block) const { return &tokens_[static_cast<size_t>(block) * block_size_]; }
  std::string_view policy_name() const { return policy_->name(); }
  const std::array<int64_t, kNumRemovalReasons>& removed_by_reason() const { return removed_by_reason_; }
  void reset_counters() { removed_by_reason_ = {}; }

  Status verify_integrity() const;

 private:
  struct NamespaceInfo {
    std::string name;
    uint64_t seed = 0;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  bool content_equals(BlockId block, int32_t ns_id, BlockId parent, const TokenId* tokens) const;
  void remove_one(BlockId block, RemovalReason reason);
  void link_child(BlockId parent, BlockId child);
  void unlink_child(BlockId child);
  void maybe_add_candidate(BlockId block);
  uint64_t token_only_key(BlockId block) const { return token_only_keys_[block]; }
  MissReason diagnose_miss(std::span<const TokenId> tokens, int32_t miss_block, uint64_t miss_key) const;

  BlockPool& pool_;
  const int32_t block_size_;
  std::unique_ptr<EvictionPolicy> policy_;
  const Clock& clock_;
  EventSink event_sink_;

  PrefixHashTable table_;
  std::vector<TokenId> tokens_;            // [num_blocks * block_size] tokens of cached blocks
  std::vector<uint64_t> token_only_keys_;  // [num_blocks] namespace-free prefix hash of cached blocks
  std::vector<NamespaceInfo> namespaces_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> namespace_ids_;
  std::unordered_map<uint64_t, int32_t> token_only_counts_;  // namespace-free prefix hash -> cached blocks
  std::deque<uint64_t> removed_keys_;                         // FIFO of removed keys, bounded
  std::unordered_map<uint64_t, int32_t> removed_key_counts_;
  int32_t removed_key_memory_;
  int32_t num_cached_ = 0;
  int32_t num_evictable_ = 0;
  std::array<int64_t, kNumRemovalReasons> removed_by_reason_{};
};

}  // namespace pagoda::kv
