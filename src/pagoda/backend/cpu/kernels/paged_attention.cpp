#include "pagoda/backend/cpu/kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "pagoda/core/thread_pool.h"
#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/kv_vector_reader.h"
#include "pagoda/backend/cpu/kernels/paged_attention_tiled.h"
#include "pagoda/backend/cpu/kernels/vector_dot.h"

namespace pagoda::kernels {

namespace {

struct WorkItem {
  int32_t sequence;
  int32_t new_token;  // index among the sequence's new tokens
};

}  // namespace

void paged_attention(const float* q, const PagedKvLayer& layer, std::span<const PagedSequence> sequences,
                     const PagedAttentionParams& params, float* out) {
  // The tiled kernel reads neither eviction scores' full distributions nor cross-layer norms.
  bool reference = layer.share_norms != nullptr;
  for (const PagedSequence& s : sequences) reference |= s.eviction.mass != nullptr;
  if (reference) return paged_attention_reference(q, layer, sequences, params, out);
  paged_attention_tiled(q, layer, sequences, params, out);
}

void paged_attention_reference(const float* q, const PagedKvLayer& layer,
                               std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                               float* out) {
  const size_t head_dim = static_cast<size_t>(layer.head_dim);
  const size_t num_q_heads = static_cast<size_t>(params.num_q_heads);
  const size_t group = num_q_heads / static_cast<size_t>(layer.num_kv_heads);
  const KvVectorReader keys(layer.key, layer.key_scales, layer.key_dtype, layer);
  const KvVectorReader values(layer.value, layer.value_scales, layer.value_dtype, layer);
  const int32_t block_size = layer.block_size;
  // Cross-layer sharing: stored vectors are directions; this layer's norm of each scales them.
  const bool shared = layer.share_norms != nullptr;
  const auto share_norm = [&layer](int64_t slot, size_t kv_head, size_t side) {
    const size_t vector = static_cast<size_t>(slot) * static_cast<size_t>(layer.num_kv_heads) + kv_head;
    return layer.share_norms[(vector * 2 + side) * static_cast<size_t>(layer.share_record) +
                             static_cast<size_t>(layer.share_member)];
  };

  std::vector<WorkItem> tokens;
  for (size_t s = 0; s < sequences.size(); ++s)
    for (int32_t i = 0; i < sequences[s].num_new_tokens; ++i)
      tokens.push_back({static_cast<int32_t>(s), i});

  // Token eviction scores: each scoring (token, kv head) writes its own row
  // (probabilities summed over the group, entropy), so units never write the
  // same memory; the rows are added into the sequences' state afterwards.
  const size_t num_kv_heads = static_cast<size_t>(layer.num_kv_heads);
  std::vector<int64_t> score_row;  // per token: offset of its first head's row in score_rows, or -1
  std::vector<float> score_rows;
  std::vector<double> score_entropy;  // per (scoring token, kv head)
  bool scoring = false;
  for (const PagedSequence& s : sequences) scoring |= s.eviction.mass != nullptr;
  if (scoring) {
    score_row.assign(tokens.size(), -1);
    size_t total = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const PagedSequence& seq = sequences[tokens[t].sequence];
      const int32_t query_index = seq.num_cached_tokens + tokens[t].new_token;
      if (seq.eviction.mass == nullptr || query_index < seq.eviction.score_from_index) continue;
      score_row[t] = static_cast<int64_t>(total);
      total += num_kv_heads * static_cast<size_t>(query_index + 1);
    }
    score_rows.assign(total, 0.0f);
    score_entropy.assign(tokens.size() * num_kv_heads, 0.0);
  }

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
    thread_local std::vector<float> kv_buffer;  // one dequantized K or V vector
    kv_buffer.resize(head_dim);
    for (size_t unit = begin; unit < end; ++unit) {
      const size_t token = unit / layer.num_kv_heads;
      const WorkItem item = tokens[token];
      const size_t kv_head = unit % layer.num_kv_heads;
      const PagedSequence& seq = sequences[item.sequence];
      const PagedSequenceEviction& ev = seq.eviction;
      const int32_t query_index = seq.num_cached_tokens + item.new_token;
      const int32_t first = params.sliding_window > 0
                                ? std::max(0, query_index - params.sliding_window + 1)
                                : 0;
      const size_t context = static_cast<size_t>(query_index - first + 1);
      const size_t row = static_cast<size_t>(seq.token_offset + item.new_token);

      scores.resize(group * context);
      for (size_t p = 0; p < context; ++p) {
        const int32_t index = first + static_cast<int32_t>(p);
        if (ev.is_hole(index, kv_head)) {  // evicted for this head: never read
          for (size_t g = 0; g < group; ++g) scores[g * context + p] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const int64_t slot = static_cast<int64_t>(seq.block_table[index / block_size]) * block_size +
                             index % block_size;
        const float* k = keys.read(slot, static_cast<int32_t>(kv_head), kv_buffer.data());
        const float k_scale = shared ? params.scale * share_norm(slot, kv_head, 0) : params.scale;
        for (size_t g = 0; g < group; ++g) {
          const float* qh = q + (row * num_q_heads + kv_head * group + g) * head_dim;
          scores[g * context + p] = dot_f32(qh, k, head_dim) * k_scale;
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
        if (ev.is_hole(index, kv_head)) continue;
        const int64_t slot = static_cast<int64_t>(seq.block_table[index / block_size]) * block_size +
                             index % block_size;
        const float* v = values.read(slot, static_cast<int32_t>(kv_head), kv_buffer.data());
        const float v_scale = shared ? share_norm(slot, kv_head, 1) : 1.0f;
        for (size_t g = 0; g < group; ++g) {
          axpy(scores[g * context + p] * v_scale, v, acc.data() + g * head_dim, head_dim);
        }
      }
      for (size_t g = 0; g < group; ++g)
        std::copy_n(acc.data() + g * head_dim, head_dim,
                    out + (row * num_q_heads + kv_head * group + g) * head_dim);
      if (scoring && score_row[token] >= 0) {
        float* mass = score_rows.data() + score_row[token] + kv_head * static_cast<size_t>(query_index + 1);
        size_t attended = 0;
        for (size_t p = 0; p < context; ++p) attended += ev.is_hole(first + static_cast<int32_t>(p), kv_head) ? 0 : 1;
        const double log_n = attended > 1 ? std::log(static_cast<double>(attended)) : 1.0;
        double entropy = 0.0;
        for (size_t g = 0; g < group; ++g) {
          double h = 0.0;
          for (size_t p = 0; p < context; ++p) {
            const float prob = scores[g * context + p];
            mass[first + p] += prob;
            if (prob > 0.0f) h -= prob * std::log(static_cast<double>(prob));
          }
          entropy += attended > 1 ? h / log_n : 0.0;
        }
        score_entropy[unit] = entropy;
      }
    }
  }, min_units);

