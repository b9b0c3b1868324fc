#include "pagoda/kernels/cpu/kv_write.h"

#include <cassert>
#include <cstring>

namespace pagoda::kernels {

std::vector<int64_t> plan_kv_slots(std::span<const PagedSequence> sequences, int32_t block_size,
                                   size_t num_tokens) {
  std::vector<int64_t> slots(num_tokens, -1);
  for (const PagedSequence& s : sequences) {
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      const int32_t index = s.num_cached_tokens + i;
      const int32_t block = s.block_table[index / block_size];
      slots[s.token_offset + i] = static_cast<int64_t>(block) * block_size + index % block_size;
    }
  }
  return slots;
}

void kv_write(const float* k, const float* v, std::span<const int64_t> slots,
              const PagedKvLayer& layer) {
  const size_t row = static_cast<size_t>(layer.num_kv_heads) * layer.head_dim;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    assert(slots[t] < static_cast<int64_t>(layer.num_blocks) * layer.block_size);
    std::memcpy(layer.key + slots[t] * row, k + t * row, row * sizeof(float));
    std::memcpy(layer.value + slots[t] * row, v + t * row, row * sizeof(float));
  }
}

}  // namespace pagoda::kernels
