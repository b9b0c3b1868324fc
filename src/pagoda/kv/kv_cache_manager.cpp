#include "pagoda/kv/kv_cache_manager.h"

#include <algorithm>
#include <cassert>
#include <deque>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/prefix_cache.h"

namespace pagoda::kv {

namespace {

struct Sequence {
  int32_t namespace_id = -1;
  std::vector<TokenId> tokens;  // every reserved token, prompt first
  std::vector<BlockId> blocks;  // ceil(tokens / block_size) ids; append-only
  int64_t computed = 0;         // tokens [0, computed) have K/V written
  int32_t next_block_to_cache = 0;  // blocks before this one were offered to the prefix cache
  // The prefix cache's block for each offered position (next_block_to_cache
  // entries): blocks[j] itself, or, when blocks[j] duplicated a block already
  // cached, that cached block, on which the sequence then holds one more
  // reference (an alias) so the chain below it stays valid. The table keeps
  // blocks[j] either way: tables are append-only, a backend may mirror them.
  std::vector<BlockId> chain;
  // Swapped out (swap_out): `blocks` and `chain` are empty and host_blocks
  // holds, per block position, the host block with its K/V (kNoBlock for a
  // reserved block with nothing written yet).
  bool swapped = false;
  std::vector<BlockId> host_blocks;
  // Token eviction compacted it (compact_sequence): its slots no longer hold
  // the K/V of its token prefix, so none of its blocks is ever offered to the
  // prefix cache (chain stays empty).
  bool compressed = false;
  // PrefixReuse::kSkip: where a written block duplicates a cached one the offers
  // end (offers_ended) rather than take an alias: a sequence that computes its
  // whole prompt would otherwise hold a cached prefix twice, its own blocks and
  // the cached ones, and may not fit where the prompt alone does.
  bool no_aliases = false;
  bool offers_ended = false;

  bool has_alias(size_t j) const { return j < chain.size() && chain[j] != blocks[j]; }
};

}  // namespace

class KvCacheManager::Impl {
 public:
  Impl(const KvCacheConfig& config, const Clock& clock, std::unique_ptr<EvictionPolicy> policy)
      : config_(config),
        clock_(clock),
        pool_(config.num_blocks, config.num_host_blocks),
        cache_(pool_, config.block_size, std::move(policy), make_eviction_policy(config.host_eviction_policy), clock,
               config.evicted_key_memory > 0 ? config.evicted_key_memory : std::max(config.num_blocks, 1 << 16)) {
    if (!config_.stable_key_fingerprint.empty()) cache_.enable_stable_keys(config_.stable_key_fingerprint);
    if (config_.record_events) {
      cache_.set_event_sink([this](KvEvent::Kind kind, BlockId block, uint64_t key, uint64_t parent_key, int32_t ns) {
        record_event(kind, block, key, parent_key, ns);
      });
    }
  }

  std::vector<int32_t> adopt_host_blocks(std::string_view ns, std::span<const TokenId> prompt, int32_t first,
                                         int32_t count, uint8_t origin) {
    std::vector<int32_t> out;
    if (!cache_.has_stable_keys() || !config_.enable_prefix_cache || first < 0 || count <= 0 ||
        static_cast<int64_t>(first + count) * bs() > static_cast<int64_t>(prompt.size()))
      return out;
    const PrefixMatch m = cache_.match(ns, prompt, first);
    if (static_cast<int32_t>(m.blocks.size()) != first) return out;
    const int32_t ns_id = intern(ns);
    BlockId parent = first == 0 ? kNoBlock : m.blocks.back();
    for (int32_t j = first; j < first + count; ++j) {
      const BlockId host = cache_.adopt_host(ns_id, parent, prompt.data() + static_cast<size_t>(j) * bs(), origin);
      if (host == kNoBlock) break;
      out.push_back(pool_.host_index(host));
      parent = host;
    }
    return out;
  }

  std::vector<int32_t> reserve_host_blocks(int32_t count) {
    std::vector<int32_t> out;
    while (static_cast<int32_t>(out.size()) < count && host_available() > 0) {
      const BlockId h = take_host_block();
      ++reserved_[static_cast<size_t>(h)];
      ++host_blocks_reserved_;
      out.push_back(pool_.host_index(h));
    }
    return out;
  }
  // Ends the reservation of host block `index`; false if it holds none.
  bool unreserve(int32_t index) {
    if (index < 0 || index >= pool_.num_host_blocks()) return false;
    const BlockId h = pool_.host_id(index);
    if (reserved_[static_cast<size_t>(h)] == 0) return false;
    --reserved_[static_cast<size_t>(h)];
    --host_blocks_reserved_;
    return true;
  }
  void release_host_blocks(std::span<const int32_t> hosts) {
    for (int32_t index : hosts)
      if (unreserve(index)) release(pool_.host_id(index));
  }
  int32_t adopt_reserved_host_blocks(std::string_view ns, std::span<const TokenId> prompt, int32_t first,
                                     std::span<const int32_t> hosts, uint8_t origin) {
    const auto count = static_cast<int32_t>(hosts.size());
    PrefixMatch m;  // the prompt's blocks cached now, from the start
    if (cache_.has_stable_keys() && config_.enable_prefix_cache && first >= 0 &&
        static_cast<int64_t>(first + count) * bs() <= static_cast<int64_t>(prompt.size()))
      m = cache_.match(ns, prompt, first + count);
    const auto have = static_cast<int32_t>(m.blocks.size());
    if (have < first || first < 0) {  // the prefix the blocks hang under is gone (or bad arguments)
      release_host_blocks(hosts);
      return 0;
    }
    BlockId parent = have == 0 ? kNoBlock : m.blocks.back();
    const int32_t ns_id = cache_.intern_namespace(ns);
    int32_t adopted = 0;
    for (int32_t j = 0; j < count; ++j) {
      const int32_t index = hosts[static_cast<size_t>(j)];
      if (first + j < have || (parent == kNoBlock && first + j > 0) || !unreserve(index)) {
        release_host_blocks(hosts.subspan(static_cast<size_t>(j), 1));
        continue;
      }
      const BlockId h = pool_.host_id(index);
      // Unreferenced before it becomes a node (release() would free an untracked block).
      pool_.meta(h).ref_count = 0;
      --host_blocks_referenced_;
      if (cache_.adopt_host_into(ns_id, parent, prompt.data() + static_cast<size_t>(first + j) * bs(), origin, h)) {
        parent = h;
        ++adopted;
      } else {
        pool_.free(h);
        parent = kNoBlock;  // the chain ends: the rest are released
      }
    }
    return adopted;
  }

  // ---- questions ----
  int32_t bs() const { return config_.block_size; }
  int32_t blocks_for_tokens(int64_t n) const {
    return n <= 0 ? 0 : static_cast<int32_t>((n + bs() - 1) / bs());
  }
  int32_t available() const { return pool_.num_free() + cache_.num_evictable(); }
  int32_t host_available() const { return pool_.num_host_free() + cache_.num_host_evictable(); }

  PrefixMatch match_prefix(std::string_view ns, std::span<const TokenId> prompt, std::span<const uint64_t> hashes,
                           PrefixReuse reuse = PrefixReuse::kRead) const {
    // At least one token must be computed: its logits are what we sample from.
    const int32_t max_blocks =
        prompt.empty() ? 0 : static_cast<int32_t>((static_cast<int64_t>(prompt.size()) - 1) / bs());
    if (!config_.enable_prefix_cache || reuse == PrefixReuse::kSkip) {
      PrefixMatch none;
      none.reason = max_blocks == 0                  ? MissReason::kShorterThanBlock
                    : reuse == PrefixReuse::kSkip ? MissReason::kNotRead
                                                   : MissReason::kNeverSeen;
      return none;
    }
    return in_whole_share_units(cache_.match(ns, prompt, max_blocks, hashes));
  }
  // A match cut down to whole prefix-share units (KvCacheConfig::prefix_share_min_tokens).
  PrefixMatch in_whole_share_units(PrefixMatch match) const {
    const int32_t unit = config_.prefix_share_min_tokens;
    if (unit <= 0 || match.cached_tokens % unit == 0) return match;
    const int32_t keep_blocks = match.cached_tokens / unit * (unit / bs());
    // Host blocks are the tail of the match: keep only those below the cut.
    const int32_t device_blocks = static_cast<int32_t>(match.blocks.size()) - match.host_blocks;
    match.blocks.resize(static_cast<size_t>(keep_blocks));
    match.host_blocks = std::max(0, keep_blocks - device_blocks);
    match.cached_tokens = keep_blocks * bs();
    match.reason = MissReason::kBelowShareUnit;
    return match;
  }

