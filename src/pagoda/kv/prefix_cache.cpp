#include "pagoda/kv/prefix_cache.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace pagoda::kv {
namespace {

constexpr uint64_t kMulA = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMulB = 0xC2B2AE3D27D4EB4Full;

uint64_t finalize(uint64_t x) {  // splitmix64 finalizer: good low bits for the table
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

uint64_t load_pair(const TokenId* t) {
  uint64_t v;
  std::memcpy(&v, t, sizeof(v));
  return v;
}

}  // namespace

uint64_t namespace_seed(std::string_view tenant_namespace) {
  // Length first, then the bytes: "org_1" + tokens can never share a seed
  // derivation with "org_12345" + fewer tokens.
  uint64_t h = finalize(0xA0761D6478BD642Full ^ tenant_namespace.size());
  for (unsigned char c : tenant_namespace) h = (h ^ c) * 0x100000001B3ull;
  h = finalize(h);
  return h == 0 ? 1 : h;
}

uint64_t block_content_hash(const TokenId* tokens, int32_t block_size) {
  // Two independent multiply-rotate lanes over token pairs keep the dependency
  // chain short; no dependence on the previous block, so the CPU overlaps the
  // content hashes of consecutive blocks.
  uint64_t a = kMulA;
  uint64_t b = kMulB + static_cast<uint64_t>(block_size);
  int32_t i = 0;
  for (; i + 4 <= block_size; i += 4) {
    a = std::rotl((a ^ load_pair(tokens + i)) * kMulA, 31);
    b = std::rotl((b ^ load_pair(tokens + i + 2)) * kMulB, 29);
  }
  for (; i < block_size; ++i) a = std::rotl((a ^ static_cast<uint32_t>(tokens[i])) * kMulA, 31);
  return finalize(a ^ std::rotl(b, 17));
}

uint64_t chain_combine(uint64_t previous, uint64_t content_hash) {
  // The only serial step of a prefix walk: short, and mixes into the low bits
  // that index the table. rotl breaks the symmetry of xor.
  uint64_t x = std::rotl(previous, 23) ^ content_hash;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 32;
  return x == 0 ? 1 : x;
}

uint64_t chain_block_hash(uint64_t previous, const TokenId* tokens, int32_t block_size) {
  return chain_combine(previous, block_content_hash(tokens, block_size));
}

PrefixCache::PrefixCache(BlockPool& pool, int32_t block_size, std::unique_ptr<EvictionPolicy> policy,
                         std::unique_ptr<EvictionPolicy> host_policy, const Clock& clock, int32_t evicted_key_memory)
    : pool_(pool),
      block_size_(block_size),
      policy_(std::move(policy)),
      host_policy_(host_policy ? std::move(host_policy) : make_eviction_policy(EvictionPolicyKind::kLru)),
      clock_(clock),
      table_(pool.num_ids()),
      tokens_(static_cast<size_t>(pool.num_ids()) * block_size),
      candidate_stamp_(static_cast<size_t>(pool.num_ids()), 0),
      twin_(static_cast<size_t>(pool.num_ids()), kNoBlock),
      device_children_(static_cast<size_t>(pool.num_ids()), 0),
      removed_key_memory_(evicted_key_memory) {
  policy_->reset(pool.num_blocks());
  host_policy_->reset(pool.num_host_blocks());
}

int32_t PrefixCache::intern_namespace(std::string_view tenant_namespace) {
  const int32_t found = find_namespace(tenant_namespace);
  if (found >= 0) return found;
  const int32_t id = static_cast<int32_t>(namespaces_.size());
  NamespaceInfo info;
  info.name = std::string(tenant_namespace);
  info.seed = namespace_seed(tenant_namespace);
  if (stable_keys_on_) info.stable_root = stable_namespace_root(model_fingerprint_, tenant_namespace);
  namespaces_.push_back(std::move(info));
  namespace_ids_.emplace(std::string(tenant_namespace), id);
  return id;
}

int32_t PrefixCache::find_namespace(std::string_view tenant_namespace) const {
  const auto it = namespace_ids_.find(tenant_namespace);
  return it == namespace_ids_.end() ? -1 : it->second;
}

int32_t PrefixCache::num_cached_in(int32_t ns_id) const {
  return ns_id >= 0 && ns_id < static_cast<int32_t>(namespaces_.size()) ? namespaces_[ns_id].num_cached : 0;
}

int32_t PrefixCache::num_evictable_in(int32_t ns_id) const {
  return ns_id >= 0 && ns_id < static_cast<int32_t>(namespaces_.size()) ? namespaces_[ns_id].num_evictable : 0;
}

void PrefixCache::count_evictable(BlockId block, int32_t delta) {
  num_evictable_[tier_index(block)] += delta;
  const int32_t ns = pool_.meta(block).namespace_id;
  if (!pool_.is_host(block) && ns >= 0) namespaces_[ns].num_evictable += delta;
}

void PrefixCache::count_cached(BlockId block, int32_t delta) {
  num_cached_[tier_index(block)] += delta;
  const int32_t ns = pool_.meta(block).namespace_id;
  if (!pool_.is_host(block) && ns >= 0) namespaces_[ns].num_cached += delta;
}

bool PrefixCache::content_equals(BlockId block, int32_t ns_id, BlockId parent, const TokenId* tokens) const {
  const BlockMeta& m = pool_.meta(block);
  return m.is_cached() && m.namespace_id == ns_id && m.parent == parent &&
         std::memcmp(block_tokens(block), tokens, sizeof(TokenId) * block_size_) == 0;
}

PrefixMatch PrefixCache::match(std::string_view tenant_namespace, std::span<const TokenId> tokens,
                               int32_t max_blocks, std::span<const uint64_t> content_hashes) const {
  PrefixMatch result;
  if (max_blocks <= 0) {
    result.reason = MissReason::kShorterThanBlock;
    return result;
  }
  result.blocks.reserve(static_cast<size_t>(max_blocks));
  const int32_t ns_id = find_namespace(tenant_namespace);
  uint64_t key = ns_id >= 0 ? namespaces_[ns_id].seed : namespace_seed(tenant_namespace);
  BlockId parent = kNoBlock;
  result.reason = MissReason::kHit;
  // In chunks: hash the chunk's blocks (independent work the CPU overlaps),
  // chain the keys and prefetch their table slots, then verify block by block.
  constexpr int32_t kChunk = 32;
  uint64_t keys[kChunk];
  for (int32_t base = 0; base < max_blocks; base += kChunk) {
    const int32_t n = std::min(kChunk, max_blocks - base);
    for (int32_t j = 0; j < n; ++j)
      keys[j] = static_cast<size_t>(base + j) < content_hashes.size()
                    ? content_hashes[static_cast<size_t>(base + j)]
                    : block_content_hash(tokens.data() + static_cast<size_t>(base + j) * block_size_, block_size_);
    for (int32_t j = 0; j < n; ++j) {
      key = chain_combine(key, keys[j]);
      keys[j] = key;
      table_.prefetch(key);
    }
    for (int32_t j = 0; j < n; ++j) {
      const TokenId* block_tokens_in = tokens.data() + static_cast<size_t>(base + j) * block_size_;
      const BlockId block = ns_id >= 0 ? table_.find(keys[j]) : kNoBlock;
      if (block == kNoBlock || !content_equals(block, ns_id, parent, block_tokens_in)) {
        result.reason = diagnose_miss(ns_id, keys[j]);
        result.cached_tokens = static_cast<int32_t>(result.blocks.size()) * block_size_;
        return result;
      }
      result.blocks.push_back(block);
      result.host_blocks += pool_.is_host(block) ? 1 : 0;
      parent = block;
    }
  }
  result.cached_tokens = static_cast<int32_t>(result.blocks.size()) * block_size_;
  return result;
}

MissReason PrefixCache::diagnose_miss(int32_t ns_id, uint64_t miss_key) const {
  // Only this namespace's own memory is consulted: what other tenants cached
  // must not change the answer (it would tell a tenant what another sent).
  if (ns_id < 0) return MissReason::kNeverSeen;
  return namespaces_[ns_id].removed_key_counts.count(miss_key) != 0 ? MissReason::kEvicted : MissReason::kNeverSeen;
}

void PrefixCache::remember_removed_key(NamespaceInfo& ns, uint64_t key) {
  if (removed_key_memory_ <= 0) return;
  ns.removed_keys.push_back(key);
  ++ns.removed_key_counts[key];
  if (static_cast<int32_t>(ns.removed_keys.size()) > removed_key_memory_) {
    const auto it = ns.removed_key_counts.find(ns.removed_keys.front());
    if (--it->second == 0) ns.removed_key_counts.erase(it);
    ns.removed_keys.pop_front();
  }
}

PrefixCache::InsertResult PrefixCache::insert(BlockId block, int32_t ns_id, BlockId parent, const TokenId* tokens) {
  if (parent != kNoBlock && !pool_.meta(parent).is_cached()) return {};
  const uint64_t parent_key = parent == kNoBlock ? namespaces_[ns_id].seed : pool_.meta(parent).key_hash;
  const uint64_t key = chain_block_hash(parent_key, tokens, block_size_);
  const BlockId existing = table_.find(key);
  if (existing != kNoBlock) {
    if (!content_equals(existing, ns_id, parent, tokens)) return {};  // a 64-bit collision: leave this block uncached
    if (!pool_.is_host(existing)) return {InsertOutcome::kDuplicate, existing};
    // Cached only in the host tier: this device block (same tokens, same
    // parent) takes the node's place and the host block becomes its twin.
    remove_candidate(existing);
    BlockMeta& host = pool_.meta(existing);
    if (host.ref_count == 0) count_evictable(existing, -1);
    move_node(existing, block);
    link_twin(block, existing);
    if (host.ref_count == 0) {
      count_evictable(existing, +1);  // as a twin
      maybe_add_candidate(existing);
    }
    if (parent != kNoBlock) remove_candidate(parent);
    pool_.meta(block).last_access_ns = clock_.now_ns();
    return {InsertOutcome::kInserted, block};
  }
  add_node(block, key, ns_id, parent, tokens);
  if (stable_keys_on_) origin_[block] = 0;
  if (pool_.meta(block).ref_count == 0) {  // not the normal path (callers insert referenced blocks), but keep counts right
    count_evictable(block, +1);
    maybe_add_candidate(block);
  }
  if (event_sink_) event_sink_(KvEvent::Kind::kBlockStored, block, key, parent == kNoBlock ? 0 : parent_key, ns_id);
  return {InsertOutcome::kInserted, block};
}

void PrefixCache::add_node(BlockId block, uint64_t key, int32_t ns_id, BlockId parent, const TokenId* tokens) {
  table_.insert(key, block);
  BlockMeta& m = pool_.meta(block);
  m.key_hash = key;
  m.namespace_id = ns_id;
  m.parent = parent;
  m.depth = parent == kNoBlock ? 0 : pool_.meta(parent).depth + 1;
  m.last_access_ns = clock_.now_ns();
  m.reuse_count = 0;
  m.branch_count = 0;
  std::memcpy(&tokens_[static_cast<size_t>(block) * block_size_], tokens, sizeof(TokenId) * block_size_);
  if (stable_keys_on_)
    stable_[block] = stable_block_key(parent == kNoBlock ? namespaces_[ns_id].stable_root : stable_[parent], tokens,
                                      block_size_);
  link_child(parent, block);
  count_cached(block, +1);
}

void PrefixCache::link_child(BlockId parent, BlockId child) {
  if (parent == kNoBlock) return;
  BlockMeta& p = pool_.meta(parent);
  BlockMeta& c = pool_.meta(child);
  c.prev_sibling = kNoBlock;
  c.next_sibling = p.first_child;
  if (p.first_child != kNoBlock) pool_.meta(p.first_child).prev_sibling = child;
  p.first_child = child;
  ++p.branch_count;
  if (!pool_.is_host(child)) ++device_children_[parent];
  // A device node stops being a device candidate with a device child; a host
  // node stops being a host candidate with any child.
  if (!pool_.is_host(child) || pool_.is_host(parent)) remove_candidate(parent);
}

void PrefixCache::unlink_child(BlockId child) {
  BlockMeta& c = pool_.meta(child);
  if (c.parent == kNoBlock) return;
  BlockMeta& p = pool_.meta(c.parent);
  if (c.prev_sibling != kNoBlock) pool_.meta(c.prev_sibling).next_sibling = c.next_sibling;
  else p.first_child = c.next_sibling;
  if (c.next_sibling != kNoBlock) pool_.meta(c.next_sibling).prev_sibling = c.prev_sibling;
  c.prev_sibling = c.next_sibling = kNoBlock;
  if (!pool_.is_host(child)) --device_children_[c.parent];
  maybe_add_candidate(c.parent);  // may have become an unreferenced leaf
}

void PrefixCache::maybe_add_candidate(BlockId block) {
  const BlockMeta& m = pool_.meta(block);
  if (m.ref_count != 0) return;
  if (!pool_.is_host(block)) {
    if (!m.is_cached() || device_children_[block] != 0 || policy_->contains(block)) return;
    policy_->add(EvictionCandidate{block, m.last_access_ns, m.reuse_count, m.branch_count, m.depth, block_size_});
    // Also in its namespace's own LRU set, for a namespace at its block cap (evict_one_in).
    candidate_stamp_[block] = m.last_access_ns;
    namespaces_[m.namespace_id].candidates.emplace(m.last_access_ns, block);
    return;
  }
  const BlockId index = pool_.host_index(block);
  if (host_policy_->contains(index)) return;
  if (m.is_cached() ? m.first_child != kNoBlock : twin_[block] == kNoBlock) return;
  host_policy_->add(EvictionCandidate{index, m.last_access_ns, m.reuse_count, m.branch_count, m.depth, block_size_});
}

void PrefixCache::remove_candidate(BlockId block) {
  if (pool_.is_host(block)) {
    host_policy_->remove(pool_.host_index(block));
    return;
  }
  if (!policy_->contains(block)) return;
  policy_->remove(block);
  namespaces_[pool_.meta(block).namespace_id].candidates.erase({candidate_stamp_[block], block});
}

void PrefixCache::on_referenced(BlockId block) {
  count_evictable(block, -1);
  remove_candidate(block);
}

void PrefixCache::on_unreferenced(BlockId block) {
  count_evictable(block, +1);
  pool_.meta(block).last_access_ns = clock_.now_ns();
  maybe_add_candidate(block);
}

void PrefixCache::link_twin(BlockId device, BlockId host) {
  twin_[device] = host;
  twin_[host] = device;
  pool_.meta(host).written_slots = static_cast<uint16_t>(block_size_);
  ++num_twins_;
}

void PrefixCache::unlink_twin(BlockId device) {
  const BlockId host = twin_[device];
  twin_[device] = twin_[host] = kNoBlock;
  --num_twins_;
}

void PrefixCache::move_node(BlockId from, BlockId to) {
  BlockMeta& f = pool_.meta(from);
  BlockMeta& t = pool_.meta(to);
  t.key_hash = f.key_hash;
  t.last_access_ns = f.last_access_ns;
  t.parent = f.parent;
  t.first_child = f.first_child;
  t.next_sibling = f.next_sibling;
  t.prev_sibling = f.prev_sibling;
  t.namespace_id = f.namespace_id;
  t.depth = f.depth;
  t.reuse_count = f.reuse_count;
  t.branch_count = f.branch_count;
  t.written_slots = static_cast<uint16_t>(block_size_);
  if (t.prev_sibling != kNoBlock) pool_.meta(t.prev_sibling).next_sibling = to;
  else if (t.parent != kNoBlock) pool_.meta(t.parent).first_child = to;
  if (t.next_sibling != kNoBlock) pool_.meta(t.next_sibling).prev_sibling = to;
  for (BlockId c = t.first_child; c != kNoBlock; c = pool_.meta(c).next_sibling) pool_.meta(c).parent = to;
  if (t.parent != kNoBlock && pool_.is_host(from) != pool_.is_host(to))
    device_children_[t.parent] += pool_.is_host(to) ? -1 : 1;
  device_children_[to] = device_children_[from];
  device_children_[from] = 0;
  table_.reassign(t.key_hash, to);
  if (stable_keys_on_) {
    stable_[to] = stable_[from];
    origin_[to] = origin_[from] = 0;
  }
  std::memcpy(&tokens_[static_cast<size_t>(to) * block_size_], block_tokens(from), sizeof(TokenId) * block_size_);
  count_cached(from, -1);  // both still carry the namespace id here
  count_cached(to, +1);
  f.key_hash = 0;
  f.parent = f.first_child = f.next_sibling = f.prev_sibling = kNoBlock;
  f.namespace_id = -1;
  f.depth = 0;
  f.reuse_count = 0;
  f.branch_count = 0;
}

BlockId PrefixCache::allocate_host_block() {
  if (pool_.num_host_blocks() == 0) return kNoBlock;
  BlockId host = pool_.allocate(BlockTier::kHost);
  if (host == kNoBlock && evict_one_host()) host = pool_.allocate(BlockTier::kHost);
  return host;
}

void PrefixCache::promote(BlockId host, BlockId device) {
  // The caller holds a reference on `host` (so it is no candidate) and on `device`.
  move_node(host, device);
  link_twin(device, host);
  if (pool_.meta(device).parent != kNoBlock) remove_candidate(pool_.meta(device).parent);  // it has a device child
  transfers_.push_back(BlockTransfer{TransferDirection::kHostToDevice, device, pool_.host_index(host)});
  ++tier_counters_.promoted;
}

void PrefixCache::add_twin(BlockId device, BlockId host) {
  link_twin(device, host);
  transfers_.push_back(BlockTransfer{TransferDirection::kDeviceToHost, device, pool_.host_index(host)});
  ++tier_counters_.written_back;
}

void PrefixCache::enable_stable_keys(std::string_view model_fingerprint) {
  stable_keys_on_ = true;
  model_fingerprint_ = std::string(model_fingerprint);
  stable_.assign(static_cast<size_t>(pool_.num_ids()), StableKey{});
  origin_.assign(static_cast<size_t>(pool_.num_ids()), 0);
  for (NamespaceInfo& ns : namespaces_) ns.stable_root = stable_namespace_root(model_fingerprint_, ns.name);
}

const StableKey* PrefixCache::stable_key(BlockId block) const {
  if (!stable_keys_on_ || block < 0 || block >= pool_.num_ids()) return nullptr;
  if (pool_.meta(block).is_cached()) return &stable_[block];
  const BlockId other = twin_[block];
  if (other != kNoBlock && pool_.meta(other).is_cached()) return &stable_[other];
  return nullptr;
}

BlockId PrefixCache::adopt_host(int32_t ns_id, BlockId parent, const TokenId* tokens, uint8_t origin) {
  if (!stable_keys_on_ || pool_.num_host_blocks() == 0) return kNoBlock;
  if (parent != kNoBlock && !pool_.meta(parent).is_cached()) return kNoBlock;
  const uint64_t parent_key = parent == kNoBlock ? namespaces_[ns_id].seed : pool_.meta(parent).key_hash;
  if (table_.find(chain_block_hash(parent_key, tokens, block_size_)) != kNoBlock) return kNoBlock;
  // A host parent leaf must not be reclaimed to make room for its own child.
  const bool shield = parent != kNoBlock && pool_.is_host(parent);
  if (shield) remove_candidate(parent);
  const BlockId host = allocate_host_block();
  // Once the child is in, the parent is no leaf (no candidate); otherwise it is one again.
  if (host != kNoBlock && adopt_host_into(ns_id, parent, tokens, origin, host)) return host;
  if (host != kNoBlock) pool_.free(host);  // cannot happen once shielded; keep counts right
  if (shield) maybe_add_candidate(parent);
  return kNoBlock;
}

bool PrefixCache::adopt_host_into(int32_t ns_id, BlockId parent, const TokenId* tokens, uint8_t origin,
                                  BlockId host) {
  if (!stable_keys_on_ || !pool_.is_host(host) || pool_.meta(host).is_free || pool_.meta(host).ref_count != 0 ||
      is_tracked(host))
    return false;
  if (parent != kNoBlock && !pool_.meta(parent).is_cached()) return false;
  const uint64_t parent_key = parent == kNoBlock ? namespaces_[ns_id].seed : pool_.meta(parent).key_hash;
  const uint64_t key = chain_block_hash(parent_key, tokens, block_size_);
  if (table_.find(key) != kNoBlock) return false;  // cached already (or a 64-bit collision: not cached)
  if (parent != kNoBlock && pool_.is_host(parent)) remove_candidate(parent);  // a leaf no more
  pool_.meta(host).written_slots = static_cast<uint16_t>(block_size_);
  add_node(host, key, ns_id, parent, tokens);
  origin_[host] = origin;
  count_evictable(host, +1);
  maybe_add_candidate(host);
  if (event_sink_) event_sink_(KvEvent::Kind::kBlockStored, host, key, parent == kNoBlock ? 0 : parent_key, ns_id);
  return true;
}

bool PrefixCache::write_through(BlockId device) {
  if (pool_.num_host_blocks() == 0 || twin_[device] != kNoBlock || !pool_.meta(device).is_cached()) return false;
  const BlockId host = allocate_host_block();
  if (host == kNoBlock) return false;
  link_twin(device, host);
  transfers_.push_back(BlockTransfer{TransferDirection::kDeviceToHost, device, pool_.host_index(host)});
  ++tier_counters_.written_back;
  count_evictable(host, +1);  // an unreferenced twin
  maybe_add_candidate(host);
  return true;
}

std::vector<BlockTransfer> PrefixCache::take_transfers() {
  std::vector<BlockTransfer> out;
  out.swap(transfers_);
  return out;
}

void PrefixCache::touch(BlockId block, bool reused) {
  BlockMeta& m = pool_.meta(block);
  m.last_access_ns = clock_.now_ns();
  if (reused) ++m.reuse_count;
}

bool PrefixCache::evict_one() {
  const std::optional<BlockId> victim = policy_->pop_victim();
  if (!victim) return false;
  namespaces_[pool_.meta(*victim).namespace_id].candidates.erase({candidate_stamp_[*victim], *victim});
  evict_device_node(*victim);
  return true;
}

bool PrefixCache::evict_one_in(int32_t ns_id) {
  if (ns_id < 0 || ns_id >= static_cast<int32_t>(namespaces_.size())) return false;
  const auto& candidates = namespaces_[ns_id].candidates;
  if (candidates.empty()) return false;
  const BlockId victim = candidates.begin()->second;
  remove_candidate(victim);
  evict_device_node(victim);
  return true;
}

void PrefixCache::evict_device_node(BlockId device) {
  if (pool_.num_host_blocks() > 0) {
    // Demote: onto the twin when there is one, else onto a fresh host block.
    BlockId host = twin_[device];
    if (host != kNoBlock) {
      unlink_twin(device);
      remove_candidate(host);
      if (pool_.meta(host).ref_count == 0) count_evictable(host, -1);  // counted again below, as a node
    } else {
      host = allocate_host_block();
      // Host eviction may have removed a host child of the victim, which
      // offers the victim as a candidate again: it is leaving.
      remove_candidate(device);
      if (host != kNoBlock) {
        transfers_.push_back(BlockTransfer{TransferDirection::kDeviceToHost, device, pool_.host_index(host)});
        ++tier_counters_.written_back;
      }
    }
    if (host != kNoBlock) {
      count_evictable(device, -1);  // before the move: the device block still carries the namespace
      move_node(device, host);
      BlockMeta& h = pool_.meta(host);
      if (h.ref_count == 0) count_evictable(host, +1);
      maybe_add_candidate(host);
      if (h.parent != kNoBlock) maybe_add_candidate(h.parent);  // it may have lost its last device child
      pool_.free(device);
      ++tier_counters_.demoted;
      return;
    }
  }
  // No host tier, or no room in it: the victim and its host descendants go.
  remove_subtree(device, RemovalReason::kEvictedForSpace);
}

bool PrefixCache::evict_one_host() {
  const std::optional<BlockId> victim = host_policy_->pop_victim();
  if (!victim) return false;
  const BlockId host = pool_.host_id(*victim);
  ++tier_counters_.host_evicted;
  if (twin_[host] != kNoBlock) {
    unlink_twin(twin_[host]);
    count_evictable(host, -1);
    pool_.free(host);
  } else {
    remove_one(host, RemovalReason::kEvictedForSpace);
  }
  return true;
}

int32_t PrefixCache::drop_lost(BlockId block) {
  if (pool_.meta(block).is_cached()) return remove_subtree(block, RemovalReason::kTransferFailed);
  const BlockId other = twin_[block];
  if (other == kNoBlock) return 0;
  if (!pool_.is_host(block)) return 0;  // only host blocks are twins without being nodes
  unlink_twin(other);
  remove_candidate(block);
  if (pool_.meta(block).ref_count == 0) {
    count_evictable(block, -1);
    pool_.free(block);
  }
  return 0;
}

void PrefixCache::remove_one(BlockId block, RemovalReason reason) {
  BlockMeta& m = pool_.meta(block);
  remove_candidate(block);
  if (twin_[block] != kNoBlock) {
    // A device node's host copy goes with it (a swapped sequence may still hold it).
    const BlockId host = twin_[block];
    unlink_twin(block);
    remove_candidate(host);
    if (pool_.meta(host).ref_count == 0) {
      count_evictable(host, -1);
      pool_.free(host);
    }
  }
  const uint64_t key = m.key_hash;
  const BlockId parent = m.parent;
  const uint64_t parent_key = parent == kNoBlock ? 0 : pool_.meta(parent).key_hash;
  const int32_t ns_id = m.namespace_id;
  table_.erase(key);
  remember_removed_key(namespaces_[ns_id], key);
  // Counted out while the block still carries its namespace.
  count_cached(block, -1);
  const bool was_evictable = m.ref_count == 0;
  if (was_evictable) count_evictable(block, -1);
  // Forget the key before unlinking, so the parent sees this child gone.
  m.key_hash = 0;
  unlink_child(block);
  m.parent = kNoBlock;
  m.namespace_id = -1;
  m.depth = 0;
  m.reuse_count = 0;
  m.branch_count = 0;
  device_children_[block] = 0;
  if (stable_keys_on_) origin_[block] = 0;
  ++removed_by_reason_[static_cast<int>(reason)];
  if (event_sink_) event_sink_(KvEvent::Kind::kBlockRemoved, block, key, parent_key, ns_id);
  if (was_evictable) pool_.free(block);
}

int32_t PrefixCache::remove_subtree(BlockId root, RemovalReason reason) {
  // Pre-order collection, removed in reverse: every child goes before its parent.
  std::vector<BlockId> order;
  std::vector<BlockId> stack{root};
  while (!stack.empty()) {
    const BlockId b = stack.back();
    stack.pop_back();
    order.push_back(b);
    for (BlockId c = pool_.meta(b).first_child; c != kNoBlock; c = pool_.meta(c).next_sibling) stack.push_back(c);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) remove_one(*it, reason);
  return static_cast<int32_t>(order.size());
}

int32_t PrefixCache::drop_namespace(std::string_view tenant_namespace) {
  const int32_t ns_id = find_namespace(tenant_namespace);
  if (ns_id < 0) return 0;
  std::vector<BlockId> roots;
  for (BlockId b = 0; b < pool_.num_ids(); ++b) {
    const BlockMeta& m = pool_.meta(b);
    if (m.is_cached() && m.namespace_id == ns_id && m.parent == kNoBlock) roots.push_back(b);
  }
  int32_t removed = 0;
  for (BlockId root : roots) removed += remove_subtree(root, RemovalReason::kDroppedNamespace);
  return removed;
}

Status PrefixCache::verify_integrity() const {
  int32_t cached[kNumTiers] = {0, 0}, evictable[kNumTiers] = {0, 0}, candidates[kNumTiers] = {0, 0}, twins = 0;
  for (BlockId b = 0; b < pool_.num_ids(); ++b) {
    const BlockMeta& m = pool_.meta(b);
    const bool host = pool_.is_host(b);
    const int tier = host ? 1 : 0;
    // Twins: a device node and a host block that is not a node, linked both ways.
    if (twin_[b] != kNoBlock) {
      const BlockId other = twin_[b];
      if (other < 0 || other >= pool_.num_ids() || twin_[other] != b || pool_.is_host(other) == host)
        return internal_error("block {}: twin link to {} is not mutual across tiers", b, other);
      if (host) {
        ++twins;
        if (m.is_cached()) return internal_error("host block {} is both a node and the twin of {}", b, other);
        if (m.is_free) return internal_error("host twin {} of block {} is on the free list", b, other);
        if (m.written_slots != block_size_) return internal_error("host twin {} is not full", b);
        evictable[1] += m.ref_count == 0 ? 1 : 0;
      } else if (!m.is_cached()) {
        return internal_error("device block {} has a twin {} but is not cached", b, other);
      }
    }
    int32_t device_children = 0;
    bool children_host_only = true;
    for (BlockId c = m.first_child; c != kNoBlock; c = pool_.meta(c).next_sibling) {
      device_children += pool_.is_host(c) ? 0 : 1;
      children_host_only &= pool_.is_host(c);
    }
    if (device_children != device_children_[b])
      return internal_error("block {} has {} device children, counter says {}", b, device_children,
                            device_children_[b]);
    const bool candidate = m.ref_count == 0 && (host ? (m.is_cached() ? m.first_child == kNoBlock : twin_[b] != kNoBlock)
                                                     : (m.is_cached() && device_children == 0));
    const bool contained = host ? host_policy_->contains(pool_.host_index(b)) : policy_->contains(b);
    if (contained != candidate)
      return internal_error("{} block {}: eviction candidate is {}, should be {} (cached {}, ref {}, children {}, twin {})",
                            block_tier_name(pool_.tier(b)), b, contained, candidate, m.is_cached(), m.ref_count,
                            m.first_child != kNoBlock, twin_[b]);
    candidates[tier] += candidate ? 1 : 0;
    if (!m.is_cached()) {
      if (m.first_child != kNoBlock || m.parent != kNoBlock || m.namespace_id != -1)
        return internal_error("uncached block {} keeps tree links (parent {}, first child {}, namespace {})", b,
                              m.parent, m.first_child, m.namespace_id);
      continue;
    }
    ++cached[tier];
    evictable[tier] += m.ref_count == 0 ? 1 : 0;
    if (host && !children_host_only) return internal_error("host node {} has a device child", b);
    if (m.is_free) return internal_error("cached block {} is on the free list", b);
    if (m.written_slots != block_size_)
      return internal_error("cached block {} has {} of {} slots written", b, m.written_slots, block_size_);
    if (table_.find(m.key_hash) != b) return internal_error("cached block {} is not found by its own key", b);
    if (m.namespace_id < 0 || m.namespace_id >= static_cast<int32_t>(namespaces_.size()))
      return internal_error("cached block {} has namespace id {}", b, m.namespace_id);
    uint64_t parent_key = namespaces_[m.namespace_id].seed;
    if (m.parent != kNoBlock) {
      const BlockMeta& p = pool_.meta(m.parent);
      if (!p.is_cached()) return internal_error("cached block {} has uncached parent {}", b, m.parent);
      if (!host && pool_.is_host(m.parent))
        return internal_error("device node {} has a host parent {}: device nodes are closed under ancestors", b,
                              m.parent);
      if (p.namespace_id != m.namespace_id)
        return internal_error("cached block {} (namespace {}) under parent {} of namespace {}", b, m.namespace_id,
                              m.parent, p.namespace_id);
      if (m.depth != p.depth + 1) return internal_error("cached block {} depth {} under depth {}", b, m.depth, p.depth);
      if (!host && m.ref_count > 0 && p.ref_count == 0)
        return internal_error("referenced cached block {} has an unreferenced parent {}", b, m.parent);
      parent_key = p.key_hash;
      bool listed = false;
      for (BlockId c = p.first_child; c != kNoBlock; c = pool_.meta(c).next_sibling) listed |= c == b;
      if (!listed) return internal_error("cached block {} is missing from its parent {}'s children", b, m.parent);
    } else if (m.depth != 0) {
      return internal_error("root block {} has depth {}", b, m.depth);
    }
    if (chain_block_hash(parent_key, block_tokens(b), block_size_) != m.key_hash)
      return internal_error("cached block {} key does not hash its parent key and tokens", b);
    for (BlockId c = m.first_child; c != kNoBlock; c = pool_.meta(c).next_sibling) {
      if (pool_.meta(c).parent != b) return internal_error("block {} lists child {} whose parent is {}", b, c,
                                                           pool_.meta(c).parent);
      const BlockId next = pool_.meta(c).next_sibling;
      if (next != kNoBlock && pool_.meta(next).prev_sibling != c)
        return internal_error("sibling links broken between blocks {} and {}", c, next);
    }
  }
  if (table_.find(0) != kNoBlock) return internal_error("hash table holds the empty key");
  for (int t = 0; t < kNumTiers; ++t) {
    const std::string_view name = block_tier_name(static_cast<BlockTier>(t));
    if (cached[t] != num_cached_[t])
      return internal_error("{} cached {} blocks, counter says {}", cached[t], name, num_cached_[t]);
    if (evictable[t] != num_evictable_[t])
      return internal_error("{} evictable {} blocks, counter says {}", evictable[t], name, num_evictable_[t]);
  }
  if (twins != num_twins_) return internal_error("{} twins, counter says {}", twins, num_twins_);
  if (cached[0] + cached[1] != table_.size())
    return internal_error("{} cached blocks, hash table holds {}", cached[0] + cached[1], table_.size());
  if (candidates[0] != policy_->size())
    return internal_error("{} device candidates, policy holds {}", candidates[0], policy_->size());
  if (candidates[1] != host_policy_->size())
    return internal_error("{} host candidates, host policy holds {}", candidates[1], host_policy_->size());
  // Per namespace (device tier): cached and evictable nodes, the LRU candidate set, removed-key memory.
  std::vector<int32_t> cached_in(namespaces_.size(), 0), evictable_in(namespaces_.size(), 0);
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    const BlockMeta& m = pool_.meta(b);
    if (!m.is_cached()) continue;
    ++cached_in[m.namespace_id];
    evictable_in[m.namespace_id] += m.ref_count == 0 ? 1 : 0;
  }
  int32_t listed_total = 0;
  for (size_t ns = 0; ns < namespaces_.size(); ++ns) {
    const NamespaceInfo& info = namespaces_[ns];
    if (cached_in[ns] != info.num_cached || evictable_in[ns] != info.num_evictable)
      return internal_error("namespace {}: {} cached / {} evictable device blocks, counters say {} / {}", ns,
                            cached_in[ns], evictable_in[ns], info.num_cached, info.num_evictable);
    for (const auto& [stamp, block] : info.candidates) {
      if (pool_.is_host(block) || !policy_->contains(block) || pool_.meta(block).namespace_id != static_cast<int32_t>(ns) ||
          candidate_stamp_[block] != stamp)
        return internal_error("namespace {} lists block {} as a candidate wrongly", ns, block);
      ++listed_total;
    }
    if (static_cast<int32_t>(info.removed_keys.size()) > std::max(removed_key_memory_, 0))
      return internal_error("namespace {} remembers {} removed keys, over {}", ns, info.removed_keys.size(),
                            removed_key_memory_);
  }
  if (listed_total != policy_->size())
    return internal_error("namespaces list {} device candidates, the policy holds {}", listed_total, policy_->size());
  if (stable_keys_on_) {
    for (BlockId b = 0; b < pool_.num_ids(); ++b) {
      const BlockMeta& m = pool_.meta(b);
      if (!m.is_cached()) continue;
      const StableKey& previous = m.parent == kNoBlock ? namespaces_[m.namespace_id].stable_root : stable_[m.parent];
      if (stable_[b] != stable_block_key(previous, block_tokens(b), block_size_))
        return internal_error("block {}: stable key is not hash(parent key, tokens)", b);
      if (origin_[b] != 0 && !pool_.is_host(b)) return internal_error("device block {} keeps a lower-tier origin", b);
    }
  }
  PAGODA_RETURN_IF_ERROR(policy_->verify_integrity());
  return host_policy_->verify_integrity();
}

}  // namespace pagoda::kv
