#include "pagoda/kv/block_hashes.h"

#include "pagoda/kv/prefix_cache.h"

namespace pagoda::kv {

void BlockHashes::extend(std::span<const TokenId> tokens) {
  const size_t full = block_size_ > 0 ? tokens.size() / static_cast<size_t>(block_size_) : 0;
  for (size_t j = hashes_.size(); j < full; ++j)
    hashes_.push_back(block_content_hash(tokens.data() + j * static_cast<size_t>(block_size_), block_size_));
}

}  // namespace pagoda::kv