  // Blocks the sequence would need from the free/evictable supply, given a
  // match: host-tier hits need fresh device blocks too (promotion).
  int32_t new_blocks_for(const PrefixMatch& match, size_t prompt_size, int32_t* matched_evictable) const {
    int32_t evictable_in_match = 0;
    const size_t device_matched = match.blocks.size() - static_cast<size_t>(match.host_blocks);
    for (size_t j = 0; j < device_matched; ++j) evictable_in_match += pool_.meta(match.blocks[j]).ref_count == 0 ? 1 : 0;
    *matched_evictable = evictable_in_match;
    return blocks_for_tokens(static_cast<int64_t>(prompt_size)) - static_cast<int32_t>(device_matched);
  }

  bool can_allocate_sequence(std::string_view ns, std::span<const TokenId> prompt, std::span<const uint64_t> hashes,
                             PrefixReuse reuse) const {
    if (prompt.empty()) return false;
    const PrefixMatch match = match_prefix(ns, prompt, hashes, reuse);
    int32_t matched_evictable = 0;
    const int32_t needed = new_blocks_for(match, prompt.size(), &matched_evictable);
    return needed <= available() - matched_evictable && needed <= group_room(cache_.group_for(ns), matched_evictable);
  }

  // ---- caps per namespace group (a tenant and its salted user namespaces) ----
  int32_t group_limit(int32_t group) const {
    return group >= 0 && static_cast<size_t>(group) < block_limit_.size() ? block_limit_[group] : 0;
  }
  // New device blocks a group may still take: below its cap, plus its own
  // cached unreferenced device blocks (recycled for it), less those a match is
  // about to reuse.
  int32_t group_room(int32_t group, int32_t matched_evictable) const {
    const int32_t limit = group_limit(group);
    if (limit <= 0) return std::numeric_limits<int32_t>::max();
    return limit - pool_.num_held_by_group(group) + cache_.num_evictable_in_group(group) - matched_evictable;
  }
  int32_t sequence_room(const Sequence& s, int32_t matched_evictable) const {
    return group_room(pool_.group_of(s.namespace_id), matched_evictable);
  }
  NamespaceRoom namespace_room_for_sequence(std::string_view ns, std::span<const TokenId> prompt,
                                            std::span<const uint64_t> hashes, PrefixReuse reuse) const {
    const int32_t group = cache_.group_for(ns);
    if (group_limit(group) <= 0 || prompt.empty()) return NamespaceRoom::kFits;
    const PrefixMatch match = match_prefix(ns, prompt, hashes, reuse);
    int32_t matched_evictable = 0;
    const int32_t needed = new_blocks_for(match, prompt.size(), &matched_evictable);
    if (needed <= group_room(group, matched_evictable)) return NamespaceRoom::kFits;
    // Blocks the group's running sequences hold come back when they end; with none, waiting cannot help.
    const int32_t in_use = pool_.num_held_by_group(group) - cache_.num_evictable_in_group(group);
    return in_use > 0 ? NamespaceRoom::kWaitForOwnBlocks : NamespaceRoom::kNeverFits;
  }
  Status set_block_limit(std::string_view ns, int32_t limit) {
    const int32_t ns_id = intern(ns);
    PAGODA_RETURN_IF_ERROR(cache_.make_group(ns_id));
    if (static_cast<size_t>(ns_id) >= block_limit_.size()) block_limit_.resize(static_cast<size_t>(ns_id) + 1, 0);
    block_limit_[ns_id] = std::max(limit, 0);
    return ok_status();
  }

  // ---- the namespace table ----
  int32_t intern(std::string_view ns) {
    const int32_t id = cache_.intern_namespace(ns);
    maybe_idle_.push_back(id);  // reclaimed again at the end of the call if nothing came to refer to it
    return id;
  }
  int32_t live_sequences_in(int32_t ns_id) const {
    return static_cast<size_t>(ns_id) < sequences_in_.size() ? sequences_in_[ns_id] : 0;
  }
  void add_sequence_to(int32_t ns_id) {
    if (static_cast<size_t>(ns_id) >= sequences_in_.size()) sequences_in_.resize(static_cast<size_t>(ns_id) + 1, 0);
    ++sequences_in_[ns_id];
  }
  void remove_sequence_from(int32_t ns_id) {
    if (--sequences_in_[ns_id] == 0) maybe_idle_.push_back(ns_id);
  }
  bool namespace_unreferenced(int32_t ns_id) const {
    return cache_.namespace_unreferenced(ns_id) && live_sequences_in(ns_id) == 0;
  }
  // Reclaims every namespace that no block, node or sequence refers to any
  // more (and that is no group), so the table holds live state only. Run at
  // the end of every mutating call.
  void reclaim_unreferenced_namespaces() {
    std::vector<int32_t> maybe = pool_.take_released_holders();
    for (int32_t ns : cache_.take_released_namespaces()) maybe.push_back(ns);
    maybe.insert(maybe.end(), maybe_idle_.begin(), maybe_idle_.end());
    maybe_idle_.clear();
    for (int32_t ns : maybe) {
      if (!namespace_unreferenced(ns)) continue;  // also skips a slot reclaimed already
      cache_.reclaim_namespace(ns);
      if (static_cast<size_t>(ns) < ns_usage_.size()) ns_usage_[ns] = NamespaceKvUsage{};
      if (static_cast<size_t>(ns) < block_limit_.size()) block_limit_[ns] = 0;
      ++namespaces_reclaimed_;
    }
  }

  const Sequence* find(SequenceId id) const {
    const auto it = sequences_.find(id);
    return it == sequences_.end() ? nullptr : &it->second;
  }
  Sequence* find(SequenceId id) {
    const auto it = sequences_.find(id);
    return it == sequences_.end() ? nullptr : &it->second;
  }

  int32_t blocks_needed_to_append(SequenceId id, int32_t n) const {
    const Sequence* s = find(id);
    if (s == nullptr || n < 0 || s->swapped) return -1;
    return blocks_for_tokens(static_cast<int64_t>(s->tokens.size()) + n) - static_cast<int32_t>(s->blocks.size());
  }

  int32_t available_after_release(std::span<const SequenceId> ids) const {
    // Simulated ref drops: a block returns to the supply when every holder
    // is among the released sequences.
    std::unordered_set<SequenceId> unique(ids.begin(), ids.end());
    std::unordered_map<BlockId, int32_t> drops;
    for (SequenceId id : unique) {
      const Sequence* s = find(id);
      if (s == nullptr) continue;
      for (size_t j = 0; j < s->blocks.size(); ++j) {
        ++drops[s->blocks[j]];
        if (s->has_alias(j)) ++drops[s->chain[j]];
      }
    }
    int32_t gained = 0;
    for (const auto& [block, count] : drops) gained += pool_.meta(block).ref_count == count ? 1 : 0;
    return available() + gained;
  }

