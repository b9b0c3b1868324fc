#pragma once
// BlockPool: metadata of every KV block, in two tiers, and an O(1) intrusive
// free list per tier.
//
// A block is an index into a backend's pool; BlockMeta holds no pointer to
// memory, only bookkeeping: ref count, written slots, and (while cached) the
// radix-tree key and links. Ids [0, num_blocks) are the device tier (the
// backend's KV pool, block id = pool index); ids [num_blocks, num_blocks +
// num_host_blocks) are the host tier (host pool index = id - num_blocks). One
// id space lets the prefix cache link a host block under a device block. The
// pool itself only moves blocks on and off the free lists; KvCacheManager and
// PrefixCache interpret the rest.
//
// Ownership: a block allocated for a namespace (tenant) is held by it until it
// returns to the free list; the pool counts blocks held per namespace and per
// namespace group (for quotas: a group is a tenant with its salted user
// namespaces, see KvCacheManager::set_namespace_block_limit), and remembers the
// tag of a free block's last holder, so the manager knows when a block passes
// from one namespace to another (and must be zeroed). Namespace ids are slots
// that are reused once a namespace is reclaimed; tags are never reused, so a
// re-created namespace in a reused slot is another holder.
//
// Thread safety: none (owned by one KvCacheManager).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/kv_types.h"

