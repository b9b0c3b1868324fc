#include "pagoda/backend/cpu/kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "pagoda/core/thread_pool.h"
#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/vector_dot.h"

namespace pagoda::kernels {

namespace {

struct WorkItem {
  int32_t sequence;
  int32_t new_token;  // index among the sequence's new tokens
};

// Reads (slot, head) vectors of one of K or V as f32: f32 pools in place, the
// other dtypes dequantized into the caller's buffer (so attention over a
// quantized pool is attention over the dequantized values, by construction).
class KvVectorReader {
 public:
  KvVectorReader(const void* data, const void* scales, DType dtype, const PagedKvLayer& layer)
      : data_(static_cast<const std::byte*>(data)),
        scales_(static_cast<const std::byte*>(scales)),
        dtype_(dtype),
        head_dim_(layer.head_dim),
        num_kv_heads_(static_cast<size_t>(layer.num_kv_heads)),
        block_size_(layer.block_size),
        head_bytes_(kv_head_bytes(layer.head_dim, dtype)),
        scale_bytes_(kv_head_scale_bytes(layer.head_dim, dtype)) {}

  const float* read(int64_t slot, size_t kv_head, float* buffer) const {
    const size_t vector = static_cast<size_t>(slot) * num_kv_heads_ + kv_head;
    if (dtype_ == DType::kF32) return reinterpret_cast<const float*>(data_ + vector * head_bytes_);
    dequantize_kv_vector(data_ + vector * head_bytes_,
                         scales_ != nullptr ? scales_ + kv_scale_vector(slot, static_cast<int32_t>(kv_head), block_size_,
                                                                        static_cast<int32_t>(num_kv_heads_)) *
                                                        scale_bytes_
                                            : nullptr,
                         head_dim_,
                         dtype_, buffer);
    return buffer;
  }

 private:
  const std::byte* data_;
  const std::byte* scales_;
  DType dtype_;
  int32_t head_dim_;
  size_t num_kv_heads_;
  int32_t block_size_;
  size_t head_bytes_;
  size_t scale_bytes_;
};

}  // namespace

void paged_attention(const float* q, const PagedKvLayer& layer,
                     std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                     float* out) {
  const size_t head_dim = static_cast<size_t>(layer.head_dim);
  const size_t num_q_heads = static_cast<size_t>(params.num_q_heads);
  const size_t group = num_q_heads / static_cast<size_t>(layer.num_kv_heads);
  const KvVectorReader keys(layer.key, layer.key_scales, layer.key_dtype, layer);
  const KvVectorReader values(layer.value, layer.value_scales, layer.value_dtype, layer);
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
    thread_local std::vector<float> kv_buffer;  // one dequantized K or V vector
    kv_buffer.resize(head_dim);
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
        const float* k = keys.read(slot, kv_head, kv_buffer.data());
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
        const float* v = values.read(slot, kv_head, kv_buffer.data());
        for (size_t g = 0; g < group; ++g) {
          axpy(scores[g * context + p], v, acc.data() + g * head_dim, head_dim);
        }
      }
      for (size_t g = 0; g < group; ++g)
        std::copy_n(acc.data() + g * head_dim, head_dim,
                    out + (row * num_q_heads + kv_head * group + g) * head_dim);
    }
  }, min_units);
}

}  // namespace pagoda::kernels