  // ---- block references ----
  // A fresh device block (ref 1) for a sequence of namespace `ns_id`: a free
  // one, else one made free by device eviction (which demotes to the host tier
  // when there is one). At its cap a group recycles its own cached blocks, of
  // any of its namespaces (callers checked group_room), so it never pushes
  // other groups out past it. A block whose last holder was another namespace
  // (another tag) is listed for zeroing.
  BlockId take_block(int32_t ns_id) {
    const int32_t group = pool_.group_of(ns_id);
    const int32_t limit = group_limit(group);
    if (limit > 0 && pool_.num_held_by_group(group) >= limit) cache_.evict_one_in_group(group);
    const uint64_t tag = cache_.namespace_tag(ns_id);
    uint64_t previous_tag = 0;
    BlockId b = pool_.allocate(BlockTier::kDevice, ns_id, tag, &previous_tag);
    if (b == kNoBlock) {
      cache_.evict_one();
      b = pool_.allocate(BlockTier::kDevice, ns_id, tag, &previous_tag);
    }
    // Callers check available() first, so this holds; keep it loud if not.
    assert(b != kNoBlock);
    pool_.meta(b).ref_count = 1;
    ++blocks_in_use_;
    // Tags, not slots: a namespace re-created in a reclaimed slot is another holder.
    if (config_.zero_blocks_between_namespaces && previous_tag != 0 && previous_tag != tag) queue_zero(b);
    return b;
  }
  void queue_zero(BlockId b) {
    if (zero_pending_[b]) return;
    zero_pending_[b] = true;
    blocks_to_zero_.push_back(b);
  }
  std::vector<BlockId> take_blocks_to_zero() {
    std::vector<BlockId> out;
    out.swap(blocks_to_zero_);
    for (BlockId b : out) zero_pending_[b] = false;
    return out;
  }
  NamespaceKvUsage& usage_of(int32_t ns_id) {
    if (static_cast<size_t>(ns_id) >= ns_usage_.size()) ns_usage_.resize(static_cast<size_t>(ns_id) + 1);
    return ns_usage_[ns_id];
  }
  NamespaceKvUsage namespace_usage(std::string_view ns) const {
    NamespaceKvUsage u;
    const int32_t id = cache_.find_namespace(ns);
    if (id < 0) return u;
    if (static_cast<size_t>(id) < ns_usage_.size()) u = ns_usage_[id];
    u.blocks_held = pool_.num_held(id);
    u.blocks_cached = cache_.num_cached_in(id);
    u.blocks_evictable = cache_.num_evictable_in(id);
    u.group_blocks_held = pool_.num_held_by_group(pool_.group_of(id));
    u.block_limit = group_limit(pool_.group_of(id));
    return u;
  }
  // A fresh host block (ref 1); callers check host_available() first.
  BlockId take_host_block() {
    const BlockId h = cache_.allocate_host_block();
    assert(h != kNoBlock);
    pool_.meta(h).ref_count = 1;
    ++host_blocks_referenced_;
    return h;
  }
  void acquire(BlockId b) {
    BlockMeta& m = pool_.meta(b);
    if (++m.ref_count == 1) {
      if (pool_.is_host(b)) {
        ++host_blocks_referenced_;
      } else {
        ++blocks_in_use_;
        written_slots_in_use_ += m.written_slots;
      }
      if (cache_.is_tracked(b)) cache_.on_referenced(b);
    }
  }
  void release(BlockId b) {
    BlockMeta& m = pool_.meta(b);
    if (--m.ref_count == 0) {
      if (pool_.is_host(b)) {
        --host_blocks_referenced_;
      } else {
        --blocks_in_use_;
        written_slots_in_use_ -= m.written_slots;
      }
      if (cache_.is_tracked(b)) cache_.on_unreferenced(b);
      else pool_.free(b);
    }
  }

  // ---- mutations ----
  StatusOr<PrefixMatch> allocate_sequence(SequenceId id, std::string_view ns, std::span<const TokenId> prompt,
                                          std::span<const uint64_t> hashes, PrefixReuse reuse) {
    if (prompt.empty()) return invalid_argument_error("allocate_sequence: sequence {} has an empty prompt", id);
    if (find(id) != nullptr) return invalid_argument_error("allocate_sequence: sequence {} already exists", id);
    PrefixMatch match = match_prefix(ns, prompt, hashes, reuse);
    int32_t matched_evictable = 0;
    const int32_t needed = new_blocks_for(match, prompt.size(), &matched_evictable);
    if (needed > available() - matched_evictable) {
      ++stats_.allocation_failures;
      return resource_exhausted_error("allocate_sequence: sequence {} needs {} new blocks, {} available", id, needed,
                                      available() - matched_evictable);
    }
    if (const int32_t room = group_room(cache_.group_for(ns), matched_evictable); needed > room) {
      ++stats_.allocation_failures;
      return resource_exhausted_error("allocate_sequence: sequence {} needs {} new blocks, its namespace's cap "
                                      "leaves {}",
                                      id, needed, room);
    }
    Sequence seq;
    seq.namespace_id = intern(ns);
    add_sequence_to(seq.namespace_id);
    seq.tokens.assign(prompt.begin(), prompt.end());
    seq.blocks.reserve(match.blocks.size() + static_cast<size_t>(needed));
    // Every matched block is referenced before any block is taken: a matched
    // device block must not be evicted for them, nor a matched host block
    // reclaimed for a demotion they cause.
    for (BlockId b : match.blocks) {
      acquire(b);
      cache_.touch(b, /*reused=*/true);
    }
    // Host hits move into fresh device blocks (host->device transfers); the
    // host blocks stay behind as their copies.
    const size_t device_matched = match.blocks.size() - static_cast<size_t>(match.host_blocks);
    for (size_t j = device_matched; j < match.blocks.size(); ++j) {
      const BlockId host = match.blocks[j];
      if (const uint8_t origin = cache_.origin(host); origin != 0)
        stats_.hit_tokens_by_lower_tier[origin - 1] += bs();
      const BlockId device = take_block(seq.namespace_id);
      written_slots_in_use_ += bs();
      cache_.promote(host, device);
      release(host);
      match.blocks[j] = device;
    }
    seq.blocks = match.blocks;
    for (int32_t i = 0; i < needed - match.host_blocks; ++i) seq.blocks.push_back(take_block(seq.namespace_id));
    seq.computed = match.cached_tokens;
    seq.no_aliases = reuse == PrefixReuse::kSkip;
    seq.next_block_to_cache = static_cast<int32_t>(match.blocks.size());
    seq.chain = match.blocks;
    sequences_.emplace(id, std::move(seq));
    record_match_stats(match, static_cast<int64_t>(prompt.size()), usage_of(seq.namespace_id));
    return match;
  }

  // Counts into the totals and into the namespace's own figures.
  void record_match_stats(const PrefixMatch& match, int64_t prompt_size, NamespaceKvUsage& ns) {
    const int64_t max_blocks = (prompt_size - 1) / bs();
    const int64_t tail = prompt_size - max_blocks * bs();
    const int64_t missed_full = max_blocks * bs() - match.cached_tokens;
    stats_.hit_tokens_by_tier[1] += static_cast<int64_t>(match.host_blocks) * bs();
    stats_.hit_tokens_by_tier[0] += match.cached_tokens - static_cast<int64_t>(match.host_blocks) * bs();
    auto add = [&](int64_t& hit, int64_t& miss, std::array<int64_t, kNumMissReasons>& by_reason, int64_t& allocated,
                   MissReason reason) {
      hit += match.cached_tokens;
      miss += prompt_size - match.cached_tokens;
      by_reason[static_cast<int>(MissReason::kShorterThanBlock)] += tail;
      if (missed_full > 0) by_reason[static_cast<int>(reason)] += missed_full;
      ++allocated;
    };
    add(stats_.hit_tokens, stats_.miss_tokens, stats_.miss_tokens_by_reason, stats_.sequences_allocated, match.reason);
    // With a share unit, a namespace's own figures do not tell why a full block missed.
    add(ns.hit_tokens, ns.miss_tokens, ns.miss_tokens_by_reason, ns.sequences_allocated,
        config_.prefix_share_min_tokens > 0 ? MissReason::kNeverSeen : match.reason);
    stats_.blocks_reused += static_cast<int64_t>(match.blocks.size());
  }

  Status append_tokens(SequenceId id, std::span<const TokenId> tokens) {
    Sequence* s = find(id);
    if (s == nullptr) return not_found_error("append_tokens: unknown sequence {}", id);
    if (s->swapped) return failed_precondition_error("append_tokens: sequence {} is swapped out", id);
    const int32_t needed = blocks_needed_to_append(id, static_cast<int32_t>(tokens.size()));
    if (needed > available()) {
      ++stats_.allocation_failures;
      return resource_exhausted_error("append_tokens: sequence {} needs {} new blocks, {} available", id, needed,
                                      available());
    }
    if (const int32_t room = sequence_room(*s, 0); needed > room) {
      ++stats_.allocation_failures;
      return resource_exhausted_error("append_tokens: sequence {} needs {} new blocks, its namespace's cap leaves {}",
                                      id, needed, room);
    }
    for (int32_t i = 0; i < needed; ++i) s->blocks.push_back(take_block(s->namespace_id));
    s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
    return ok_status();
  }

  Status set_token(SequenceId id, int64_t position, TokenId token) {
    Sequence* s = find(id);
    if (s == nullptr) return not_found_error("set_token: unknown sequence {}", id);
    if (position < s->computed || position >= static_cast<int64_t>(s->tokens.size()))
      return out_of_range_error("set_token: sequence {}: position {} is not a reserved token past the {} computed "
                                "(of {})", id, position, s->computed, s->tokens.size());
    s->tokens[static_cast<size_t>(position)] = token;
    return ok_status();
  }

