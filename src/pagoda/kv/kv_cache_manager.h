#pragma once
// KvCacheManager: the one object the engine talks to about KV blocks.
//
// It owns block METADATA only. The K/V memory lives in a backend's pools (per
// layer [num_blocks, block_size, kv_heads, head_dim]); a BlockId indexes them,
// and names the same token range in every layer. The manager never touches
// memory: when a fork needs data copied it returns BlockCopy items that the
// engine executes on the backend before the next forward.
//
// Host tier (config.num_host_blocks > 0): a second pool of blocks in host
// memory, owned by the backend like the first. The prefix cache spans both
// (prefix_cache.h): a match walks device blocks, then host blocks; device
// eviction writes cached blocks back to the host tier instead of dropping
// them; a host hit is copied back into fresh device blocks by
// allocate_sequence; and swap_out / swap_in move a preempted sequence's K/V
// there and back instead of recomputing it. Each such copy is a BlockTransfer
// the manager decides (metadata is updated at once) and the engine runs on the
// backend, in order, before the next forward or block copy: take_transfers().
// A transfer that fails is reported back (transfers_failed): what the cache
// knew of its destination is dropped (a later miss, never wrong K/V) and the
// sequences whose own K/V was lost are named, for the engine to recompute.
//
// Per sequence (SequenceId, chosen by the caller) and tenant namespace (from the
// authenticated api key, never from a request body):
//
//   match_prefix(ns, prompt)       longest cached prefix (pure query)
//   can_allocate_sequence(ns, p)   yes/no for allocate_sequence
//   allocate_sequence(id, ns, p)   reuse the matched blocks, reserve the rest of the prompt
//   append_tokens(id, tokens)      reserve slots for tokens fed in the next forward
//   block_table(id)                block ids covering every reserved slot
//   mark_computed(id, n)           n more tokens have K/V written; full written
//                                  blocks enter the prefix cache
//   fork(parent, child)            copy-on-write share (n > 1 sampling, beams)
//   swap_out(id) / swap_in(id)     preemption by swap (host tier)
//   compact_sequence(id, kept)     token eviction: fresh blocks for the kept tokens
//   take_transfers()               copies between the tiers to run before the next forward
//   free_sequence(id) / abort_sequence(id)
//
// Lifecycle of one request:
//   if (kv.can_allocate_sequence(ns, prompt)) {
//     auto match = kv.allocate_sequence(id, ns, prompt);   // match->cached_tokens skipped
//     ... forward prompt[cached:] in chunks, kv.mark_computed(id, chunk) after each ...
//     loop: kv.append_tokens(id, {sampled}); forward; kv.mark_computed(id, 1);
//     kv.free_sequence(id);
//   }
//
// Invariants (checked by verify_integrity()):
//  - every device block is exactly one of: free (on the free list, ref 0,
//    uncached), in use (ref >= 1), cached-and-unreferenced (evictable);
//  - every host block is exactly one of: free, a host node of the prefix
//    cache, the host copy of one device node, or held only by swapped-out
//    sequences (ref >= 1); its ref count is the number of swapped-out
//    sequences holding it; no id of one tier appears where the other's is due;
//  - a block's ref count equals the number of sequence block tables holding it
//    plus the sequences holding it as the cached twin of a duplicate (alias);
//  - block tables are append-only: block_table(seq)[j] never changes while
//    the sequence lives, except that compact_sequence replaces the whole table;
//  - a compressed sequence (compact_sequence) offers no block to the prefix
//    cache: its slots do not hold its token prefix's K/V;
//  - a cached block is full and written; its key is (namespace, parent block,
//    its block_size tokens); a block that is freed and reused has lost its key;
//    a sequence's cached blocks (its own or aliases) form one chain from the root;
//  - a cached block's parent is cached; a referenced cached block's ancestors are
//    referenced; only unreferenced leaves are eviction candidates;
//  - the last, partially written block of a sequence is never shared;
//  - no match crosses namespaces: namespaces are compared as whole strings and
//    hashed length-prefixed, and tokens are compared on every match;
//  - a block is held by one namespace at a time (blocks are never shared across
//    namespaces); per-namespace and per-group held, cached and evictable counts
//    match the blocks;
//  - the namespace table holds live namespaces only: one that no block, cached
//    node or sequence refers to (and that is no group) is reclaimed at the end
//    of the call that let it go; its slot is reused under a new tag, and a block
//    whose last holder had another tag is zeroed before reuse;
//  - a miss reason depends only on the requesting namespace's own state.
//
// Thread safety: none. Single-threaded by design: the engine loop owns it and
// calls it between forwards. Wrap it in a mutex if that ever changes.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/clock.h"
#include "pagoda/kv/eviction_policy.h"
#include "pagoda/kv/kv_types.h"
#include "pagoda/kv/stable_key.h"

