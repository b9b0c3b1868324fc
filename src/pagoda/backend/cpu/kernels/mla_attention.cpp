#include "pagoda/backend/cpu/kernels/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/vector_dot.h"
#include "pagoda/runtime/mla_fp8_layout.h"
#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

namespace {

struct WorkItem {
  int32_t sequence;
  int32_t new_token;   // index among the sequence's new tokens
  int32_t first_head;  // heads [first_head, first_head + num_heads)
  int32_t num_heads;
};

}  // namespace

void mla_paged_attention(const float* q, const PagedKvLayer& layer, std::span<const PagedSequence> sequences,
                         const MlaAttentionParams& params, float* out) {
  const size_t dim = static_cast<size_t>(layer.head_dim);
  const size_t rank = static_cast<size_t>(params.kv_lora_rank);
  const size_t heads = static_cast<size_t>(params.num_heads);
  const int32_t block_size = layer.block_size;
  const auto* data = static_cast<const std::byte*>(layer.key);
  const auto* scales = static_cast<const std::byte*>(layer.key_scales);
  const bool records = layer.fp8_latent_records();  // runtime/mla_fp8_layout.h
  const int32_t rope = layer.latent_rope_dim, latent = layer.head_dim - rope;
  const size_t data_bytes = records ? static_cast<size_t>(mla_fp8_record_bytes(latent, rope))
                                    : kv_head_bytes(layer.head_dim, layer.key_dtype);
  const size_t scale_bytes = kv_head_scale_bytes(layer.head_dim, layer.key_dtype);

  size_t num_tokens = 0;
  for (const PagedSequence& s : sequences) num_tokens += static_cast<size_t>(s.num_new_tokens);
  // Heads share each cached vector's load; split them only when there are too few
  // tokens to keep the threads busy (decode of a few sequences).
  const size_t threads = ThreadPool::global().size();
  const size_t groups = std::clamp<size_t>((2 * threads + num_tokens - 1) / std::max<size_t>(num_tokens, 1), 1, heads);
  const size_t heads_per_group = (heads + groups - 1) / groups;
  std::vector<WorkItem> items;
  items.reserve(num_tokens * groups);
  for (size_t s = 0; s < sequences.size(); ++s) {
    for (int32_t i = 0; i < sequences[s].num_new_tokens; ++i) {
      for (size_t h = 0; h < heads; h += heads_per_group) {
        items.push_back({static_cast<int32_t>(s), i, static_cast<int32_t>(h),
                         static_cast<int32_t>(std::min(heads_per_group, heads - h))});
      }
    }
  }

  ThreadPool::global().parallel_for(items.size(), [&](size_t begin, size_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<float> buffer;  // one dequantized cached vector
    buffer.resize(dim);
    for (size_t unit = begin; unit < end; ++unit) {
      const WorkItem item = items[unit];
      const PagedSequence& seq = sequences[static_cast<size_t>(item.sequence)];
      const size_t context = static_cast<size_t>(seq.num_cached_tokens + item.new_token + 1);
      const size_t row = static_cast<size_t>(seq.token_offset + item.new_token);
      const size_t g = static_cast<size_t>(item.num_heads);
      const float* q_row = q + (row * heads + static_cast<size_t>(item.first_head)) * dim;
      float* out_row = out + (row * heads + static_cast<size_t>(item.first_head)) * rank;
      const auto read = [&](size_t index) -> const float* {
        const int64_t slot = static_cast<int64_t>(seq.block_table[index / block_size]) * block_size +
                             static_cast<int64_t>(index % block_size);
        const std::byte* vector = data + static_cast<size_t>(slot) * data_bytes;
        if (layer.key_dtype == DType::kF32) return reinterpret_cast<const float*>(vector);
        if (records) {
          mla_fp8_dequantize(reinterpret_cast<const uint8_t*>(vector), latent, rope, buffer.data());
          return buffer.data();
        }
        const std::byte* record =
            scales != nullptr ? scales + kv_scale_vector(slot, 0, block_size, 1) * static_cast<int64_t>(scale_bytes)
                              : nullptr;
        dequantize_kv_vector(vector, record, layer.head_dim, layer.key_dtype, buffer.data());
        return buffer.data();
      };

      scores.resize(g * context);
      for (size_t p = 0; p < context; ++p) {
        const float* k = read(p);
        for (size_t h = 0; h < g; ++h) scores[h * context + p] = dot_f32(q_row + h * dim, k, dim) * params.scale;
      }
      for (size_t h = 0; h < g; ++h) {
        float* s = scores.data() + h * context;
        const float max_score = *std::max_element(s, s + context);
        float sum = 0.0f;
        for (size_t p = 0; p < context; ++p) {
          s[p] = std::exp(s[p] - max_score);
          sum += s[p];
        }
        const float inv_sum = 1.0f / sum;
        for (size_t p = 0; p < context; ++p) s[p] *= inv_sum;
      }
      std::fill_n(out_row, g * rank, 0.0f);
      for (size_t p = 0; p < context; ++p) {
        const float* c = read(p);
        for (size_t h = 0; h < g; ++h) axpy(scores[h * context + p], c, out_row + h * rank, rank);
      }
    }
  });
}

}  // namespace pagoda::kernels