  Status mark_computed(SequenceId id, int64_t n) {
    Sequence* s = find(id);
    if (s == nullptr) return not_found_error("mark_computed: unknown sequence {}", id);
    if (s->swapped) return failed_precondition_error("mark_computed: sequence {} is swapped out", id);
    if (n < 0) return invalid_argument_error("mark_computed: sequence {}: negative token count {}", id, n);
    const int64_t total = static_cast<int64_t>(s->tokens.size());
    if (s->computed + n > total)
      return out_of_range_error("mark_computed: sequence {}: {} computed + {} new exceeds {} reserved tokens", id,
                                s->computed, n, total);
    if (n == 0) return ok_status();
    const int64_t new_computed = s->computed + n;
    for (int64_t j = s->computed / bs(); j <= (new_computed - 1) / bs(); ++j) {
      BlockMeta& m = pool_.meta(s->blocks[j]);
      const auto written = static_cast<uint16_t>(std::min<int64_t>(bs(), new_computed - j * bs()));
      written_slots_in_use_ += written - m.written_slots;
      m.written_slots = written;
    }
    s->computed = new_computed;
    offer_full_blocks(*s);
    return ok_status();
  }

  // Full written blocks enter the prefix cache, in order.
  void offer_full_blocks(Sequence& s) {
    if (s.compressed || s.offers_ended) return;
    const int32_t full = static_cast<int32_t>(s.computed / bs());
    for (; s.next_block_to_cache < full; ++s.next_block_to_cache) {
      const int32_t j = s.next_block_to_cache;
      s.chain.push_back(s.blocks[j]);
      if (!config_.enable_prefix_cache) continue;
      const BlockId parent = j == 0 ? kNoBlock : s.chain[j - 1];
      if (parent != kNoBlock && !pool_.meta(parent).is_cached()) continue;  // chain broken (dropped)
      const PrefixCache::InsertResult r =
          cache_.insert(s.blocks[j], s.namespace_id, parent, s.tokens.data() + static_cast<size_t>(j) * bs());
      if (r.outcome == PrefixCache::InsertOutcome::kInserted) {
        ++stats_.blocks_stored;
        if (config_.host_write_through) cache_.write_through(s.blocks[j]);
      } else if (r.outcome == PrefixCache::InsertOutcome::kDuplicate && s.no_aliases) {
        ++s.next_block_to_cache;
        s.offers_ended = true;
        return;
      } else if (r.outcome == PrefixCache::InsertOutcome::kDuplicate) {
        // Same tokens at the same positions in the same namespace were computed
        // by another sequence first. Our block stays in the table (tables are
        // append-only) and is freed with the sequence; the cached one becomes
        // this position's link in the chain, so later blocks hang below it.
        acquire(r.existing);
        cache_.touch(r.existing, /*reused=*/false);
        s.chain[j] = r.existing;
        ++stats_.blocks_deduplicated;
      }
    }
  }

  StatusOr<std::vector<BlockCopy>> fork(SequenceId parent_id, SequenceId child_id) {
    const Sequence* parent = find(parent_id);
    if (parent == nullptr) return not_found_error("fork: unknown parent sequence {}", parent_id);
    if (find(child_id) != nullptr) return invalid_argument_error("fork: child sequence {} already exists", child_id);
    if (parent->swapped) return failed_precondition_error("fork: parent sequence {} is swapped out", parent_id);
    const int32_t shared_blocks = static_cast<int32_t>(parent->computed / bs());
    const int32_t needed = static_cast<int32_t>(parent->blocks.size()) - shared_blocks;
    if (needed > available() || needed > sequence_room(*parent, 0)) {
      ++stats_.allocation_failures;
      return resource_exhausted_error("fork: sequence {} -> {} needs {} new blocks, {} available ({} under its "
                                      "namespace's cap)",
                                      parent_id, child_id, needed, available(), sequence_room(*parent, 0));
    }
    Sequence child;
    child.namespace_id = parent->namespace_id;
    add_sequence_to(child.namespace_id);
    child.tokens = parent->tokens;
    child.computed = parent->computed;
    child.next_block_to_cache = parent->next_block_to_cache;
    child.compressed = parent->compressed;
    child.chain = parent->chain;
    for (size_t j = 0; j < parent->chain.size(); ++j)
      if (parent->has_alias(j)) acquire(parent->chain[j]);
    child.blocks.reserve(parent->blocks.size());
    std::vector<BlockCopy> copies;
    for (int32_t j = 0; j < shared_blocks; ++j) {
      acquire(parent->blocks[j]);
      child.blocks.push_back(parent->blocks[j]);
    }
    for (size_t j = static_cast<size_t>(shared_blocks); j < parent->blocks.size(); ++j) {
      const BlockId src = parent->blocks[j];
      const BlockId dst = take_block(child.namespace_id);
      const uint16_t written = pool_.meta(src).written_slots;
      pool_.meta(dst).written_slots = written;
      written_slots_in_use_ += written;
      if (written > 0) copies.push_back(BlockCopy{src, dst});
      child.blocks.push_back(dst);
    }
    sequences_.emplace(child_id, std::move(child));
    return copies;
  }

