#include "pagoda/kv/prefix_hash_table.h"

#include <bit>

namespace pagoda::kv {

PrefixHashTable::PrefixHashTable(int32_t max_entries) {
  const size_t capacity = std::bit_ceil(static_cast<size_t>(max_entries < 4 ? 4 : max_entries) * 2);
  entries_.resize(capacity);
  mask_ = capacity - 1;
}

bool PrefixHashTable::insert(uint64_t key, BlockId block) {
  size_t slot = key & mask_;
  while (entries_[slot].key != 0) {
    if (entries_[slot].key == key) return false;
    slot = (slot + 1) & mask_;
  }
  entries_[slot] = Entry{key, block};
  ++size_;
  return true;
}

bool PrefixHashTable::reassign(uint64_t key, BlockId block) {
  size_t slot = key & mask_;
  while (entries_[slot].key != key) {
    if (entries_[slot].key == 0) return false;
    slot = (slot + 1) & mask_;
  }
  entries_[slot].block = block;
  return true;
}

bool PrefixHashTable::erase(uint64_t key) {
  size_t slot = key & mask_;
  while (entries_[slot].key != key) {
    if (entries_[slot].key == 0) return false;
    slot = (slot + 1) & mask_;
  }
  // Backward-shift: pull later entries of the probe run into the hole, so no
  // tombstones accumulate.
  size_t hole = slot;
  size_t next = (hole + 1) & mask_;
  while (entries_[next].key != 0) {
    const size_t home = entries_[next].key & mask_;
    // Move `next` into the hole if its home is not cyclically in (hole, next].
    const bool home_after_hole = ((next - home) & mask_) >= ((next - hole) & mask_);
    if (home_after_hole) {
      entries_[hole] = entries_[next];
      hole = next;
    }
    next = (next + 1) & mask_;
  }
  entries_[hole] = Entry{};
  --size_;
  return true;
}

}  // namespace pagoda::kv
