#include "pagoda/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "pagoda/core/thread_pool.h"
#include "pagoda/kernels/cpu/vector_dot.h"

namespace pagoda::kernels {

namespace {

struct WorkItem {
  int32_t sequence;
  int32_t new_token;  // index among the sequence's new tokens
};

}  // namespace

void paged_attention(const float* q, const PagedKvLayer& layer,
                     std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                     float* out) {
  const size_t head_dim = static_cast<size_t>(layer.head_dim);
  const size_t num_q_heads = static_cast<size_t>(params.num_q_heads);
  const size_t group = num_q_heads / static_cast<size_t>(layer.num_kv_heads);
  const size_t kv_row = static_cast<size_t>(layer.num_kv_heads) * head_dim;
  const int32_t block_size = layer.block_size;

  std::vector<WorkItem> tokens;
  for (size_t s = 0; s < sequences.size(); ++s)
    for (int32_t i = 0; i < sequences[s].num_new_tokens; ++i)
      tokens.push_back({static_cast<int32_t>(s), i});

  // One work unit is one (token, kv head): the group's query heads share each K/V load.
  const size_t units = tokens.size() * static_cast<size_t>(layer.num_kv_heads);
  // Grain: keep each task above ~64K multiply-adds so short decodes stay on one thread.
  size_t total_context = 0;
  for (const PagedSequence& s : sequences)
    total_context += static_cast<size_t>(s.num_new_tokens) * (s.num_cached_tokens + s.num_new_tokens);
  const size_t macs_per_unit =
      std::max<size_t>(1, 2 * group * head_dim * total_context / std::max<size_t>(1, tokens.size()));
  const size_t min_units = std::max<size_t>(1, (size_t{1} << 16) / macs_per_unit);
  ThreadPool::global().parallel_for(units, [&](size_t begin, size_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<float> acc;
    for (size_t unit = begin; unit < end; ++unit) {
      const WorkItem item = tokens[unit / layer.num_kv_heads];
      const size_t kv_head = unit % layer.num_kv_heads;
      const PagedSequence& seq = sequences[item.sequence];
      const int32_t query_index = seq.num_cached_tokens + item.new_token;
      const int32_t first = params.sliding_window > 0
                                ? std::max(0, query_index - params.sliding_window + 1)
                                : 0;
      const size_t context = static_cast<size_t>(query_index - first + 1);
      const size_t row = static_cast<size_t>(seq.token_offset + item.new_token);

      scores.resize(group * context);
      for (size_t p = 0; p < context; ++p) {
        const int32_t index = first + static_cast<int32_t>(p);
        const int64_t slot = static_cast<int64_t>(seq.block_table[index / block_size]) * block_size +
                             index % block_size;
        const float* k = layer.key + slot * kv_row + kv_head * head_dim;
        for (size_t g = 0; g < group; ++g) {
          const float* qh = q + (row * num_q_heads + kv_head * group + g) * head_dim;
          scores[g * context + p] = dot_f32(qh, k, head_dim) * params.scale;
        }
      }
      for (size_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * context;
        const float max_score = *std::max_element(s, s + context);
        float sum = 0.0f;
        for (size_t p = 0; p < context; ++p) {
          s[p] = std::exp(s[p] - max_score);
          sum += s[p];
        }
        const float inv_sum = 1.0f / sum;
        for (size_t p = 0; p < context; ++p) s[p] *= inv_sum;
      }
      acc.assign(group * head_dim, 0.0f);
      for (size_t p = 0; p < context; ++p) {
        const int32_t index = first + static_cast<int32_t>(p);
        const int64_t slot = static_cast<int64_t>(seq.block_table[index / block_size]) * block_size +
                             index % block_size;
        const float* v = layer.value + slot * kv_row + kv_head * head_dim;
        for (size_t g = 0; g < group; ++g) {
          axpy(scores[g * context + p], v, acc.data() + g * head_dim, head_dim);
        }
      }
      for (size_t g = 0; g < group; ++g)
        std::copy_n(acc.data() + g * head_dim, head_dim,
                    out + (row * num_q_heads + kv_head * group + g) * head_dim);
    }
  });
}

}  // namespace pagoda::kernels
