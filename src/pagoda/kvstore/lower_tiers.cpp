#include "pagoda/kvstore/lower_tiers.h"

#include <algorithm>

namespace pagoda::kvstore {

LowerTiers::LowerTiers(size_t block_bytes, std::unique_ptr<BlockStore> disk, std::unique_ptr<BlockStore> redis)
    : block_bytes_(block_bytes), disk_(std::move(disk)), redis_(std::move(redis)) {}

LowerTiers::Fetched LowerTiers::fetch(std::span<const kv::StableKey> keys) {
  Fetched f;
  if (keys.empty() || empty()) return f;
  // The buffer grows with what is found, never to the whole prompt up front: a miss (every new prompt) must
  // not cost a zero-filled buffer of keys.size() blocks (137 MB for 2,048 tokens of Llama-3-8B fp8 KV).
  size_t at = 0;  // blocks in f.data
  if (disk_) {
    size_t run = 0;  // the disk's index knows these: read them, and the first key it does not (a counted miss)
    while (run < keys.size() && disk_->probably_holds(keys[run])) ++run;
    const size_t ask = std::min(keys.size(), run + 1);
    f.data.resize(ask * block_bytes_);
    f.from_disk = disk_->read_prefix(keys.first(ask), f.data);
    at = static_cast<size_t>(f.from_disk);
  }
  if (redis_) {
    // In rounds of the redis tier's pipeline depth; a round that comes back short ends the run.
    constexpr size_t kRound = 32;
    while (at < keys.size()) {
      const size_t n = std::min(kRound, keys.size() - at);
      f.data.resize((at + n) * block_bytes_);
      const int32_t got =
          redis_->read_prefix(keys.subspan(at, n), std::span(f.data).subspan(at * block_bytes_, n * block_bytes_));
      f.from_redis += got;
      at += static_cast<size_t>(got);
      if (static_cast<size_t>(got) < n) break;
    }
    if (disk_) {
      for (int32_t i = 0; i < f.from_redis; ++i) {
        const size_t j = static_cast<size_t>(f.from_disk + i);
        const auto block = std::span(f.data).subspan(j * block_bytes_, block_bytes_);
        disk_->write_async(keys[j], std::vector<std::byte>(block.begin(), block.end()));
      }
    }
  }
  f.data.resize(at * block_bytes_);
  return f;
}

void LowerTiers::store(const kv::StableKey& key, std::span<const std::byte> block) {
  for (BlockStore* tier : {disk_.get(), redis_.get()})
    if (tier != nullptr && !tier->probably_holds(key)) tier->write_async(key, std::vector<std::byte>(block.begin(), block.end()));
}

void LowerTiers::flush() {
  if (disk_) disk_->flush();
  if (redis_) redis_->flush();
}

std::array<TierIoStats, 2> LowerTiers::stats() const {
  std::array<TierIoStats, 2> out{};
  if (disk_) out[0] = disk_->stats();
  if (redis_) out[1] = redis_->stats();
  return out;
}

std::string LowerTiers::describe() const {
  std::string out;
  for (const BlockStore* tier : {disk_.get(), redis_.get()}) {
    if (tier == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += tier->describe();
  }
  return out.empty() ? "none" : out;
}

}  // namespace pagoda::kvstore