namespace pagoda::kv {

// What compact_sequence did: the runner copies the kept K/V from old_blocks
// (released in the metadata already, unchanged until the next allocation)
// into new_blocks before anything else touches the pool. The blocks holding
// written K/V in old_blocks and the blocks of the kept slots in new_blocks
// are disjoint; the blocks after them (reserved slots, nothing written) may
// be the same.
struct SequenceCompaction {
  std::vector<BlockId> old_blocks;
  std::vector<BlockId> new_blocks;
};

struct KvCacheConfig {
  int32_t num_blocks = 0;   // >= 1: blocks in every layer's pool
  int32_t block_size = 16;  // tokens per block, 1..256
  bool enable_prefix_cache = true;
  EvictionPolicyKind eviction_policy = EvictionPolicyKind::kLru;
  // Blocks of the host tier (0: none). Same block size as the device pool.
  int32_t num_host_blocks = 0;
  EvictionPolicyKind host_eviction_policy = EvictionPolicyKind::kLru;
  // Remembered keys of removed blocks per namespace, to tag that namespace's
  // misses as kEvicted (about 60 bytes each). 0: max(num_blocks, 65,536).
  int32_t evicted_key_memory = 0;
  // A block that passes from one namespace to another is listed by
  // take_blocks_to_zero(), for the backend to zero before anything reads or
  // writes it (defense in depth: no kernel reads a slot its sequence did not
  // write, see docs/SECURITY.md). Off: nothing is listed.
  bool zero_blocks_between_namespaces = true;
  // Minimum shared-prefix granularity (0: off): a prefix hit is used only in
  // whole units of this many tokens, and not at all below one unit, so a short
  // probe cannot test a guess by its timing or its cached-token count. A
  // multiple of block_size. The cut-off blocks are recomputed (and then found
  // cached again: the sequence chains below its cached twins). A namespace's
  // own miss figures then count every missed full block as never_seen: its
  // evicted / cut-off reasons would tell a probe about prefixes shorter than a
  // unit. The server-wide figures keep the reasons (kBelowShareUnit).
  int32_t prefix_share_min_tokens = 0;
  // Events kept until drain_events(); older ones are dropped (counted).
  int32_t max_pending_events = 1 << 16;
  bool record_events = true;
  // Tiers below the host tier (disk, redis: kvstore/). Non-empty: every cached
  // block gets a stable key (stable_key.h) under this model fingerprint.
  std::string stable_key_fingerprint;
  // Every block that enters the prefix cache on the device also gets a host
  // twin at once (a device->host transfer), so that its K/V can be written to
  // the tiers below while it is still cached; needs a host tier.
  bool host_write_through = false;
};

class KvCacheManager {
 public:
  // `clock` must outlive the manager; nullptr uses SteadyClock. `policy`
  // overrides config.eviction_policy when given (tests, experiments).
  static StatusOr<std::unique_ptr<KvCacheManager>> create(
      const KvCacheConfig& config, const Clock* clock = nullptr,
      std::unique_ptr<EvictionPolicy> policy = nullptr);
  ~KvCacheManager();
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t block_size() const;
  int32_t num_blocks() const;
  int32_t num_host_blocks() const;  // 0 without a host tier
  const KvCacheConfig& config() const;

  // ---- Questions (no state change) -------------------------------------------

  // Longest cached prefix of `prompt` inside `tenant_namespace`, in either
  // tier (PrefixMatch::host_blocks). Never returns the whole prompt:
  // cached_tokens <= prompt.size() - 1, rounded down to blocks.
  // `block_hashes`, optional everywhere it appears: the prompt's content
  // hashes (block_hashes.h), computed once by the caller and kept with the
  // request; without them the prompt is hashed on every call.
  PrefixMatch match_prefix(std::string_view tenant_namespace, std::span<const TokenId> prompt,
                           std::span<const uint64_t> block_hashes = {}) const;

