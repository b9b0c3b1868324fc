#pragma once
// The content hashes of a token sequence's full blocks (prefix_cache.h's
// block_content_hash), computed once and extended as tokens arrive, so that a
// request waiting for admission is not re-hashed on every scheduling attempt.
// The prefix cache chains them with the namespace seed on each match: cheap
// compared with hashing the tokens.
//
// Thread safety: none (one per sequence, engine thread).

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/kv/kv_types.h"

namespace pagoda::kv {

class BlockHashes {
 public:
  explicit BlockHashes(int32_t block_size = 16) : block_size_(block_size) {}

  // Hashes the full blocks of `tokens` not hashed yet. `tokens` must start with
  // the tokens hashed by earlier calls (the same sequence, grown).
  void extend(std::span<const TokenId> tokens);
  // One hash per full block hashed so far, in order.
  std::span<const uint64_t> hashes() const { return hashes_; }
  int32_t block_size() const { return block_size_; }
  void clear() { hashes_.clear(); }

 private:
  int32_t block_size_;
  std::vector<uint64_t> hashes_;
};

}  // namespace pagoda::kv
