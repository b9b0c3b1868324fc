#pragma once
// Plain value types shared by the KV cache manager and its callers (scheduler,
// model runner, router): ids, tiers, prefix-match results, pending block copies
// and tier transfers, counters and cache events. No behaviour lives here.
//
// Thread safety: values; safe to copy between threads.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::kv {

// Index of a block in every layer's KV pool ([num_blocks, block_size, kv_heads,
// head_dim]); the same id names the same token range in every layer.
using BlockId = int32_t;
using SequenceId = int64_t;
using TokenId = int32_t;

inline constexpr BlockId kNoBlock = -1;

// Where a block's K/V lives. The device tier is the backend's KV pool (GPU
// memory, or the CPU backend's pool); the host tier is a second pool in host
// memory (pinned on the GPU) that cached blocks are written back to when the
// device evicts them, and that swapped-out sequences occupy.
enum class BlockTier : uint8_t { kDevice = 0, kHost = 1 };
inline constexpr int kNumTiers = 2;
std::string_view block_tier_name(BlockTier tier);  // "device", "host"

enum class TransferDirection : uint8_t { kDeviceToHost = 0, kHostToDevice = 1 };
inline constexpr int kNumTransferDirections = 2;
std::string_view transfer_direction_name(TransferDirection direction);  // "device_to_host", "host_to_device"

// Why a prompt's tokens were not served from the prefix cache. A match reports
// the reason for its *first* missing full block. Every reason is decided from
// the requesting namespace's own state only: whether other tenants cached the
// same tokens is never looked up, so no counter can tell one tenant what
// another sent.
enum class MissReason : uint8_t {
  kHit = 0,           // every cacheable full block matched (the tail is always computed)
  kShorterThanBlock,  // nothing cacheable: the prompt minus its last token is under one block
  kEvicted,           // this block was cached in this namespace, then evicted or dropped
  kNeverSeen,         // not cached in this namespace (or the prefix cache is disabled)
  kBelowShareUnit,    // cached, but past the last whole prefix-share unit (KvCacheConfig::prefix_share_min_tokens);
                      // counted in the server-wide figures only: a namespace's own figures call it kNeverSeen
  kNotRead,           // the request computes its whole prompt (PrefixReuse::kSkip: prompt logprobs)
};
inline constexpr int kNumMissReasons = 6;
std::string_view miss_reason_name(MissReason reason);

// Why a cached block left the prefix cache.
enum class RemovalReason : uint8_t {
  kEvictedForSpace = 0,  // the eviction policy picked it to make room
  kDroppedNamespace,     // drop_namespace()
  kDroppedConversation,  // drop_conversation()
  kTransferFailed,       // a copy between tiers failed: the block's K/V is lost (a miss, never wrong K/V)
};
inline constexpr int kNumRemovalReasons = 4;
std::string_view removal_reason_name(RemovalReason reason);

// Whether a new sequence may start from cached blocks. kSkip: it computes its whole prompt (a
// request for prompt logprobs: a cached position yields no logits); its blocks still enter the
// cache as they are written, up to the first that is cached already (from there on nothing: it
// never holds a cached twin beside its own block, which would double what its prompt needs).
enum class PrefixReuse : uint8_t { kRead, kSkip };

// Result of a longest-prefix match of a prompt inside one namespace.
struct PrefixMatch {
  // Tokens whose K/V can be reused: a multiple of block_size, always at most
  // prompt_length - 1 so that at least one token is computed (its logits are
  // needed to sample).
  int32_t cached_tokens = 0;
  std::vector<BlockId> blocks;  // cached_tokens / block_size ids, in position order
  MissReason reason = MissReason::kNeverSeen;
  // How many of `blocks`, at the end, were found in the host tier (a device
  // block's ancestors are always on the device, so host blocks only follow
  // device blocks). From match_prefix these ids are host-tier ids (>= the
  // device pool's num_blocks); allocate_sequence promotes them into fresh
  // device blocks and returns the device ids.
  int32_t host_blocks = 0;
};

// A copy the engine must run on the backend (every layer, K and V) before the
// next forward that touches `dst`: block `dst` gets the contents of `src`.
struct BlockCopy {
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
  bool operator==(const BlockCopy&) const = default;
};

// A copy between the device pool and the host pool that the engine must run on
// the backend (every layer, K and V, codes and scales) before the next forward
// and before any other copy: the KV manager has already updated its metadata
// as if it had happened. Transfers run in the order they were decided (a block
// freed by one may be the target of a later one). `host_block` indexes the
// host pool, [0, num_host_blocks).
struct BlockTransfer {
  TransferDirection direction = TransferDirection::kDeviceToHost;
  BlockId device_block = kNoBlock;
  BlockId host_block = kNoBlock;
  bool operator==(const BlockTransfer&) const = default;
};

