#include "pagoda/backend/cuda/attention_step_split.h"

#include <unordered_map>

namespace pagoda::cuda {

size_t count_leading_decodes(std::span<const SequenceSlice> sequences) {
  size_t n = 0;
  while (n < sequences.size() && sequences[n].num_new_tokens == 1) ++n;
  return n;
}

std::optional<ScratchRemap> remap_blocks_to_scratch(std::span<const SequenceSlice> sequences, int32_t block_size,
                                                    int32_t num_blocks) {
  if (block_size <= 0) return std::nullopt;
  ScratchRemap remap;
  remap.tables.resize(sequences.size());
  std::unordered_map<int32_t, int32_t> scratch_of;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const SequenceSlice& s = sequences[i];
    const int64_t length = int64_t{s.num_cached_tokens} + s.num_new_tokens;
    const size_t used = static_cast<size_t>((length + block_size - 1) / block_size);
    if (length < 0 || used > s.block_table.size()) return std::nullopt;
    remap.tables[i].reserve(used);
    for (size_t j = 0; j < used; ++j) {
      const int32_t block = s.block_table[j];
      if (block < 0 || block >= num_blocks) return std::nullopt;
      const auto [it, inserted] = scratch_of.try_emplace(block, static_cast<int32_t>(remap.sources.size()));
      if (inserted) remap.sources.push_back(block);
      remap.tables[i].push_back(it->second);
    }
  }
  return remap;
}

}  // namespace pagoda::cuda
