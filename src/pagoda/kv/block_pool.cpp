#include "pagoda/kv/block_pool.h"

namespace pagoda::kv {

BlockPool::BlockPool(int32_t num_blocks, int32_t num_host_blocks)
    : meta_(static_cast<size_t>(num_blocks) + static_cast<size_t>(num_host_blocks)),
      owner_(meta_.size(), kNoOwner),
      last_tag_(meta_.size(), 0),
      num_device_(num_blocks) {
  // Low ids first, so fresh managers hand out 0, 1, 2, ... (readable tests).
  for (BlockId b = num_ids() - 1; b >= 0; --b) free(b);
}

Status BlockPool::verify_integrity() const {
  std::vector<bool> seen(meta_.size(), false);
  for (int t = 0; t < kNumTiers; ++t) {
    const BlockTier want = static_cast<BlockTier>(t);
    int32_t count = 0;
    for (BlockId b = tiers_[t].head; b != kNoBlock; b = meta_[b].next_free) {
      if (b < 0 || b >= num_ids()) return internal_error("free list holds invalid block {}", b);
      if (tier(b) != want)
        return internal_error("{} free list holds block {} of the {} tier", block_tier_name(want), b,
                              block_tier_name(tier(b)));
      if (seen[b]) return internal_error("free list has a cycle at block {}", b);
      seen[b] = true;
      ++count;
      const BlockMeta& m = meta_[b];
      if (!m.is_free) return internal_error("block {} on the free list is not marked free", b);
      if (m.ref_count != 0) return internal_error("free block {} has ref count {}", b, m.ref_count);
      if (m.is_cached()) return internal_error("free block {} still has a cache key", b);
    }
    if (count != tiers_[t].num_free)
      return internal_error("{} free list holds {} blocks, counter says {}", block_tier_name(want), count,
                            tiers_[t].num_free);
  }
  for (BlockId b = 0; b < num_ids(); ++b)
    if (meta_[b].is_free && !seen[b]) return internal_error("block {} marked free but not on the free list", b);
  std::vector<int32_t> held(held_.size(), 0), group_held(held_.size(), 0);
  for (BlockId b = 0; b < num_ids(); ++b) {
    if (owner_[b] < 0) continue;
    if (meta_[b].is_free) return internal_error("free block {} still has holder {}", b, owner_[b]);
    if (static_cast<size_t>(owner_[b]) >= held.size())
      return internal_error("block {} held by namespace {} that has no count", b, owner_[b]);
    ++held[owner_[b]];
    ++group_held[group_of(owner_[b])];
  }
  for (size_t ns = 0; ns < held.size(); ++ns) {
    if (held[ns] != held_[ns])
      return internal_error("namespace {} holds {} blocks, counter says {}", ns, held[ns], held_[ns]);
    if (group_held[ns] != group_held_[ns])
      return internal_error("namespace group {} holds {} blocks, counter says {}", ns, group_held[ns], group_held_[ns]);
  }
  return ok_status();
}

}  // namespace pagoda::kv