  Status release_sequence(SequenceId id, bool aborted) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end())
      return not_found_error("{}: unknown sequence {}", aborted ? "abort_sequence" : "free_sequence", id);
    // Deepest first, so each block's descendants are already released.
    const Sequence& s = it->second;
    release_device_blocks(s);
    for (size_t j = s.host_blocks.size(); j-- > 0;)
      if (s.host_blocks[j] != kNoBlock) release(s.host_blocks[j]);
    remove_sequence_from(s.namespace_id);
    sequences_.erase(it);
    if (aborted) ++stats_.sequences_aborted;
    return ok_status();
  }

  StatusOr<SequenceCompaction> compact_sequence(SequenceId id, int64_t kept) {
    Sequence* s = find(id);
    if (s == nullptr) return not_found_error("compact_sequence: unknown sequence {}", id);
    if (s->swapped) return failed_precondition_error("compact_sequence: sequence {} is swapped out", id);
    if (kept < 0 || kept > s->computed)
      return invalid_argument_error("compact_sequence: sequence {}: cannot keep {} of {} computed tokens", id, kept,
                                    s->computed);
    const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
    // The kept slots go to fresh blocks; the reserved-but-unwritten tail
    // moves over in the old blocks that hold nothing yet (a prompt reserved
    // whole and compacted between its chunks would otherwise need its
    // reservation twice), topped up with fresh blocks when rounding asks.
    const int32_t kept_blocks = blocks_for_tokens(kept);
    const int32_t total_blocks = blocks_for_tokens(kept + pending);
    const auto first_empty = static_cast<size_t>(blocks_for_tokens(s->computed));
    const int32_t reused = std::min(static_cast<int32_t>(s->blocks.size() - std::min(first_empty, s->blocks.size())),
                                    total_blocks - kept_blocks);
    const int32_t needed = total_blocks - reused;
    // The fresh blocks come first: the old ones must stay readable (and so
    // unavailable) until the runner has copied from them.
    if (needed > available() || needed > sequence_room(*s, 0)) {
      ++stats_.allocation_failures;
      return resource_exhausted_error("compact_sequence: sequence {} needs {} new blocks, {} available ({} under its "
                                      "namespace's cap)",
                                      id, needed, available(), sequence_room(*s, 0));
    }
    SequenceCompaction out;
    out.old_blocks = s->blocks;
    auto take_fresh = [&](int32_t j) {
      const BlockId b = take_block(s->namespace_id);
      const auto written = static_cast<uint16_t>(std::clamp<int64_t>(kept - static_cast<int64_t>(j) * bs(), 0, bs()));
      pool_.meta(b).written_slots = written;
      written_slots_in_use_ += written;
      out.new_blocks.push_back(b);
    };
    for (int32_t j = 0; j < kept_blocks; ++j) take_fresh(j);
    for (int32_t r = 0; r < reused; ++r) out.new_blocks.push_back(s->blocks[first_empty + static_cast<size_t>(r)]);
    for (int32_t j = kept_blocks + reused; j < total_blocks; ++j) take_fresh(j);
    // The reused blocks stay referenced, by the new table instead of the old.
    s->blocks.erase(s->blocks.begin() + static_cast<std::ptrdiff_t>(first_empty),
                    s->blocks.begin() + static_cast<std::ptrdiff_t>(first_empty) + reused);
    // The old blocks: cached ones stay cached (their K/V is untouched), the rest are freed.
    release_device_blocks(*s);
    std::vector<TokenId> tokens(static_cast<size_t>(kept), 0);
    tokens.insert(tokens.end(), s->tokens.end() - pending, s->tokens.end());
    s->tokens = std::move(tokens);
    s->blocks = out.new_blocks;
    s->chain.clear();
    s->next_block_to_cache = 0;
    s->computed = kept;
    s->compressed = true;
    return out;
  }

  void release_device_blocks(const Sequence& s) {
    for (size_t j = s.blocks.size(); j-- > 0;) {
      release(s.blocks[j]);
      if (s.has_alias(j)) release(s.chain[j]);
    }
  }

  // ---- the host tier: swap ----
  Status swap_out(SequenceId id);
  // Device blocks swap_in(id) then appending `extra` tokens would take; -1 if
  // the sequence is unknown or not swapped. *reused_evictable: unreferenced
  // device blocks swap_in would reference (they leave the available supply).
  int32_t swap_in_blocks(SequenceId id, int32_t extra, int32_t* reused_evictable) const;
  Status swap_in(SequenceId id);
  std::vector<SequenceId> transfers_failed(std::span<const BlockTransfer> failed);

  int32_t drop_conversation(std::string_view ns, std::span<const TokenId> tokens, int64_t keep) {
    if (!config_.enable_prefix_cache || keep < 0) return 0;
    const int32_t full = static_cast<int32_t>(tokens.size() / static_cast<size_t>(bs()));
    const PrefixMatch path = cache_.match(ns, tokens, full);
    const int64_t start = keep / bs();
    if (static_cast<int64_t>(path.blocks.size()) <= start) return 0;
    return cache_.remove_subtree(path.blocks[static_cast<size_t>(start)], RemovalReason::kDroppedConversation);
  }

  int32_t evict(int32_t n) {
    int32_t evicted = 0;
    while (evicted < n && cache_.evict_one()) ++evicted;
    return evicted;
  }

  void record_event(KvEvent::Kind kind, BlockId block, uint64_t key, uint64_t parent_key, int32_t ns) {
    if (static_cast<int32_t>(events_.size()) >= config_.max_pending_events) {
      events_.pop_front();
      ++dropped_events_;
    }
    events_.push_back(KvEvent{++next_event_number_, kind, block, key, parent_key, cache_.namespace_name(ns)});
  }

  KvStats stats() const {
    KvStats s = stats_;
    s.removed_blocks_by_reason = cache_.removed_by_reason();
    const PrefixCache::TierCounters& tier = cache_.tier_counters();
    s.blocks_written_back = tier.written_back;
    s.blocks_demoted = tier.demoted;
    s.blocks_promoted = tier.promoted;
    s.host_blocks_evicted = tier.host_evicted;
    s.host_blocks_total = pool_.num_host_blocks();
    s.host_blocks_free = pool_.num_host_free();
    s.host_blocks_cached = cache_.num_host_cached();
    int32_t swapped = 0, swapped_blocks = 0;
    for (const auto& [id, seq] : sequences_) {
      if (!seq.swapped) continue;
      ++swapped;
      for (BlockId h : seq.host_blocks) swapped_blocks += h != kNoBlock ? 1 : 0;
    }
    s.sequences_swapped = swapped;
    s.host_blocks_swapped = swapped_blocks;
    s.host_blocks_reserved = host_blocks_reserved_;
    s.blocks_total = pool_.num_blocks();
    s.blocks_free = pool_.num_free();
    s.blocks_in_use = blocks_in_use_;
    s.blocks_cached = cache_.num_cached();
    s.blocks_evictable = cache_.num_evictable();
    s.namespaces_live = cache_.num_live_namespaces();
    s.namespaces_reclaimed = namespaces_reclaimed_;
    s.allocated_slots = static_cast<int64_t>(blocks_in_use_) * bs();
    s.unwritten_slots = s.allocated_slots - written_slots_in_use_;
    return s;
  }
  void reset_stats() {
    stats_ = KvStats{};
    ns_usage_.clear();
    cache_.reset_counters();
  }

  Status verify_integrity() const;

  KvCacheConfig config_;
  const Clock& clock_;
  BlockPool pool_;
  PrefixCache cache_;
  std::unordered_map<SequenceId, Sequence> sequences_;
  KvStats stats_;
  int32_t blocks_in_use_ = 0;
  int64_t written_slots_in_use_ = 0;
  int32_t host_blocks_referenced_ = 0;
  // Host blocks held by reserve_host_blocks (per block id: 0 or 1).
  std::vector<uint8_t> reserved_ = std::vector<uint8_t>(static_cast<size_t>(pool_.num_ids()), 0);
  int32_t host_blocks_reserved_ = 0;
  std::vector<NamespaceKvUsage> ns_usage_;  // counters by namespace id
  std::vector<int32_t> block_limit_;         // caps by group (namespace id); 0: none
  std::vector<int32_t> sequences_in_;        // live sequences by namespace id
  std::vector<int32_t> maybe_idle_;          // namespaces to check in reclaim_unreferenced_namespaces()
  int64_t namespaces_reclaimed_ = 0;
  std::vector<BlockId> blocks_to_zero_;      // see take_blocks_to_zero()
  std::vector<bool> zero_pending_ = std::vector<bool>(static_cast<size_t>(pool_.num_ids()), false);
  std::deque<KvEvent> events_;
  uint64_t next_event_number_ = 0;
  uint64_t dropped_events_ = 0;
};

Status KvCacheManager::Impl::swap_out(SequenceId id) {
  Sequence* s = find(id);
  if (s == nullptr) return not_found_error("swap_out: unknown sequence {}", id);
  if (s->swapped) return failed_precondition_error("swap_out: sequence {} is swapped out already", id);
  if (pool_.num_host_blocks() == 0) return failed_precondition_error("swap_out: there is no host tier");
  // The K/V to keep per position: the table's block, or for an alias the
  // cached block the prefix cache knows (same tokens, same positions), so the
  // sequence comes back with one chain and no aliases.
  const size_t n = s->blocks.size();
  std::vector<BlockId> source(n, kNoBlock);
  for (size_t j = 0; j < n; ++j)
    if (pool_.meta(s->blocks[j]).written_slots > 0) source[j] = s->has_alias(j) ? s->chain[j] : s->blocks[j];
  // Existing host copies are referenced first (host eviction must not take
  // them), then the rest must fit in what host eviction can free.
  std::vector<BlockId> host(n, kNoBlock);
  int32_t needed = 0;
  for (size_t j = 0; j < n; ++j) {
    if (source[j] == kNoBlock) continue;
    const BlockId twin = pool_.meta(source[j]).is_cached() ? cache_.twin(source[j]) : kNoBlock;
    if (twin != kNoBlock) {
      acquire(twin);
      host[j] = twin;
    } else {
      ++needed;
    }
  }
  if (needed > host_available()) {
    for (BlockId h : host)
      if (h != kNoBlock) release(h);
    ++stats_.swap_out_failures;
    return resource_exhausted_error("swap_out: sequence {} needs {} host blocks, {} available", id, needed,
                                    host_available());
  }
  for (size_t j = 0; j < n; ++j) {
    if (source[j] == kNoBlock || host[j] != kNoBlock) continue;
    const BlockId h = take_host_block();
    host[j] = h;
    if (pool_.meta(source[j]).is_cached()) {
      cache_.add_twin(source[j], h);  // a cached block gains a host copy: its demotion then copies nothing
    } else {
      pool_.meta(h).written_slots = pool_.meta(source[j]).written_slots;
      cache_.record_transfer(BlockTransfer{TransferDirection::kDeviceToHost, source[j], pool_.host_index(h)});
    }
  }
  release_device_blocks(*s);
  s->blocks.clear();
  s->chain.clear();
  s->host_blocks = std::move(host);
  s->swapped = true;
  ++stats_.swap_outs;
  return ok_status();
}

int32_t KvCacheManager::Impl::swap_in_blocks(SequenceId id, int32_t extra, int32_t* reused_evictable) const {
  const Sequence* s = find(id);
  *reused_evictable = 0;
  if (s == nullptr || !s->swapped || extra < 0) return -1;
  int32_t needed = 0;
  for (BlockId h : s->host_blocks) {
    const BlockId device = h == kNoBlock ? kNoBlock : cache_.twin(h);
    if (device == kNoBlock) {
      ++needed;
    } else if (pool_.meta(device).ref_count == 0) {
      ++*reused_evictable;
    }
  }
  const int32_t total = blocks_for_tokens(static_cast<int64_t>(s->tokens.size()) + extra);
  return needed + std::max(0, total - static_cast<int32_t>(s->host_blocks.size()));
}