  if (!scoring) return;
  // Adds the rows into each sequence's state: one task per (sequence, kv head).
  ThreadPool::global().parallel_for(sequences.size() * num_kv_heads, [&](size_t begin, size_t end) {
    for (size_t u = begin; u < end; ++u) {
      const PagedSequence& seq = sequences[u / num_kv_heads];
      const size_t kv_head = u % num_kv_heads;
      const PagedSequenceEviction& ev = seq.eviction;
      if (ev.mass == nullptr) continue;
      float* dst = ev.mass + static_cast<int64_t>(kv_head) * ev.mass_stride;
      for (size_t t = 0; t < tokens.size(); ++t) {
        if (&sequences[tokens[t].sequence] != &seq || score_row[t] < 0) continue;
        const size_t len = static_cast<size_t>(seq.num_cached_tokens + tokens[t].new_token + 1);
        const float* src = score_rows.data() + score_row[t] + kv_head * len;
        for (size_t p = 0; p < len; ++p) dst[p] += src[p];
        if (ev.entropy_sum != nullptr) {
          ev.entropy_sum[kv_head] += score_entropy[t * num_kv_heads + kv_head];
          ev.entropy_count[kv_head] += static_cast<int64_t>(group);
        }
      }
    }
  }, 1);
}

}  // namespace pagoda::kernels
