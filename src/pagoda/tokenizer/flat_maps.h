#pragma once
// Two small open-addressing hash maps for the BPE hot path, where std::unordered_map's node
// allocations and pointer chasing cost more than the merges themselves:
//   PairMap:   (left id, right id) -> (merge rank, merged id)
//   StringMap: byte string -> id, keys stored in one arena
// Both are built once at load time and then only read.
//
// Thread safety: concurrent find() calls are safe once building is finished.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::tokenizer {

inline uint64_t mix_hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL ^ bytes.size();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t chunk;
    __builtin_memcpy(&chunk, bytes.data() + i, 8);
    h = mix_hash(h ^ chunk);
  }
  uint64_t tail = 0;
  for (size_t shift = 0; i < bytes.size(); ++i, shift += 8) {
    tail |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << shift;
  }
  return mix_hash(h ^ tail);
}

struct MergeResult {
  int32_t rank;
  int32_t merged_id;
};

class PairMap {
 public:
  void reserve(size_t count);
  // A pair inserted again takes the new value (HF builds its merge map the same way).
  void insert(int32_t left, int32_t right, MergeResult value);
  // nullptr when the pair does not merge.
  const MergeResult* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = make_key(left, right);
    size_t index = mix_hash(key) & mask_;
    while (true) {
      const Slot& slot = slots_[index];
      if (slot.key == key) return &slot.value;
      if (slot.key == kEmpty) return nullptr;
      index = (index + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  static uint64_t make_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  struct Slot {
    uint64_t key = kEmpty;
    MergeResult value{};
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class StringMap {
 public:
  void reserve(size_t count, size_t total_key_bytes);
  // Keeps the first id inserted for a key.
  void insert(std::string_view key, int32_t id);
  // -1 when absent.
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t hash = hash_bytes(key);
    size_t index = hash & mask_;
    while (true) {
      const Slot& slot = slots_[index];
      if (slot.id < 0) return -1;
      if (slot.hash == hash && slot.length == key.size() &&
          std::string_view(arena_.data() + slot.offset, slot.length) == key) {
        return slot.id;
      }
      index = (index + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;
  };
  void grow();
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace pagoda::tokenizer
