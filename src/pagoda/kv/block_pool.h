#pragma once
// BlockPool: metadata of every KV block and an O(1) intrusive free list.
//
// A block is an index into the backend's pools; BlockMeta holds no pointer to
// memory, only bookkeeping: ref count, written slots, and (while cached) the
// radix-tree key and links. The pool itself only moves blocks on and off the
// free list; KvCacheManager and PrefixCache interpret the rest.
//
// Ownership: a block allocated for a namespace (tenant) is held by it until it
// returns to the free list; the pool counts blocks held per namespace (for
// quotas) and remembers the last holder of a free block, so the manager knows
// when a block passes from one namespace to another (and must be zeroed).
//
// Thread safety: none (owned by one KvCacheManager).

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
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(meta_.size()); }
  int32_t num_free() const { return num_free_; }

  // Pops a free block (metadata reset, is_free false, ref 0); kNoBlock if none.
  // `owner_namespace` (>= 0, or kNoOwner) becomes its holder; the block's
  // previous holder (kNoOwner if none) goes to *previous_owner when given.
  static constexpr int32_t kNoOwner = -1;
  BlockId allocate(int32_t owner_namespace = kNoOwner, int32_t* previous_owner = nullptr) {
    const BlockId block = free_head_;
    if (block == kNoBlock) return kNoBlock;
    BlockMeta& m = meta_[block];
    free_head_ = m.next_free;
    --num_free_;
    m = BlockMeta{};
    m.is_free = false;
    if (previous_owner != nullptr) *previous_owner = owner_[block];
    owner_[block] = owner_namespace;
    if (owner_namespace >= 0) {
      if (static_cast<size_t>(owner_namespace) >= held_.size()) held_.resize(static_cast<size_t>(owner_namespace) + 1);
      ++held_[owner_namespace];
    }
    return block;
  }
  // Pushes an unreferenced, uncached block back on the free list. Its holder
  // stops holding it but stays recorded as the last owner.
  void free(BlockId block) {
    BlockMeta& m = meta_[block];
    m.is_free = true;
    m.next_free = free_head_;
    free_head_ = block;
    ++num_free_;
    if (owner_[block] >= 0) --held_[owner_[block]];
  }

  // Holder of an allocated block, or last holder of a free one; kNoOwner if none.
  int32_t owner(BlockId block) const { return owner_[block]; }
  // Allocated blocks held by a namespace.
  int32_t num_held(int32_t owner_namespace) const {
    return owner_namespace >= 0 && static_cast<size_t>(owner_namespace) < held_.size() ? held_[owner_namespace] : 0;
  }

  BlockMeta& meta(BlockId block) { return meta_[block]; }
  const BlockMeta& meta(BlockId block) const { return meta_[block]; }

  // Free list acyclic, count matches, free blocks unreferenced and uncached,
  // held counts match the owners of allocated blocks.
  Status verify_integrity() const;

 private:
  std::vector<BlockMeta> meta_;
  std::vector<int32_t> owner_;  // [num_blocks] holder or last holder; kNoOwner if none
  std::vector<int32_t> held_;   // [namespaces seen] allocated blocks per holder
  BlockId free_head_ = kNoBlock;
  int32_t num_free_ = 0;
};

}  // namespace pagoda::kv