Status KvCacheManager::Impl::swap_in(SequenceId id) {
  Sequence* s = find(id);
  if (s == nullptr) return not_found_error("swap_in: unknown sequence {}", id);
  if (!s->swapped) return failed_precondition_error("swap_in: sequence {} is not swapped out", id);
  int32_t reused_evictable = 0;
  const int32_t needed = swap_in_blocks(id, 0, &reused_evictable);
  if (needed > available() - reused_evictable) {
    ++stats_.allocation_failures;
    return resource_exhausted_error("swap_in: sequence {} needs {} device blocks, {} available", id, needed,
                                    available() - reused_evictable);
  }
  if (const int32_t room = sequence_room(*s, reused_evictable); needed > room) {
    ++stats_.allocation_failures;
    return resource_exhausted_error("swap_in: sequence {} needs {} device blocks, its namespace's cap leaves {}", id,
                                    needed, room);
  }
  const size_t n = s->host_blocks.size();
  std::vector<BlockId> blocks(n, kNoBlock);
  // Device blocks that still hold a position's K/V (the device side of a host
  // copy) are referenced before any block is taken, so none is evicted for them.
  for (size_t j = 0; j < n; ++j) {
    const BlockId h = s->host_blocks[j];
    if (h != kNoBlock && cache_.twin(h) != kNoBlock) {
      blocks[j] = cache_.twin(h);
      acquire(blocks[j]);
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (blocks[j] != kNoBlock) continue;
    const BlockId h = s->host_blocks[j];
    const BlockId device = take_block(s->namespace_id);
    blocks[j] = device;
    if (h == kNoBlock) continue;  // reserved, nothing written yet
    if (pool_.meta(h).is_cached()) {
      // Demoted while swapped out: it comes back as a device node (its parent,
      // the previous position, is on the device by now).
      written_slots_in_use_ += bs();
      cache_.promote(h, device);
    } else {
      const uint16_t written = pool_.meta(h).written_slots;
      pool_.meta(device).written_slots = written;
      written_slots_in_use_ += written;
      cache_.record_transfer(BlockTransfer{TransferDirection::kHostToDevice, device, pool_.host_index(h)});
    }
  }
  for (size_t j = n; j-- > 0;)
    if (s->host_blocks[j] != kNoBlock) release(s->host_blocks[j]);
  s->host_blocks.clear();
  s->blocks = std::move(blocks);
  s->chain.assign(s->blocks.begin(), s->blocks.begin() + s->next_block_to_cache);
  s->swapped = false;
  ++stats_.swap_ins;
  return ok_status();
}

std::vector<SequenceId> KvCacheManager::Impl::transfers_failed(std::span<const BlockTransfer> failed) {
  // Every destination of a failed batch is garbage: drop what the cache knows
  // of it (a miss later), and name the sequences whose own K/V was there.
  std::unordered_set<BlockId> lost;
  for (const BlockTransfer& t : failed) {
    const bool to_host = t.direction == TransferDirection::kDeviceToHost;
    if (to_host ? (t.host_block < 0 || t.host_block >= pool_.num_host_blocks())
                : (t.device_block < 0 || t.device_block >= pool_.num_blocks()))
      continue;
    lost.insert(to_host ? pool_.host_id(t.host_block) : t.device_block);
  }
  for (BlockId b : lost) {
    ++stats_.blocks_lost;
    cache_.drop_lost(b);
  }
  std::vector<SequenceId> out;
  for (const auto& [id, s] : sequences_) {
    bool hit = false;
    for (BlockId b : s.swapped ? s.host_blocks : s.blocks) hit |= b != kNoBlock && lost.count(b) != 0;
    if (hit) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status KvCacheManager::Impl::verify_integrity() const {
  PAGODA_RETURN_IF_ERROR(pool_.verify_integrity());
  PAGODA_RETURN_IF_ERROR(cache_.verify_integrity());
  std::vector<int32_t> refs(static_cast<size_t>(pool_.num_ids()), 0);
  for (const auto& [id, s] : sequences_) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (s.computed < 0 || s.computed > n) return internal_error("sequence {}: {} computed of {} tokens", id, s.computed, n);
    if (s.swapped) {
      if (!s.blocks.empty() || !s.chain.empty())
        return internal_error("swapped sequence {} still holds {} device blocks", id, s.blocks.size());
      if (static_cast<int32_t>(s.host_blocks.size()) != blocks_for_tokens(n))
        return internal_error("swapped sequence {}: {} host blocks for {} tokens", id, s.host_blocks.size(), n);
      for (size_t j = 0; j < s.host_blocks.size(); ++j) {
        const BlockId h = s.host_blocks[j];
        const int64_t expected_written = std::clamp<int64_t>(s.computed - static_cast<int64_t>(j) * bs(), 0, bs());
        if (h == kNoBlock) {
          if (expected_written != 0)
            return internal_error("swapped sequence {}: block #{} holds {} written slots but has no host block", id,
                                  j, expected_written);
          continue;
        }
        if (h < pool_.num_blocks() || h >= pool_.num_ids())
          return internal_error("swapped sequence {}: block #{} is {}, not a host-tier id", id, j, h);
        ++refs[h];
        const BlockMeta& m = pool_.meta(h);
        if (m.is_free) return internal_error("swapped sequence {} holds free host block {}", id, h);
        if (m.written_slots != expected_written)
          return internal_error("swapped sequence {} host block {} (#{}) has {} written slots, expected {}", id, h, j,
                                m.written_slots, expected_written);
      }
      continue;
    }
    if (!s.host_blocks.empty()) return internal_error("running sequence {} holds host blocks", id);
    if (s.compressed && !s.chain.empty())
      return internal_error("compressed sequence {} offered {} blocks to the prefix cache", id, s.chain.size());
    if (static_cast<int32_t>(s.blocks.size()) != blocks_for_tokens(n))
      return internal_error("sequence {}: {} blocks for {} tokens", id, s.blocks.size(), n);
    if (s.chain.size() != static_cast<size_t>(s.next_block_to_cache) || s.chain.size() > s.blocks.size())
      return internal_error("sequence {}: {} chain links for {} offered blocks", id, s.chain.size(),
                            s.next_block_to_cache);
    bool chain_cached = true;
    for (size_t j = 0; j < s.blocks.size(); ++j) {
      const BlockId b = s.blocks[j];
      if (b < 0 || b >= pool_.num_blocks()) return internal_error("sequence {}: invalid device block id {}", id, b);
      ++refs[b];
      const BlockMeta& m = pool_.meta(b);
      if (m.is_free) return internal_error("sequence {} holds free block {}", id, b);
      const int64_t expected_written = std::clamp<int64_t>(s.computed - static_cast<int64_t>(j) * bs(), 0, bs());
      if (m.written_slots != expected_written)
        return internal_error("sequence {} block {} (#{}) has {} written slots, expected {}", id, b, j,
                              m.written_slots, expected_written);
      if (expected_written < bs() && m.ref_count != 1)
        return internal_error("sequence {}: partial block {} is shared (ref {})", id, b, m.ref_count);
      // The block the prefix cache knows for this position: the table's, or an alias.
      BlockId link = b;
      if (s.has_alias(j)) {
        link = s.chain[j];
        if (link < 0 || link >= pool_.num_blocks()) return internal_error("sequence {}: invalid alias {}", id, link);
        ++refs[link];
        if (m.is_cached()) return internal_error("sequence {}: block {} is cached beside its alias {}", id, b, link);
        if (pool_.meta(link).is_free) return internal_error("sequence {} holds free alias block {}", id, link);
      }
      const BlockMeta& lm = pool_.meta(link);
      if (lm.is_cached()) {
        if (j >= s.chain.size()) return internal_error("sequence {}: block {} is cached before it was offered", id, b);
        if (!chain_cached) return internal_error("sequence {}: cached block {} after an uncached one", id, link);
        if (lm.namespace_id != s.namespace_id)
          return internal_error("sequence {}: block {} cached under namespace {}, sequence is in {}", id, link,
                                lm.namespace_id, s.namespace_id);
        if (lm.parent != (j == 0 ? kNoBlock : s.chain[j - 1]))
          return internal_error("sequence {}: block {} has tree parent {}, chain says {}", id, link, lm.parent,
                                j == 0 ? kNoBlock : s.chain[j - 1]);
        if (!std::equal(s.tokens.begin() + static_cast<int64_t>(j) * bs(),
                        s.tokens.begin() + static_cast<int64_t>(j + 1) * bs(), cache_.block_tokens(link)))
          return internal_error("sequence {}: cached block {} holds other tokens than the sequence", id, link);
      } else {
        chain_cached = false;
      }
    }
  }
  int32_t reserved = 0;
  for (BlockId b = 0; b < pool_.num_ids(); ++b) {
    if (reserved_[static_cast<size_t>(b)] == 0) continue;
    if (!pool_.is_host(b)) return internal_error("device block {} is reserved for a lower-tier read", b);
    if (pool_.meta(b).is_free || cache_.is_tracked(b))
      return internal_error("host block {} is reserved for a lower-tier read but is {}", b,
                            pool_.meta(b).is_free ? "free" : "cached");
    refs[b] += reserved_[static_cast<size_t>(b)];
    reserved += reserved_[static_cast<size_t>(b)];
  }
  if (reserved != host_blocks_reserved_)
    return internal_error("{} host blocks reserved, counter says {}", reserved, host_blocks_reserved_);
  int32_t in_use = 0, host_referenced = 0;
  int64_t written = 0;
  for (BlockId b = 0; b < pool_.num_ids(); ++b) {
    const BlockMeta& m = pool_.meta(b);
    if (m.ref_count != refs[b])
      return internal_error("block {}: ref count {}, but {} block tables, aliases and reservations hold it", b,
                            m.ref_count, refs[b]);
    if (m.ref_count == 0 && !m.is_free && !cache_.is_tracked(b))
      return internal_error("{} block {} is leaked: unreferenced, uncached and not free",
                            block_tier_name(pool_.tier(b)), b);
    if (m.ref_count > 0 && pool_.is_host(b)) ++host_referenced;
    if (m.ref_count > 0 && !pool_.is_host(b)) {
      ++in_use;
      written += m.written_slots;
    }
  }
  if (in_use != blocks_in_use_) return internal_error("{} blocks in use, counter says {}", in_use, blocks_in_use_);
  if (host_referenced != host_blocks_referenced_)
    return internal_error("{} host blocks referenced, counter says {}", host_referenced, host_blocks_referenced_);
  if (written != written_slots_in_use_)
    return internal_error("{} written slots in use, counter says {}", written, written_slots_in_use_);
  if (pool_.num_free() + cache_.num_evictable() + blocks_in_use_ != pool_.num_blocks())
    return internal_error("free {} + evictable {} + in use {} != {} blocks", pool_.num_free(), cache_.num_evictable(),
                          blocks_in_use_, pool_.num_blocks());
  // The namespace table: live sequences per namespace, and no entry that
  // nothing refers to (reclaimed at the end of every mutating call).
  std::vector<int32_t> sequences_in(static_cast<size_t>(cache_.num_namespace_slots()), 0);
  for (const auto& [id, s] : sequences_) {
    if (!cache_.is_live(s.namespace_id)) return internal_error("sequence {} is in a reclaimed namespace slot", id);
    ++sequences_in[s.namespace_id];
  }
  for (int32_t ns = 0; ns < cache_.num_namespace_slots(); ++ns) {
    if (sequences_in[ns] != live_sequences_in(ns))
      return internal_error("namespace {} has {} live sequences, counter says {}", ns, sequences_in[ns],
                            live_sequences_in(ns));
    if (namespace_unreferenced(ns))
      return internal_error("namespace {} ('{}') is referred to by nothing but was not reclaimed", ns,
                            cache_.namespace_name(ns));
  }
  return ok_status();
}

// ---- facade ----------------------------------------------------------------------

bool KvCacheManager::has_stable_keys() const { return !impl_->config_.stable_key_fingerprint.empty(); }

std::vector<StableKey> KvCacheManager::stable_keys(std::string_view ns, std::span<const TokenId> prompt,
                                                   int32_t num_blocks) const {
  std::vector<StableKey> keys;
  const int32_t bs = impl_->config_.block_size;
  if (!has_stable_keys() || num_blocks <= 0) return keys;
  num_blocks = std::min<int64_t>(num_blocks, static_cast<int64_t>(prompt.size()) / bs);
  keys.reserve(static_cast<size_t>(num_blocks));
  StableKey key = stable_namespace_root(impl_->config_.stable_key_fingerprint, ns);
  for (int32_t j = 0; j < num_blocks; ++j) {
    key = stable_block_key(key, prompt.data() + static_cast<size_t>(j) * bs, bs);
    keys.push_back(key);
  }
  return keys;
}

std::optional<StableKey> KvCacheManager::host_block_stable_key(int32_t host_index) const {
  if (host_index < 0 || host_index >= impl_->pool_.num_host_blocks()) return std::nullopt;
  const StableKey* key = impl_->cache_.stable_key(impl_->pool_.host_id(host_index));
  if (key == nullptr) return std::nullopt;
  return *key;
}

std::vector<int32_t> KvCacheManager::reserve_host_blocks(int32_t count) { return impl_->reserve_host_blocks(count); }

void KvCacheManager::release_host_blocks(std::span<const int32_t> host_blocks) {
  impl_->release_host_blocks(host_blocks);
}

int32_t KvCacheManager::adopt_reserved_host_blocks(std::string_view ns, std::span<const TokenId> prompt,
                                                   int32_t first_block, std::span<const int32_t> host_blocks,
                                                   uint8_t origin) {
  return impl_->adopt_reserved_host_blocks(ns, prompt, first_block, host_blocks, origin);
}

std::vector<int32_t> KvCacheManager::adopt_host_blocks(std::string_view ns, std::span<const TokenId> prompt,
                                                       int32_t first_block, int32_t count, uint8_t origin) {
  auto out = impl_->adopt_host_blocks(ns, prompt, first_block, count, origin);
  impl_->reclaim_unreferenced_namespaces();
  return out;
}

StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::create(const KvCacheConfig& config, const Clock* clock,
                                                                  std::unique_ptr<EvictionPolicy> policy) {
  if (config.num_blocks < 1) return invalid_argument_error("kv cache: num_blocks must be >= 1, got {}", config.num_blocks);
  if (config.block_size < 1 || config.block_size > 256)
    return invalid_argument_error("kv cache: block_size must be in [1, 256], got {}", config.block_size);
  if (config.max_pending_events < 1)
    return invalid_argument_error("kv cache: max_pending_events must be >= 1, got {}", config.max_pending_events);
  if (config.evicted_key_memory < 0)
    return invalid_argument_error("kv cache: evicted_key_memory must be >= 0, got {}", config.evicted_key_memory);
  if (config.prefix_share_min_tokens < 0 || config.prefix_share_min_tokens % config.block_size != 0)
    return invalid_argument_error(
        "kv cache: prefix_share_min_tokens must be 0 or a positive multiple of the block size {}, got {}",
        config.block_size, config.prefix_share_min_tokens);
  if (config.num_host_blocks < 0 || config.num_host_blocks > INT32_MAX - config.num_blocks)
    return invalid_argument_error("kv cache: num_host_blocks must be in [0, {}], got {}",
                                  INT32_MAX - config.num_blocks, config.num_host_blocks);
  if (config.host_write_through && config.num_host_blocks == 0)
    return invalid_argument_error("kv cache: host_write_through needs a host tier (num_host_blocks > 0)");
  if (policy == nullptr) policy = make_eviction_policy(config.eviction_policy);
  const Clock& chosen = clock != nullptr ? *clock : static_cast<const Clock&>(SteadyClock::instance());
  return std::unique_ptr<KvCacheManager>(
      new KvCacheManager(std::make_unique<Impl>(config, chosen, std::move(policy))));
}

KvCacheManager::KvCacheManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

template <typename T>
T KvCacheManager::reclaiming(T result) {
  impl_->reclaim_unreferenced_namespaces();
  return result;
}
KvCacheManager::~KvCacheManager() = default;

int32_t KvCacheManager::block_size() const { return impl_->bs(); }
int32_t KvCacheManager::num_blocks() const { return impl_->pool_.num_blocks(); }
int32_t KvCacheManager::num_host_blocks() const { return impl_->pool_.num_host_blocks(); }
const KvCacheConfig& KvCacheManager::config() const { return impl_->config_; }

PrefixMatch KvCacheManager::match_prefix(std::string_view ns, std::span<const TokenId> prompt,
                                         std::span<const uint64_t> block_hashes) const {
  return impl_->match_prefix(ns, prompt, block_hashes);
}
int32_t KvCacheManager::blocks_for_tokens(int64_t num_tokens) const { return impl_->blocks_for_tokens(num_tokens); }
bool KvCacheManager::can_allocate(int64_t num_tokens) const {
  return impl_->blocks_for_tokens(num_tokens) <= impl_->available();
}
bool KvCacheManager::can_allocate_sequence(std::string_view ns, std::span<const TokenId> prompt,
                                           std::span<const uint64_t> block_hashes, PrefixReuse reuse) const {
  return impl_->can_allocate_sequence(ns, prompt, block_hashes, reuse);
}
int32_t KvCacheManager::blocks_needed_to_append(SequenceId seq, int32_t n) const {
  return impl_->blocks_needed_to_append(seq, n);
}
int32_t KvCacheManager::num_available_blocks() const { return impl_->available(); }
int32_t KvCacheManager::num_free_blocks() const { return impl_->pool_.num_free(); }
int32_t KvCacheManager::available_blocks_after_release(std::span<const SequenceId> seqs) const {
  return impl_->available_after_release(seqs);
}
bool KvCacheManager::has_sequence(SequenceId seq) const { return impl_->find(seq) != nullptr; }
int64_t KvCacheManager::num_tokens(SequenceId seq) const {
  const Sequence* s = impl_->find(seq);
  return s == nullptr ? -1 : static_cast<int64_t>(s->tokens.size());
}
int64_t KvCacheManager::num_computed_tokens(SequenceId seq) const {
  const Sequence* s = impl_->find(seq);
  return s == nullptr ? -1 : s->computed;
}
StatusOr<std::span<const BlockId>> KvCacheManager::block_table(SequenceId seq) const {
  const Sequence* s = impl_->find(seq);
  if (s == nullptr) return not_found_error("block_table: unknown sequence {}", seq);
  if (s->swapped) return failed_precondition_error("block_table: sequence {} is swapped out", seq);
  return std::span<const BlockId>(s->blocks);
}

StatusOr<PrefixMatch> KvCacheManager::allocate_sequence(SequenceId seq, std::string_view ns,
                                                        std::span<const TokenId> prompt,
                                                        std::span<const uint64_t> block_hashes,
                                                        PrefixReuse reuse) {
  return reclaiming(impl_->allocate_sequence(seq, ns, prompt, block_hashes, reuse));
}
Status KvCacheManager::append_tokens(SequenceId seq, std::span<const TokenId> tokens) {
  return reclaiming(impl_->append_tokens(seq, tokens));
}
Status KvCacheManager::set_token(SequenceId seq, int64_t position, TokenId token) {
  return impl_->set_token(seq, position, token);
}
Status KvCacheManager::mark_computed(SequenceId seq, int64_t n) { return reclaiming(impl_->mark_computed(seq, n)); }
StatusOr<std::vector<BlockCopy>> KvCacheManager::fork(SequenceId parent, SequenceId child) {
  return reclaiming(impl_->fork(parent, child));
}
Status KvCacheManager::free_sequence(SequenceId seq) { return reclaiming(impl_->release_sequence(seq, false)); }
Status KvCacheManager::abort_sequence(SequenceId seq) { return reclaiming(impl_->release_sequence(seq, true)); }
int32_t KvCacheManager::drop_namespace(std::string_view ns) {
  return reclaiming(impl_->config_.enable_prefix_cache ? impl_->cache_.drop_namespace(ns) : 0);
}
int32_t KvCacheManager::drop_conversation(std::string_view ns, std::span<const TokenId> tokens, int64_t keep) {
  return reclaiming(impl_->drop_conversation(ns, tokens, keep));
}
int32_t KvCacheManager::evict(int32_t n) { return reclaiming(impl_->evict(n)); }
StatusOr<SequenceCompaction> KvCacheManager::compact_sequence(SequenceId seq, int64_t kept_tokens) {
  return reclaiming(impl_->compact_sequence(seq, kept_tokens));
}
bool KvCacheManager::is_compressed(SequenceId seq) const {
  const Sequence* s = impl_->find(seq);
  return s != nullptr && s->compressed;
}
std::vector<BlockId> KvCacheManager::take_blocks_to_zero() { return impl_->take_blocks_to_zero(); }
bool KvCacheManager::has_blocks_to_zero() const { return !impl_->blocks_to_zero_.empty(); }
NamespaceKvUsage KvCacheManager::namespace_usage(std::string_view ns) const { return impl_->namespace_usage(ns); }
Status KvCacheManager::set_namespace_block_limit(std::string_view ns, int32_t max_blocks) {
  return reclaiming(impl_->set_block_limit(ns, max_blocks));
}
NamespaceRoom KvCacheManager::namespace_room(std::string_view ns, std::span<const TokenId> prompt,
                                             std::span<const uint64_t> block_hashes, PrefixReuse reuse) const {
  return impl_->namespace_room_for_sequence(ns, prompt, block_hashes, reuse);
}
Status KvCacheManager::swap_out(SequenceId seq) { return reclaiming(impl_->swap_out(seq)); }
bool KvCacheManager::is_swapped(SequenceId seq) const {
  const Sequence* s = impl_->find(seq);
  return s != nullptr && s->swapped;
}
bool KvCacheManager::can_swap_in(SequenceId seq, int32_t extra_tokens) const {
  int32_t reused_evictable = 0;
  const int32_t needed = impl_->swap_in_blocks(seq, extra_tokens, &reused_evictable);
  const Sequence* s = impl_->find(seq);
  return needed >= 0 && needed <= impl_->available() - reused_evictable &&
         needed <= impl_->sequence_room(*s, reused_evictable);
}
Status KvCacheManager::swap_in(SequenceId seq) { return reclaiming(impl_->swap_in(seq)); }
std::vector<BlockTransfer> KvCacheManager::take_transfers() {
  std::vector<BlockTransfer> out = impl_->cache_.take_transfers();
  for (const BlockTransfer& t : out) ++impl_->stats_.transfers[static_cast<int>(t.direction)];
  return out;
}
bool KvCacheManager::has_pending_transfers() const { return impl_->cache_.has_pending_transfers(); }
std::vector<SequenceId> KvCacheManager::transfers_failed(std::span<const BlockTransfer> failed) {
  return reclaiming(impl_->transfers_failed(failed));
}

KvStats KvCacheManager::stats() const { return impl_->stats(); }
void KvCacheManager::reset_stats() { impl_->reset_stats(); }
std::vector<KvEvent> KvCacheManager::drain_events() {
  std::vector<KvEvent> out(std::make_move_iterator(impl_->events_.begin()),
                           std::make_move_iterator(impl_->events_.end()));
  impl_->events_.clear();
  return out;
}
uint64_t KvCacheManager::dropped_events() const { return impl_->dropped_events_; }
uint64_t KvCacheManager::last_event_number() const { return impl_->next_event_number_; }
std::vector<KvEvent> KvCacheManager::cached_blocks() const {
  const BlockPool& pool = impl_->pool_;
  std::vector<BlockId> blocks;
  for (BlockId b = 0; b < pool.num_ids(); ++b)  // both tiers: a demoted block is still cached
    if (pool.meta(b).is_cached()) blocks.push_back(b);
  // A parent is one block shallower than its children: by depth, parents come first.
  std::stable_sort(blocks.begin(), blocks.end(),
                   [&](BlockId a, BlockId b) { return pool.meta(a).depth < pool.meta(b).depth; });
  std::vector<KvEvent> out;
  out.reserve(blocks.size());
  for (BlockId b : blocks) {
    const BlockMeta& m = pool.meta(b);
    const uint64_t parent_key = m.parent == kNoBlock ? 0 : pool.meta(m.parent).key_hash;
    out.push_back(KvEvent{0, KvEvent::Kind::kBlockStored, b, m.key_hash, parent_key,
                          impl_->cache_.namespace_name(m.namespace_id)});
  }
  return out;
}
std::string_view KvCacheManager::eviction_policy_name() const { return impl_->cache_.policy_name(); }
Status KvCacheManager::verify_integrity() const { return impl_->verify_integrity(); }

}  // namespace pagoda::kv
