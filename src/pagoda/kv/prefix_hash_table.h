#pragma once
// PrefixHashTable: open-addressing map from a 64-bit prefix key hash to the
// cached block holding that prefix's last block. Linear probing, backward-shift
// deletion, fixed capacity (a power of two >= 2 x blocks), so lookups touch one
// or two cache lines and never allocate. Key 0 means "empty"; callers never use it.
//
// A hash is only a lookup accelerator: PrefixCache compares tokens, parent and
// namespace before trusting an entry.
//
// Thread safety: none.

#include <cstdint>
#include <vector>

#include "pagoda/kv/kv_types.h"

namespace pagoda::kv {

class PrefixHashTable {
 public:
  explicit PrefixHashTable(int32_t max_entries);

  BlockId find(uint64_t key) const {
    size_t slot = key & mask_;
    while (true) {
      const Entry& e = entries_[slot];
      if (e.key == key) return e.block;
      if (e.key == 0) return kNoBlock;
      slot = (slot + 1) & mask_;
    }
  }
  void prefetch(uint64_t key) const { __builtin_prefetch(&entries_[key & mask_]); }
  // False (and no change) if the key is present already.
  bool insert(uint64_t key, BlockId block);
  // False if the key is absent.
  bool erase(uint64_t key);
  // Points a present key at another block (a cached block moving between
  // tiers); false if the key is absent.
  bool reassign(uint64_t key, BlockId block);
  int32_t size() const { return size_; }

 private:
  struct Entry {
    uint64_t key = 0;
    BlockId block = kNoBlock;
  };
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int32_t size_ = 0;
};

}  // namespace pagoda::kv