  // Blocks needed to hold `num_tokens` new tokens in fresh blocks.
  int32_t blocks_for_tokens(int64_t num_tokens) const;
  // Could `num_tokens` tokens get fresh blocks now (free + evictable)?
  bool can_allocate(int64_t num_tokens) const;
  // Would allocate_sequence(ns, prompt) succeed now (counts the prefix match)?
  bool can_allocate_sequence(std::string_view tenant_namespace, std::span<const TokenId> prompt,
                             std::span<const uint64_t> block_hashes = {},
                             PrefixReuse reuse = PrefixReuse::kRead) const;
  // New blocks that append_tokens(seq, num_new_tokens) would take; -1 if unknown seq.
  int32_t blocks_needed_to_append(SequenceId seq, int32_t num_new_tokens) const;
  // Free + evictable blocks: what allocation can draw on right now.
  int32_t num_available_blocks() const;
  int32_t num_free_blocks() const;  // on the free list only
  // Available blocks if these sequences were freed now (dry run, nothing changes).
  // Unknown ids are ignored; duplicates count once.
  int32_t available_blocks_after_release(std::span<const SequenceId> seqs) const;

  bool has_sequence(SequenceId seq) const;
  int64_t num_tokens(SequenceId seq) const;           // reserved tokens; -1 if unknown
  int64_t num_computed_tokens(SequenceId seq) const;  // tokens with K/V written; -1 if unknown

  // Block ids covering positions [0, num_tokens(seq)); block j holds positions
  // [j * block_size, (j + 1) * block_size). The span is valid until the next
  // mutating call. kNotFound for an unknown sequence.
  StatusOr<std::span<const BlockId>> block_table(SequenceId seq) const;

  // ---- Mutations --------------------------------------------------------------

  // Registers `seq` with its prompt (>= 1 token): reuses the matched blocks
  // (their K/V is already written: num_computed_tokens starts at
  // match.cached_tokens; host-tier hits are promoted into fresh device blocks,
  // with host->device transfers) and reserves blocks for the rest. Records
  // hit/miss stats. kInvalidArgument: empty prompt or seq already exists.
  // kResourceExhausted: not enough blocks (nothing changes). PrefixReuse::kSkip:
  // nothing is matched (miss reason kNotRead); the blocks are cached as written
  // up to the first already cached (kv_types.h).
  StatusOr<PrefixMatch> allocate_sequence(SequenceId seq, std::string_view tenant_namespace,
                                          std::span<const TokenId> prompt,
                                          std::span<const uint64_t> block_hashes = {},
                                          PrefixReuse reuse = PrefixReuse::kRead);

  // Reserves slots for `tokens` after the sequence's current tokens (decode:
  // the token just sampled). kResourceExhausted if impossible, allocating nothing.
  Status append_tokens(SequenceId seq, std::span<const TokenId> tokens);

  // Sets the id of reserved token `position`, appended before its id was known
  // (overlapped steps append a placeholder for a token still on the device).
  // Only tokens not yet computed can change: kOutOfRange otherwise, or past
  // the reserved tokens.
  Status set_token(SequenceId seq, int64_t position, TokenId token);

  // The next `num_tokens` reserved tokens now have K/V written in the pool.
  // Blocks that become full enter the prefix cache (if enabled). A block whose
  // key is already cached stays in the table (tables are append-only: a block
  // keeps its index until the sequence ends); the sequence holds a reference
  // on the cached twin so later blocks chain below it, and its own copy is
  // freed with the sequence. kOutOfRange if past the reserved tokens.
  Status mark_computed(SequenceId seq, int64_t num_tokens);

  // `child` becomes a copy of `parent`: full written blocks are shared (ref
  // counts rise); every other block (the partial last block, reserved but
  // unwritten blocks) gets a fresh block for the child, and the returned copies
  // (for blocks holding written K/V) must run before the child's next forward.
  // kNotFound: unknown parent; kInvalidArgument: child exists;
  // kResourceExhausted: not enough blocks (nothing changes).
  StatusOr<std::vector<BlockCopy>> fork(SequenceId parent, SequenceId child);

  // The sequence finished: drops its references. Its full written blocks stay
  // cached (evictable once unreferenced); the rest return to the free list.
  Status free_sequence(SequenceId seq);
  // Same as free_sequence for a sequence stopped mid-prefill or mid-decode (a
  // client disconnect); counted separately. Only written, full blocks stay cached.
  Status abort_sequence(SequenceId seq);

