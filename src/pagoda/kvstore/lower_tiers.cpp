#include "pagoda/kvstore/lower_tiers.h"

namespace pagoda::kvstore {

LowerTiers::LowerTiers(size_t block_bytes, std::unique_ptr<BlockStore> disk, std::unique_ptr<BlockStore> redis)
    : block_bytes_(block_bytes), disk_(std::move(disk)), redis_(std::move(redis)) {}

LowerTiers::Fetched LowerTiers::fetch(std::span<const kv::StableKey> keys) {
  Fetched f;
  if (keys.empty() || empty()) return f;
  f.data.resize(keys.size() * block_bytes_);
  std::span<std::byte> out(f.data);
  if (disk_) f.from_disk = disk_->read_prefix(keys, out.first(keys.size() * block_bytes_));
  const size_t rest = keys.size() - static_cast<size_t>(f.from_disk);
  if (redis_ && rest > 0) {
    const size_t at = static_cast<size_t>(f.from_disk) * block_bytes_;
    f.from_redis = redis_->read_prefix(keys.subspan(static_cast<size_t>(f.from_disk)), out.subspan(at, rest * block_bytes_));
    if (disk_) {
      for (int32_t i = 0; i < f.from_redis; ++i) {
        const size_t j = static_cast<size_t>(f.from_disk + i);
        const auto block = out.subspan(j * block_bytes_, block_bytes_);
        disk_->write_async(keys[j], std::vector<std::byte>(block.begin(), block.end()));
      }
    }
  }
  f.data.resize(static_cast<size_t>(f.from_disk + f.from_redis) * block_bytes_);
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
