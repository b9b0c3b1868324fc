#include "pagoda/backend/cuda/step_plan.h"

#include <algorithm>

namespace pagoda::cuda {

namespace {
size_t align_up(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

size_t step_metadata_bytes(const StepLayout& layout) {
  const size_t T = static_cast<size_t>(layout.max_num_tokens);
  return align_up(T * 4) * 6 + align_up(T * 8) +
         align_up(static_cast<size_t>(layout.max_num_seqs) * layout.block_table_stride * 4);
}

StepMetadata bind_step_metadata(void* base, const StepLayout& layout) {
  const size_t T = static_cast<size_t>(layout.max_num_tokens);
  char* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* at = p;
    p += align_up(bytes);
    return at;
  };
  StepMetadata m;
  m.token_ids = reinterpret_cast<int32_t*>(take(T * 4));
  m.positions = reinterpret_cast<int32_t*>(take(T * 4));
  m.slots = reinterpret_cast<int64_t*>(take(T * 8));
  m.token_sequence = reinterpret_cast<int32_t*>(take(T * 4));
  m.kv_begin = reinterpret_cast<int32_t*>(take(T * 4));
  m.kv_end = reinterpret_cast<int32_t*>(take(T * 4));
  m.logit_rows = reinterpret_cast<int32_t*>(take(T * 4));
  m.block_tables = reinterpret_cast<int32_t*>(take(static_cast<size_t>(layout.max_num_seqs) * layout.block_table_stride * 4));
  return m;
}

std::vector<int32_t> decode_graph_buckets(int32_t max_num_seqs) {
  std::vector<int32_t> buckets;
  for (int32_t b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128})
    if (b < max_num_seqs) buckets.push_back(b);
  for (int32_t b = 160; b < max_num_seqs; b += 32) buckets.push_back(b);
  buckets.push_back(max_num_seqs);
  return buckets;
}

int32_t choose_graph_bucket(const ForwardBatch& batch, std::span<const int32_t> buckets, int32_t max_graph_batch) {
  if (batch.sequences.empty()) return 0;
  for (const SequenceSlice& s : batch.sequences)
    if (s.num_new_tokens != 1 || !(s.logits_for_last_token || s.logits_for_all_new_tokens)) return 0;
  const int32_t n = static_cast<int32_t>(batch.sequences.size());
  if (max_graph_batch > 0 && n > max_graph_batch) return 0;
  for (int32_t b : buckets)
    if (b >= n) return b;
  return 0;
}

int32_t step_block_table_width(const ForwardBatch& batch, int32_t block_size) {
  int32_t width = 1;
  for (const SequenceSlice& seq : batch.sequences)
    width = std::max(width, (seq.num_cached_tokens + seq.num_new_tokens + block_size - 1) / block_size);
  return width;
}

int32_t fill_step_metadata(const ForwardBatch& batch, int32_t block_size, int32_t sliding_window,
                           int32_t block_table_stride, int32_t padded_tokens, const StepMetadata& m) {
  int32_t rows = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    const int32_t total = seq.num_cached_tokens + seq.num_new_tokens;
    const int32_t blocks_needed = (total + block_size - 1) / block_size;
    int32_t* table = m.block_tables + s * static_cast<size_t>(block_table_stride);
    std::copy_n(seq.block_table.data(), blocks_needed, table);
    for (int32_t i = 0; i < seq.num_new_tokens; ++i) {
      const int32_t t = seq.token_offset + i;
      const int32_t index = seq.num_cached_tokens + i;  // position in the sequence's KV
      m.token_ids[t] = batch.token_ids[static_cast<size_t>(t)];
      m.positions[t] = batch.positions[static_cast<size_t>(t)];
      m.slots[t] = static_cast<int64_t>(table[index / block_size]) * block_size + index % block_size;
      m.token_sequence[t] = static_cast<int32_t>(s);
      m.kv_begin[t] = sliding_window > 0 ? std::max(0, index - sliding_window + 1) : 0;
      m.kv_end[t] = index + 1;
      if (seq.logits_for_all_new_tokens || (seq.logits_for_last_token && i == seq.num_new_tokens - 1))
        m.logit_rows[rows++] = t;
    }
  }
  for (int32_t t = batch.num_tokens(); t < padded_tokens; ++t) {
    m.token_ids[t] = 0;
    m.positions[t] = 0;
    m.slots[t] = -1;
    m.token_sequence[t] = 0;
    m.kv_begin[t] = 0;
    m.kv_end[t] = 0;
    m.logit_rows[t] = t;
  }
  return rows;
}

}  // namespace pagoda::cuda