namespace pagoda::kv {

struct BlockMeta {
  // Radix-tree key while cached (key_hash != 0): hash of (namespace, every
  // token up to the end of this block); the tokens themselves live in
  // PrefixCache and are compared on every match.
  uint64_t key_hash = 0;
  uint64_t last_access_ns = 0;
  BlockId parent = kNoBlock;        // cached parent block; kNoBlock at depth 0
  BlockId first_child = kNoBlock;   // cached children, intrusive doubly linked list
  BlockId next_sibling = kNoBlock;
  BlockId prev_sibling = kNoBlock;
  BlockId next_free = kNoBlock;     // free-list link while free
  int32_t ref_count = 0;            // sequence block tables holding this block
  int32_t namespace_id = -1;        // while cached
  int32_t depth = 0;                // while cached: index of the block in its prompt
  uint32_t reuse_count = 0;         // matches that handed this block to a new sequence
  uint32_t branch_count = 0;        // children ever linked under it while cached (distinct continuations)
  uint16_t written_slots = 0;       // slots holding K/V, 0..block_size
  bool is_free = true;
  bool is_cached() const { return key_hash != 0; }
};
// One cache line per block: a million blocks' metadata stays at 64 MiB.
static_assert(sizeof(BlockMeta) <= 64, "BlockMeta grew past a cache line");

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks, int32_t num_host_blocks = 0);

  int32_t num_blocks() const { return num_device_; }  // device tier
  int32_t num_host_blocks() const { return static_cast<int32_t>(meta_.size()) - num_device_; }
  int32_t num_ids() const { return static_cast<int32_t>(meta_.size()); }  // both tiers
  int32_t num_free() const { return tiers_[0].num_free; }                 // device tier
  int32_t num_host_free() const { return tiers_[1].num_free; }
  BlockTier tier(BlockId block) const { return block < num_device_ ? BlockTier::kDevice : BlockTier::kHost; }
  bool is_host(BlockId block) const { return block >= num_device_; }
  BlockId host_index(BlockId host_block) const { return host_block - num_device_; }  // host pool index
  BlockId host_id(BlockId host_index) const { return host_index + num_device_; }

  // Pops a free block of the tier (metadata reset, is_free false, ref 0);
  // kNoBlock if none. `owner_namespace` (>= 0, or kNoOwner) becomes its holder
  // and `owner_tag` (never reused, 0: none) that holder's incarnation; the tag
  // of the block's previous holder (0 if none) goes to *previous_tag when
  // given. Ownership is tracked for the device tier (host blocks: kNoOwner).
  static constexpr int32_t kNoOwner = -1;
  BlockId allocate(BlockTier tier = BlockTier::kDevice, int32_t owner_namespace = kNoOwner, uint64_t owner_tag = 0,
                   uint64_t* previous_tag = nullptr) {
    FreeList& list = tiers_[static_cast<int>(tier)];
    const BlockId block = list.head;
    if (block == kNoBlock) return kNoBlock;
    BlockMeta& m = meta_[block];
    list.head = m.next_free;
    --list.num_free;
    m = BlockMeta{};
    m.is_free = false;
    if (previous_tag != nullptr) *previous_tag = last_tag_[block];
    last_tag_[block] = owner_tag;
    owner_[block] = owner_namespace;
    if (owner_namespace >= 0) {
      ensure_namespace(owner_namespace);
      ++held_[owner_namespace];
      ++group_held_[group_of(owner_namespace)];
    }
    return block;
  }
  // Pushes an unreferenced, uncached block back on its tier's free list. Its
  // holder stops holding it; the holder's tag stays as the last holder's.
  void free(BlockId block) {
    FreeList& list = tiers_[static_cast<int>(tier(block))];
    BlockMeta& m = meta_[block];
    m.is_free = true;
    m.next_free = list.head;
    list.head = block;
    ++list.num_free;
    if (const int32_t owner = owner_[block]; owner >= 0) {
      --group_held_[group_of(owner)];
      if (--held_[owner] == 0) released_.push_back(owner);
      owner_[block] = kNoOwner;
    }
  }

  // Holder of an allocated block; kNoOwner if none or free.
  int32_t owner(BlockId block) const { return owner_[block]; }
  // Tag of the holder, or of the last holder of a free block; 0 if none.
  uint64_t last_tag(BlockId block) const { return last_tag_[block]; }
  // Allocated blocks held by a namespace.
  int32_t num_held(int32_t owner_namespace) const {
    return owner_namespace >= 0 && static_cast<size_t>(owner_namespace) < held_.size() ? held_[owner_namespace] : 0;
  }
  // A namespace's group: the namespace itself unless set_group said otherwise.
  int32_t group_of(int32_t ns) const {
    return ns >= 0 && static_cast<size_t>(ns) < group_.size() && group_[ns] >= 0 ? group_[ns] : ns;
  }
  // Puts namespace `ns` into `group` (kNoOwner: back on its own), moving the
  // count of the blocks it holds.
  void set_group(int32_t ns, int32_t group) {
    ensure_namespace(std::max(ns, group));
    group_held_[group_of(ns)] -= held_[ns];
    group_[ns] = group == ns ? kNoOwner : group;
    group_held_[group_of(ns)] += held_[ns];
  }
  // Allocated blocks held by every namespace of a group.
  int32_t num_held_by_group(int32_t group) const {
    return group >= 0 && static_cast<size_t>(group) < group_held_.size() ? group_held_[group] : 0;
  }
  // Namespaces whose held count fell to 0 since the last call (they may have
  // become unreferenced: the manager checks and reclaims them).
  std::vector<int32_t> take_released_holders() {
    std::vector<int32_t> out;
    out.swap(released_);
    return out;
  }

  BlockMeta& meta(BlockId block) { return meta_[block]; }
  const BlockMeta& meta(BlockId block) const { return meta_[block]; }

  // Per tier: free list acyclic and inside the tier, count matches, free
  // blocks unreferenced and uncached, free blocks have no holder; held counts
  // (per namespace and per group) match the holders of allocated blocks.
  Status verify_integrity() const;

 private:
  struct FreeList {
    BlockId head = kNoBlock;
    int32_t num_free = 0;
  };
  std::vector<BlockMeta> meta_;
  void ensure_namespace(int32_t ns) {
    if (static_cast<size_t>(ns) < held_.size()) return;
    held_.resize(static_cast<size_t>(ns) + 1, 0);
    group_.resize(static_cast<size_t>(ns) + 1, kNoOwner);
    group_held_.resize(static_cast<size_t>(ns) + 1, 0);
  }
  std::vector<int32_t> owner_;      // [num_ids] holder of an allocated block; kNoOwner if none
  std::vector<uint64_t> last_tag_;  // [num_ids] tag of the holder or last holder; 0 if none
  std::vector<int32_t> held_;       // [namespace slots] allocated blocks per holder
  std::vector<int32_t> group_;      // [namespace slots] group of each namespace; kNoOwner: itself
  std::vector<int32_t> group_held_;  // [namespace slots] allocated blocks per group
  std::vector<int32_t> released_;    // see take_released_holders()
  int32_t num_device_ = 0;
  FreeList tiers_[kNumTiers];
};

}  // namespace pagoda::kv
