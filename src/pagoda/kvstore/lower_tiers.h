#pragma once
// LowerTiers: the KV tiers below the host tier, in lookup order (disk, then
// redis), as the engine uses them. fetch() reads the longest run of a
// prompt's missing blocks from disk, then continues the run from redis (a
// redis hit is also queued for disk); store() hands a block the host tier
// received to every tier's writer.
//
// Thread safety: as BlockStore (any thread); the engine calls fetch and store
// from its own thread.

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/kvstore/block_store.h"

namespace pagoda::kvstore {

class LowerTiers {
 public:
  // `disk` and `redis` may be null (that tier is off); block_bytes: one block's payload.
  LowerTiers(size_t block_bytes, std::unique_ptr<BlockStore> disk, std::unique_ptr<BlockStore> redis);

  size_t block_bytes() const { return block_bytes_; }
  bool empty() const { return !disk_ && !redis_; }

  struct Fetched {
    int32_t from_disk = 0;   // blocks [0, from_disk) came from disk
    int32_t from_redis = 0;  // then [from_disk, from_disk + from_redis) from redis
    std::vector<std::byte> data;  // (from_disk + from_redis) * block_bytes
  };
  // The longest run keys[0..] found below the host tier.
  Fetched fetch(std::span<const kv::StableKey> keys);
  // Queues a copy of `block` for every tier that may not hold it.
  void store(const kv::StableKey& key, std::span<const std::byte> block);
  void flush();

  BlockStore* disk() { return disk_.get(); }
  BlockStore* redis() { return redis_.get(); }
  // Tier stats, [0] disk, [1] redis (enabled false when off).
  std::array<TierIoStats, 2> stats() const;
  // "disk DIR (...), redis HOST:PORT (...)" for the start-up line; "none" when empty.
  std::string describe() const;

 private:
  size_t block_bytes_;
  std::unique_ptr<BlockStore> disk_;
  std::unique_ptr<BlockStore> redis_;
};

}  // namespace pagoda::kvstore
