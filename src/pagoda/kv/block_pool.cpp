#include "pagoda/kv/block_pool.h"

namespace pagoda::kv {

BlockPool::BlockPool(int32_t num_blocks)
    : meta_(static_cast<size_t>(num_blocks)), owner_(static_cast<size_t>(num_blocks), kNoOwner) {
  // Low ids first, so fresh managers hand out 0, 1, 2, ... (readable tests).
  for (BlockId b = num_blocks - 1; b >= 0; --b) free(b);
}

Status BlockPool::verify_integrity() const {
  std::vector<bool> seen(meta_.size(), false);
  int32_t count = 0;
  for (BlockId b = free_head_; b != kNoBlock; b = meta_[b].next_free) {
    if (b < 0 || b >= num_blocks()) return internal_error("free list holds invalid block {}", b);
    if (seen[b]) return internal_error("free list has a cycle at block {}", b);
    seen[b] = true;
    ++count;
    const BlockMeta& m = meta_[b];
    if (!m.is_free) return internal_error("block {} on the free list is not marked free", b);
    if (m.ref_count != 0) return internal_error("free block {} has ref count {}", b, m.ref_count);
    if (m.is_cached()) return internal_error("free block {} still has a cache key", b);
  }
  if (count != num_free_) return internal_error("free list holds {} blocks, counter says {}", count, num_free_);
  for (BlockId b = 0; b < num_blocks(); ++b)
    if (meta_[b].is_free && !seen[b]) return internal_error("block {} marked free but not on the free list", b);
  std::vector<int32_t> held(held_.size(), 0);
  for (BlockId b = 0; b < num_blocks(); ++b) {
    if (meta_[b].is_free || owner_[b] < 0) continue;
    if (static_cast<size_t>(owner_[b]) >= held.size())
      return internal_error("block {} held by namespace {} that has no count", b, owner_[b]);
    ++held[owner_[b]];
  }
  for (size_t ns = 0; ns < held.size(); ++ns)
    if (held[ns] != held_[ns])
      return internal_error("namespace {} holds {} blocks, counter says {}", ns, held[ns], held_[ns]);
  return ok_status();
}

}  // namespace pagoda::kv