  // Removes every cached block of a namespace (unreferenced ones return to the
  // free list; referenced ones leave the cache and are freed with their
  // sequences). Returns the number of blocks removed from the cache.
  int32_t drop_namespace(std::string_view tenant_namespace);
  // Removes the cached blocks of one conversation: those on the path of
  // `tokens` from block index keep_prefix_tokens / block_size on, and every
  // cached continuation below them. keep_prefix_tokens keeps a shared system
  // prompt. Returns the number of blocks removed from the cache.
  int32_t drop_conversation(std::string_view tenant_namespace, std::span<const TokenId> tokens,
                            int64_t keep_prefix_tokens = 0);
  // Evicts up to `num_blocks` evictable device blocks now (memory pressure,
  // tests); with a host tier they are demoted to it.
  int32_t evict(int32_t num_blocks);
  // Token eviction (runtime/kv_compression.h, docs/KV_CACHE.md): the
  // sequence's computed tokens are compacted into `kept_tokens` slots of fresh
  // blocks (written), followed by slots for the tokens reserved but not yet
  // computed, which reuse the old blocks that hold nothing written. Fresh
  // blocks are taken first, then the old ones are released (cached ones stay
  // cached: their K/V is unchanged), so no written old block is a kept-slot
  // block. From then on the sequence is compressed: num_tokens() and
  // num_computed_tokens() count slots, and none of its blocks enters the
  // prefix cache (a compressed table would otherwise be found as the full
  // prefix). kNotFound; kFailedPrecondition (swapped out); kInvalidArgument
  // (kept_tokens outside [0, computed]); kResourceExhausted (nothing changes).
  StatusOr<SequenceCompaction> compact_sequence(SequenceId seq, int64_t kept_tokens);
  bool is_compressed(SequenceId seq) const;

  // Makes `tenant_namespace` a namespace group and caps the device blocks the
  // group may hold (in use by its sequences or cached under any of its
  // namespaces; host-tier blocks do not count); 0: no cap, a group all the
  // same. The group's namespaces are itself and every namespace named
  // `<tenant_namespace>/<anything>` (a tenant's salted user namespaces,
  // server/api_keys.h): they share the one cap. A sequence of a group at its
  // cap gets its new blocks by evicting the group's own least recently used
  // cached, unreferenced blocks (of any of its namespaces), never another
  // group's; with none left, the allocation fails (kResourceExhausted) and
  // can_allocate_sequence says no. So one tenant can push at most its cap's
  // worth of others' cache out, however many users it salts. A cap below
  // what the group holds now takes effect as its blocks come back. A group is
  // kept for the manager's life. kInvalidArgument: the namespace is itself a
  // member of another group.
  Status set_namespace_block_limit(std::string_view tenant_namespace, int32_t max_blocks);
  // Whether `prompt` fits its namespace group's cap now (kFits also when there
  // is no cap), must wait for the group's running sequences to release blocks
  // (kWaitForOwnBlocks: a scheduler should let other namespaces go first), or
  // can never fit it (kNeverFits). Says nothing about the pool as a whole.
  NamespaceRoom namespace_room(std::string_view tenant_namespace, std::span<const TokenId> prompt,
                               std::span<const uint64_t> block_hashes = {},
                               PrefixReuse reuse = PrefixReuse::kRead) const;

  // Device blocks handed to a namespace other than their last holder since the
  // last call (each at most once), oldest first; empty when
  // zero_blocks_between_namespaces is off. The caller must zero them on the
  // backend before the next transfer, block copy or forward (a copy or a
  // host->device transfer lands on a zeroed block, never the other way round).
  // Host blocks are not listed: they are only ever written whole, by a copy of
  // a device block.
  std::vector<BlockId> take_blocks_to_zero();
  bool has_blocks_to_zero() const;

  // ---- The host tier ----------------------------------------------------------

  // Moves a sequence's K/V to the host tier and frees its device blocks
  // (preemption by swap): every block holding K/V gets a host block (a cached
  // block's existing host copy is shared, not copied again). The sequence
  // keeps its tokens and computed count; block_table() fails until swap_in.
  // kNotFound: unknown; kFailedPrecondition: swapped already, or no host tier;
  // kResourceExhausted: the host tier cannot hold it (nothing changes; the
  // caller may recompute instead).
  Status swap_out(SequenceId seq);
  bool is_swapped(SequenceId seq) const;
  // Would swap_in(seq) and then appending `extra_tokens` succeed now?
  bool can_swap_in(SequenceId seq, int32_t extra_tokens = 0) const;
  // Brings a swapped sequence back into device blocks (host->device transfers;
  // blocks whose device copy is still cached are shared, not copied). Its
  // block table is new. kResourceExhausted: not enough device blocks (nothing
  // changes).
  Status swap_in(SequenceId seq);
  // The transfers decided since the last call, in the order they must run.
  std::vector<BlockTransfer> take_transfers();
  bool has_pending_transfers() const;
  // The backend could not run these transfers (all of them count as failed):
  // their destinations' K/V is garbage. Cached blocks there leave the cache
  // (RemovalReason::kTransferFailed, a miss later); returns the sequences
  // (sorted) whose own blocks were destinations: they must be recomputed
  // (free them and start over), never run on that K/V.
  std::vector<SequenceId> transfers_failed(std::span<const BlockTransfer> failed);

