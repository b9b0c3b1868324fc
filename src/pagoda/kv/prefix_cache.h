#pragma once
// PrefixCache: the radix tree over full blocks of tokens (RadixAttention-style),
// one root per tenant namespace, spanning two tiers of memory.
//
// A node is a cached block: its key is (namespace, parent block, the block's
// block_size tokens). Nodes are found through a hash of the whole prefix
// (namespace seed, then every token), but a hash only proposes: namespace id,
// parent and tokens are compared before a block is trusted, so a collision can
// cost a miss, never a wrong reuse. Namespace seeds hash the length-prefixed
// name, and ids are compared as whole strings, so ("org_1", "2345...") can never
// meet ("org_12345", ...).
//
// Tiers (block_pool.h: device ids first, then host ids). A node lives in the
// device tier (the backend's pool) or the host tier (a second pool in host
// memory). Device nodes are closed under ancestors: a device node's parent is
// a device node, so a root path is device blocks, then host blocks. A device
// node may also have a *host copy* (its "twin": a host block holding the same
// K/V, not itself a node), left behind when a host node was promoted or made
// when a swapped-out sequence needed one. Moving a node between tiers keeps
// its key, tokens and links; only its block id changes.
//   - Device eviction *demotes*: the victim (an unreferenced device node with
//     no device children) moves to the host tier, onto its twin (no copy) or
//     onto a fresh host block (a device->host transfer). Without host room it
//     is removed with its host descendants, as without a host tier.
//   - Host eviction (its own policy) reclaims an unreferenced host leaf node,
//     or an unreferenced twin (the device node keeps its place).
//   - promote() moves a host node onto a fresh device block (a host->device
//     transfer); the host block stays as its twin.
// Transfers are recorded in order and handed out by take_transfers(); this
// class never touches memory.
//
// The cache also tracks which blocks are evictable in each tier and feeds them
// to that tier's EvictionPolicy; KvCacheManager tells it when a tracked
// block's ref count goes 0 -> 1 or 1 -> 0. Each namespace remembers the keys of
// its own recently removed blocks, only to tag its misses with a reason: a miss
// is diagnosed from the requesting namespace's state alone, never from what
// other namespaces hold. Per namespace it also counts its device nodes (cached,
// evictable) and keeps its device candidates in LRU order, so that a namespace
// at its block cap can recycle its own cache (evict_one_in).
//
// Thread safety: none (owned by one KvCacheManager).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
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
#include "pagoda/kv/stable_key.h"

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

  // `host_policy` may be null when the pool has no host tier.
  PrefixCache(BlockPool& pool, int32_t block_size, std::unique_ptr<EvictionPolicy> policy,
              std::unique_ptr<EvictionPolicy> host_policy, const Clock& clock, int32_t evicted_key_memory);

  void set_event_sink(EventSink sink) { event_sink_ = std::move(sink); }

  // ---- Tiers below the host (disk, redis: kvstore/) ----------------------------
  // Turns on stable keys (stable_key.h) under `model_fingerprint`: every node
  // gets one as it is inserted. Call before the first namespace is interned.
  void enable_stable_keys(std::string_view model_fingerprint);
  bool has_stable_keys() const { return stable_keys_on_; }
  // The stable key of a node, or of the device node a twin copies; nullptr for
  // any other block or without stable keys.
  const StableKey* stable_key(BlockId block) const;
  StableKey stable_root(int32_t ns_id) const { return namespaces_[ns_id].stable_root; }
  // Caches a fresh host block as a host node under `parent` (a cached node of
  // either tier, or kNoBlock for a prompt's first block), holding K/V the
  // caller loads from a lower tier (`origin`: 1 disk, 2 redis, counted when a
  // match promotes it). Unreferenced, so evictable at once. kNoBlock when the
  // key is cached already, the parent is not cached, or the host tier has no
  // room.
  BlockId adopt_host(int32_t ns_id, BlockId parent, const TokenId* tokens, uint8_t origin);
  // As adopt_host, into `host`: a host block the caller allocated and holds
  // unreferenced (ref 0, uncached). false (nothing changed; the caller still
  // owns `host`) when the block is cached already or `parent` is not cached.
  bool adopt_host_into(int32_t ns_id, BlockId parent, const TokenId* tokens, uint8_t origin, BlockId host);
  // The lower tier a host node was loaded from (0: none); cleared by a promotion.
  uint8_t origin(BlockId block) const { return origin_.empty() ? 0 : origin_[block]; }
  // Gives device node `device` (no twin yet) an unreferenced host twin with a
  // device->host transfer, so that its K/V reaches the host tier, and from there
  // the tiers below, while it is still on the device. False without room.
  bool write_through(BlockId device);

  // Namespace ids are dense, never reused; the name is kept.
  int32_t intern_namespace(std::string_view tenant_namespace);
  int32_t find_namespace(std::string_view tenant_namespace) const;  // -1 if never seen
  const std::string& namespace_name(int32_t ns_id) const { return namespaces_[ns_id].name; }

  // Longest chain of cached blocks matching tokens[0, max_blocks * block_size).
  // Fills cached_tokens, blocks (device ids, then host ids), host_blocks and
  // reason (kHit when all max_blocks matched; kShorterThanBlock when
  // max_blocks == 0). `content_hashes`, when it holds block_content_hash of the
  // first blocks (block_hashes.h), saves hashing them.
  PrefixMatch match(std::string_view tenant_namespace, std::span<const TokenId> tokens, int32_t max_blocks,
                    std::span<const uint64_t> content_hashes = {}) const;

  enum class InsertOutcome { kInserted, kDuplicate, kNotCacheable };
  struct InsertResult {
    InsertOutcome outcome = InsertOutcome::kNotCacheable;
    BlockId existing = kNoBlock;  // for kDuplicate: the cached block with the same key
  };
  // Caches device `block` (full, written, referenced) under `parent` (a cached
  // device block, or kNoBlock for the first block of a prompt). kDuplicate: an
  // equal device block is cached already (the caller may reference it
  // instead). An equal block cached only in the host tier is taken over:
  // `block` becomes the node and the host block its twin (kInserted, no event:
  // the key was cached already). kNotCacheable: parent not cached, or a hash
  // collision with different content.
  InsertResult insert(BlockId block, int32_t ns_id, BlockId parent, const TokenId* tokens);

  // Blocks the cache tracks (a node of either tier, or a device node's twin);
  // only their ref count changes must be reported below.
  bool is_tracked(BlockId block) const { return pool_.meta(block).is_cached() || twin_[block] != kNoBlock; }
  // A tracked block's ref count went 0 -> 1 (it is no longer evictable).
  void on_referenced(BlockId block);
  // A tracked block's ref count went 1 -> 0 (evictable once it is a leaf).
  void on_unreferenced(BlockId block);
  // Marks a match hit on a cached block (reuse count, last access).
  void touch(BlockId block, bool reused);

  // Device eviction: frees the device policy's victim, demoting it to the host
  // tier when there is one (see the header). False if nothing is evictable.
  bool evict_one();
  // Evicts (demotes, as evict_one does) the least recently used device
  // candidate of one namespace, whatever the policy; false if it has none. For
  // a namespace at its block cap: it recycles its own blocks, never another's.
  bool evict_one_in(int32_t ns_id);
  // Host eviction: frees the host policy's victim. False if nothing is evictable.
  bool evict_one_host();
  // A host block for the caller (metadata reset, ref 0): a free one, else one
  // reclaimed by host eviction; kNoBlock when the host tier is full of
  // referenced blocks (or absent).
  BlockId allocate_host_block();
  // Moves host node `host` onto device block `device` (fresh, referenced by the
  // caller) and records the host->device transfer; `host` stays as its twin.
  // `host`'s parent must be a device node.
  void promote(BlockId host, BlockId device);
  // Makes host block `host` (allocated, referenced by the caller) the twin of
  // device node `device` (which has none) and records the device->host transfer.
  void add_twin(BlockId device, BlockId host);
  BlockId twin(BlockId block) const { return twin_[block]; }
  // Forgets `block`'s K/V after a failed transfer: a node is removed with its
  // descendants (kTransferFailed); a twin is unlinked (and freed if
  // unreferenced). Returns the blocks that left the cache.
  int32_t drop_lost(BlockId block);
  // A transfer decided by the caller (swapping), kept in order with the cache's own.
  void record_transfer(const BlockTransfer& transfer) { transfers_.push_back(transfer); }
  // Transfers decided since the last call, in order.
  std::vector<BlockTransfer> take_transfers();
  bool has_pending_transfers() const { return !transfers_.empty(); }

  // Removes `root` and every cached descendant. Unreferenced ones go to the
  // free list; referenced ones just lose their key. Returns blocks removed.
  int32_t remove_subtree(BlockId root, RemovalReason reason);
  int32_t drop_namespace(std::string_view tenant_namespace);

  int32_t num_cached() const { return num_cached_[0]; }     // device nodes
  int32_t num_evictable() const { return num_evictable_[0]; }  // device nodes, unreferenced
  int32_t num_host_cached() const { return num_cached_[1] + num_twins_; }  // host nodes + twins
  // Host blocks host eviction can reclaim: unreferenced host nodes and twins.
  int32_t num_host_evictable() const { return num_evictable_[1]; }
  // Device nodes of one namespace: cached, and cached unreferenced (0 for an unknown id).
  int32_t num_cached_in(int32_t ns_id) const;
  int32_t num_evictable_in(int32_t ns_id) const;
  struct TierCounters {
    int64_t written_back = 0, demoted = 0, promoted = 0, host_evicted = 0;
  };
  const TierCounters& tier_counters() const { return tier_counters_; }
  int32_t block_size() const { return block_size_; }
  const TokenId* block_tokens(BlockId block) const { return &tokens_[static_cast<size_t>(block) * block_size_]; }
  std::string_view policy_name() const { return policy_->name(); }
  const std::array<int64_t, kNumRemovalReasons>& removed_by_reason() const { return removed_by_reason_; }
  void reset_counters() {
    removed_by_reason_ = {};
    tier_counters_ = {};
  }

  Status verify_integrity() const;

 private:
  struct NamespaceInfo {
    std::string name;
    uint64_t seed = 0;
    int32_t num_cached = 0;     // device nodes
    int32_t num_evictable = 0;  // device nodes, unreferenced
    // FIFO of this namespace's removed keys (bounded by removed_key_memory_),
    // and how often each is in it: tags this namespace's misses as kEvicted.
    std::deque<uint64_t> removed_keys;
    std::unordered_map<uint64_t, int32_t> removed_key_counts;
    // This namespace's device candidates by (last access when added, block).
    std::set<std::pair<uint64_t, BlockId>> candidates;
    StableKey stable_root;  // with stable keys on
  };

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  bool content_equals(BlockId block, int32_t ns_id, BlockId parent, const TokenId* tokens) const;
  void remove_one(BlockId block, RemovalReason reason);
  // Makes `block` the cached node of (parent, tokens) under chain hash `key`: table entry,
  // metadata, tokens, stable key, child link and cached counts (origin and evictability are the
  // caller's).
  void add_node(BlockId block, uint64_t key, int32_t ns_id, BlockId parent, const TokenId* tokens);
  void link_child(BlockId parent, BlockId child);
  void unlink_child(BlockId child);
  void maybe_add_candidate(BlockId block);
  void remove_candidate(BlockId block);
  // Moves node `from` to block `to` of the other tier: key, tokens, links and
  // counters; ref counts stay with the block ids. Candidates are the caller's.
  void move_node(BlockId from, BlockId to);
  void link_twin(BlockId device, BlockId host);
  void unlink_twin(BlockId device);
  int tier_index(BlockId block) const { return pool_.is_host(block) ? 1 : 0; }
  MissReason diagnose_miss(int32_t ns_id, uint64_t miss_key) const;
  void remember_removed_key(NamespaceInfo& ns, uint64_t key);
  // Tier counters, and the namespace's device counters for a device node.
  void count_evictable(BlockId block, int32_t delta);
  void count_cached(BlockId block, int32_t delta);
  // Demotes or removes device node `device` (no longer a candidate).
  void evict_device_node(BlockId device);

  BlockPool& pool_;
  const int32_t block_size_;
  std::unique_ptr<EvictionPolicy> policy_;       // device tier, block ids
  std::unique_ptr<EvictionPolicy> host_policy_;  // host tier, host pool indices
  const Clock& clock_;
  EventSink event_sink_;

  PrefixHashTable table_;
  std::vector<TokenId> tokens_;            // [num_blocks * block_size] tokens of cached blocks
  std::vector<uint64_t> candidate_stamp_;  // [num_ids] a device candidate's key in its namespace's set
  std::vector<BlockId> twin_;              // [num_ids] device node <-> its host copy, both ways
  std::vector<int32_t> device_children_;   // [num_ids] cached device children of each node
  std::vector<BlockTransfer> transfers_;   // decided, not yet taken
  bool stable_keys_on_ = false;
  std::string model_fingerprint_;
  std::vector<StableKey> stable_;  // [num_ids] with stable keys on: a node's key (moves with the node)
  std::vector<uint8_t> origin_;    // [num_ids] with stable keys on: lower tier a host node came from
  std::vector<NamespaceInfo> namespaces_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> namespace_ids_;
  int32_t removed_key_memory_;  // per namespace
  int32_t num_cached_[kNumTiers] = {0, 0};     // nodes per tier
  int32_t num_evictable_[kNumTiers] = {0, 0};  // unreferenced nodes per tier (host: and unreferenced twins)
  int32_t num_twins_ = 0;
  std::array<int64_t, kNumRemovalReasons> removed_by_reason_{};
  TierCounters tier_counters_;
};

}  // namespace pagoda::kv