// Counters since construction (or reset_stats()). Token counts are prompt tokens
// seen by allocate_sequence().
struct KvStats {
  int64_t hit_tokens = 0;  // == sum of hit_tokens_by_tier
  std::array<int64_t, kNumTiers> hit_tokens_by_tier{};  // indexed by BlockTier: where the matched blocks were
  // Of hit_tokens_by_tier[host]: tokens of host blocks just loaded from a tier
  // below it ([0] disk, [1] redis; KvCacheManager::adopt_host_blocks).
  std::array<int64_t, 2> hit_tokens_by_lower_tier{};
  int64_t miss_tokens = 0;  // == sum of miss_tokens_by_reason
  // Indexed by MissReason. The full blocks after the match are counted under the
  // match's reason; the uncacheable tail (tokens after the last full block that
  // may be matched) under kShorterThanBlock; kHit stays 0.
  std::array<int64_t, kNumMissReasons> miss_tokens_by_reason{};
  std::array<int64_t, kNumRemovalReasons> removed_blocks_by_reason{};  // indexed by RemovalReason
  int64_t blocks_stored = 0;        // full blocks that entered the prefix cache
  int64_t blocks_deduplicated = 0;  // written blocks dropped for an identical cached block
  int64_t blocks_reused = 0;        // cached blocks handed to a new sequence by a match
  int64_t sequences_allocated = 0;
  int64_t sequences_aborted = 0;
  int64_t allocation_failures = 0;  // kResourceExhausted answers
  // Host tier (all 0 without one).
  int64_t blocks_written_back = 0;  // device blocks copied to the host tier on eviction (demotions with a copy)
  int64_t blocks_demoted = 0;       // cached blocks that moved from the device to the host tier (with or without a copy)
  int64_t blocks_promoted = 0;      // host-tier hits copied back into fresh device blocks
  int64_t host_blocks_evicted = 0;  // host-tier blocks reclaimed by the host tier's own eviction
  int64_t swap_outs = 0;            // sequences moved to the host tier (preemption by swap)
  int64_t swap_ins = 0;             // swapped sequences moved back
  int64_t swap_out_failures = 0;    // swap_out answered kResourceExhausted (host tier full)
  int64_t blocks_lost = 0;          // blocks whose transfer failed (their K/V is recomputed)
  std::array<int64_t, kNumTransferDirections> transfers{};  // blocks handed out, by TransferDirection

  // Gauges (current values, filled by KvCacheManager::stats()).
  int32_t blocks_total = 0;
  int32_t blocks_free = 0;        // on the free list
  int32_t blocks_in_use = 0;      // referenced by at least one sequence
  int32_t blocks_cached = 0;      // in the prefix cache (referenced or not)
  int32_t blocks_evictable = 0;   // cached and unreferenced: can be reclaimed
  int32_t namespaces_live = 0;    // entries in the namespace table: namespaces with blocks or sequences, and groups
  int64_t namespaces_reclaimed = 0;  // counter: entries reclaimed once nothing referred to them
  int64_t allocated_slots = 0;    // blocks_in_use * block_size
  int64_t unwritten_slots = 0;    // allocated slots not (yet) holding K/V: fragmentation
  int32_t host_blocks_total = 0;
  int32_t host_blocks_free = 0;
  int32_t host_blocks_cached = 0;   // host-tier prefix-cache blocks (only on the host, or copies of device blocks)
  int32_t host_blocks_swapped = 0;  // held by swapped-out sequences
  int32_t sequences_swapped = 0;
  int32_t host_blocks_reserved = 0;  // held for lower-tier reads in flight (KvCacheManager::reserve_host_blocks)

  double hit_rate() const {
    const int64_t total = hit_tokens + miss_tokens;
    return total == 0 ? 0.0 : static_cast<double>(hit_tokens) / static_cast<double>(total);
  }
};

// One namespace's own figures: what a tenant may be shown about itself, and
// nothing about anyone else. Counters since construction (or reset_stats());
// gauges are current.
struct NamespaceKvUsage {
  int64_t hit_tokens = 0;
  int64_t miss_tokens = 0;
  std::array<int64_t, kNumMissReasons> miss_tokens_by_reason{};  // as KvStats, this namespace only
  int64_t sequences_allocated = 0;
  int32_t blocks_held = 0;       // gauge: in use by its sequences or cached under it
  int32_t blocks_cached = 0;     // gauge: in its prefix cache (referenced or not)
  int32_t blocks_evictable = 0;  // gauge: cached and unreferenced
  int32_t group_blocks_held = 0;  // gauge: held by its whole group (a tenant and its salted users)
  int32_t block_limit = 0;       // its group's cap on group_blocks_held; 0: none
};

// How a prompt stands against its namespace's block cap (KvCacheManager::namespace_room).
enum class NamespaceRoom : uint8_t { kFits, kWaitForOwnBlocks, kNeverFits };

// A change to the prefix cache, for a future KV-aware router.
struct KvEvent {
  enum class Kind : uint8_t { kBlockStored, kBlockRemoved };
  uint64_t sequence_number = 0;  // strictly increasing, from 1, never reused
  Kind kind = Kind::kBlockStored;
  BlockId block = kNoBlock;  // a device block id; a removal may name a host-tier id (>= the device pool's size)
  uint64_t key_hash = 0;         // hash of (namespace, every token up to the end of this block)
  uint64_t parent_key_hash = 0;  // 0 for the first block of a prompt
  std::string tenant_namespace;
};

}  // namespace pagoda::kv