  // ---- Stable keys and the tiers below the host (kvstore/) --------------------
  // Empty without KvCacheConfig::stable_key_fingerprint.

  bool has_stable_keys() const;
  // Stable keys of the first `num_blocks` full blocks of `prompt` in the
  // namespace (pure: whether they are cached does not matter).
  std::vector<StableKey> stable_keys(std::string_view tenant_namespace, std::span<const TokenId> prompt,
                                     int32_t num_blocks) const;
  // The stable key of the K/V in host block `host_index` (a host node, or a
  // device node's twin), if the cache knows it.
  std::optional<StableKey> host_block_stable_key(int32_t host_index) const;
  // Caches host blocks for prompt blocks [first_block, first_block + count),
  // whose K/V the caller loaded from a lower tier and writes into the returned
  // host pool indices (in order) before the next transfer: blocks
  // [0, first_block) must be cached (either tier). Stops early (fewer indices)
  // when a block is cached already, the chain is broken or the host tier is
  // full. The blocks are unreferenced host nodes: a later match promotes them
  // (counted in KvStats::hit_tokens_by_lower_tier under `origin`: 1 disk, 2 redis).
  std::vector<int32_t> adopt_host_blocks(std::string_view tenant_namespace, std::span<const TokenId> prompt,
                                         int32_t first_block, int32_t count, uint8_t origin);
  // Reads from a lower tier straight into the host pool, off the engine
  // thread: reserve_host_blocks takes up to `count` host blocks (evicting
  // unreferenced host blocks as host eviction does; fewer when the host tier
  // cannot give more) and holds them for the caller: nothing caches, evicts,
  // transfers or hands them out until the caller gives them back, with
  // release_host_blocks (the read failed or is not wanted), or with
  // adopt_reserved_host_blocks: the blocks hold K/V of prompt blocks
  // [first_block, first_block + hosts.size()) and become unreferenced host
  // nodes like adopt_host_blocks' (counted under `origin`). Blocks of that range
  // that got cached meanwhile (another request computed or loaded them) are
  // released, the rest adopted in order until one cannot be (blocks
  // [0, first_block) no longer cached: nothing is adopted); every reservation
  // passed in ends either way. Returns the number adopted. verify_integrity()
  // counts reservations as holders (host_blocks_reserved in KvStats).
  std::vector<int32_t> reserve_host_blocks(int32_t count);
  void release_host_blocks(std::span<const int32_t> host_blocks);
  int32_t adopt_reserved_host_blocks(std::string_view tenant_namespace, std::span<const TokenId> prompt,
                                     int32_t first_block, std::span<const int32_t> host_blocks, uint8_t origin);

  // ---- Observability ----------------------------------------------------------

  KvStats stats() const;
  // One namespace's own hits, misses by reason and blocks (zeros for a
  // namespace never seen). Never reports on any other namespace.
  NamespaceKvUsage namespace_usage(std::string_view tenant_namespace) const;
  void reset_stats();  // counters only; gauges always reflect the present
  // Events since the last drain, oldest first.
  std::vector<KvEvent> drain_events();
  uint64_t dropped_events() const;
  // Number of the newest event recorded so far (drained or not); 0 if none.
  uint64_t last_event_number() const;
  // Every block in the prefix cache now (either tier: moving between tiers
  // records no event), as kBlockStored events with
  // sequence_number 0, parents before children: what a consumer of the events
  // must hold after applying every event up to last_event_number(). A consumer
  // that lost events (a gap in the numbers) resynchronizes from it.
  // O(num_blocks).
  std::vector<KvEvent> cached_blocks() const;
  std::string_view eviction_policy_name() const;

  // Checks every invariant listed above; kInternal naming the first violation.
  // O(num_blocks + total block-table length): for tests and debug builds.
  Status verify_integrity() const;

 private:
  class Impl;
  explicit KvCacheManager(std::unique_ptr<Impl> impl);
  // Reclaims the namespaces a mutation left unreferenced, then hands back its result.
  template <typename T>
  T reclaiming(T result);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::kv
