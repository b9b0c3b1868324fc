#pragma once
// HashPerBlockCache: a model of the peers' hash-per-block prefix cache (vLLM v1
// style), for the hit-rate comparison only. Every full block is keyed by a
// hash of (parent hash, its tokens); a lookup walks the chain until the first
// missing hash; unreferenced blocks sit in one LRU free queue (a finished
// sequence's blocks enter it tail first) and a block is reused from the queue
// head whether or not it still has cached descendants.
//
// Not thread safe; bench only.

#include <cstdint>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagoda/kv/kv_types.h"

namespace pagoda::kv::bench {

class HashPerBlockCache {
 public:
  HashPerBlockCache(int32_t num_blocks, int32_t block_size);

  // Cached tokens reused, or -1 when the blocks do not fit (nothing changes).
  int32_t allocate(int64_t seq, std::string_view tenant, std::span<const TokenId> prompt);
  // The prompt's remaining tokens and `tokens` now have K/V; full blocks get hashes.
  bool extend(int64_t seq, std::span<const TokenId> tokens);
  void free(int64_t seq);

  int64_t hit_tokens() const { return hit_tokens_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }

 private:
  struct Block {
    int32_t ref = 0;
    uint64_t hash = 0;  // 0: not cached
    std::list<int32_t>::iterator queue_position;
    bool queued = false;
  };
  struct Sequence {
    uint64_t seed = 0;
    std::vector<TokenId> tokens;
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;  // hash of each full block so far
  };
  int32_t take_block();
  void register_full_blocks(Sequence& s);

  int32_t block_size_;
  std::vector<Block> blocks_;
  std::list<int32_t> free_queue_;  // LRU: front is evicted first
  std::unordered_map<uint64_t, int32_t> cached_;
  std::unordered_map<int64_t, Sequence> sequences_;
  int64_t hit_tokens_ = 0;
  int64_t prompt_tokens_ = 0;
};

}  // namespace pagoda::kv::bench
