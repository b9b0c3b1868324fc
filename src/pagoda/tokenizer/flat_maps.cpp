#include "pagoda/tokenizer/flat_maps.h"

#include <bit>

namespace pagoda::tokenizer {
namespace {

// Load factor at most 1/2: probes stay short.
size_t capacity_for(size_t count) { return std::bit_ceil(std::max<size_t>(16, count * 2)); }

}  // namespace

void PairMap::reserve(size_t count) {
  if (capacity_for(count) <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity_for(count), Slot{});
  mask_ = slots_.size() - 1;
  size_ = 0;
  for (const Slot& slot : old) {
    if (slot.key != kEmpty) {
      insert(static_cast<int32_t>(slot.key >> 32), static_cast<int32_t>(slot.key & 0xffffffffu),
             slot.value);
    }
  }
}

void PairMap::insert(int32_t left, int32_t right, MergeResult value) {
  if ((size_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(size_ + 1, size_ * 2));
  const uint64_t key = make_key(left, right);
  size_t index = mix_hash(key) & mask_;
  while (slots_[index].key != kEmpty) {
    if (slots_[index].key == key) {  // a repeated merge: the later rank wins, as in HF
      slots_[index].value = value;
      return;
    }
    index = (index + 1) & mask_;
  }
  slots_[index].key = key;
  slots_[index].value = value;
  ++size_;
}

void StringMap::reserve(size_t count, size_t total_key_bytes) {
  arena_.reserve(total_key_bytes);
  if (capacity_for(count) <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity_for(count), Slot{});
  mask_ = slots_.size() - 1;
  for (const Slot& slot : old) {
    if (slot.id < 0) continue;
    size_t index = slot.hash & mask_;
    while (slots_[index].id >= 0) index = (index + 1) & mask_;
    slots_[index] = slot;
  }
}

void StringMap::grow() { reserve(std::max<size_t>(16, size_ * 2), arena_.size()); }

void StringMap::insert(std::string_view key, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t hash = hash_bytes(key);
  size_t index = hash & mask_;
  while (slots_[index].id >= 0) {
    const Slot& slot = slots_[index];
    if (slot.hash == hash && slot.length == key.size() &&
        std::string_view(arena_.data() + slot.offset, slot.length) == key) {
      return;
    }
    index = (index + 1) & mask_;
  }
  Slot& slot = slots_[index];
  slot.hash = hash;
  slot.offset = static_cast<uint32_t>(arena_.size());
  slot.length = static_cast<uint32_t>(key.size());
  slot.id = id;
  arena_.append(key);
  ++size_;
}

}  // namespace pagoda::tokenizer
