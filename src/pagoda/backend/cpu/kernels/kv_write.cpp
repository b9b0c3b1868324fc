#include "pagoda/backend/cpu/kernels/kv_write.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "pagoda/backend/cpu/kernels/kv_quantize.h"

namespace pagoda::kernels {

namespace {

// Writes the rows of one of K or V (src: [num_tokens, kv_heads, head_dim] f32).
void write_pool(const float* src, std::span<const int64_t> slots, const PagedKvLayer& layer,
                void* data, void* scales, DType dtype, float fixed_scale) {
  const size_t heads = static_cast<size_t>(layer.num_kv_heads);
  const size_t head_dim = static_cast<size_t>(layer.head_dim);
  auto* bytes = static_cast<std::byte*>(data);
  if (dtype == DType::kF32) {  // the common case stays one memcpy per token
    const size_t row_bytes = heads * head_dim * sizeof(float);
    for (size_t t = 0; t < slots.size(); ++t)
      if (slots[t] >= 0) std::memcpy(bytes + slots[t] * row_bytes, src + t * heads * head_dim, row_bytes);
    return;
  }
  const size_t head_bytes = kv_head_bytes(layer.head_dim, dtype);
  const size_t scale_bytes = kv_head_scale_bytes(layer.head_dim, dtype);
  auto* scale_base = static_cast<std::byte*>(scales);
  const bool per_tensor_fp8 = dtype == DType::kFP8E4M3 && fixed_scale > 0.0f;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (size_t h = 0; h < heads; ++h) {
      const size_t vector = static_cast<size_t>(slots[t]) * heads + h;
      const float* x = src + (t * heads + h) * head_dim;
      void* scale_record =
          scale_base != nullptr
              ? scale_base + kv_scale_vector(slots[t], static_cast<int32_t>(h), layer.block_size, layer.num_kv_heads) *
                                 scale_bytes
              : nullptr;
      if (per_tensor_fp8) {
        quantize_kv_vector_fp8_fixed_scale(x, layer.head_dim, fixed_scale, bytes + vector * head_bytes, scale_record);
      } else {
        quantize_kv_vector(x, layer.head_dim, dtype, bytes + vector * head_bytes, scale_record);
      }
    }
  }
}

// Cross-layer sharing: merges the rows of one of K or V into the shared slot's
// stored directions (runtime/cross_layer_share.h). `side` is 0 for K, 1 for V:
// which record of each (slot, head) holds the norms.
void write_shared(const float* src, std::span<const int64_t> slots, const PagedKvLayer& layer, void* data,
                  void* scales, DType dtype, int32_t side) {
  const size_t heads = static_cast<size_t>(layer.num_kv_heads);
  const int32_t head_dim = layer.head_dim;
  const size_t record = static_cast<size_t>(layer.share_record);
  const size_t head_bytes = kv_head_bytes(head_dim, dtype);
  const size_t scale_bytes = kv_head_scale_bytes(head_dim, dtype);
  auto* bytes = static_cast<std::byte*>(data);
  auto* scale_base = static_cast<std::byte*>(scales);
  std::vector<float> merged(static_cast<size_t>(head_dim));
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (size_t h = 0; h < heads; ++h) {
      const size_t vector = static_cast<size_t>(slots[t]) * heads + h;
      const float* x = src + (t * heads + h) * static_cast<size_t>(head_dim);
      std::byte* code = bytes + vector * head_bytes;
      std::byte* scale_record =
          scale_base != nullptr
              ? scale_base + kv_scale_vector(slots[t], static_cast<int32_t>(h), layer.block_size, layer.num_kv_heads) *
                                 scale_bytes
              : nullptr;
      float* norms = layer.share_norms + (vector * 2 + static_cast<size_t>(side)) * record;
      double norm2 = 0.0;
      for (int32_t i = 0; i < head_dim; ++i) norm2 += static_cast<double>(x[i]) * x[i];
      const float norm = static_cast<float>(std::sqrt(norm2));
      const float inv_norm = norm > 0.0f ? 1.0f / norm : 0.0f;
      // The stored sum of member directions so far (none for the first member), plus this one's.
      float length = 0.0f;
      if (layer.share_member > 0) {
        length = norms[record - 1];
        dequantize_kv_vector(code, scale_record, head_dim, dtype, merged.data());
        for (int32_t i = 0; i < head_dim; ++i) merged[i] = merged[i] * length + x[i] * inv_norm;
      } else {
        for (int32_t i = 0; i < head_dim; ++i) merged[i] = x[i] * inv_norm;
      }
      double sum2 = 0.0;
      for (int32_t i = 0; i < head_dim; ++i) sum2 += static_cast<double>(merged[i]) * merged[i];
      length = static_cast<float>(std::sqrt(sum2));
      const float inv_length = length > 0.0f ? 1.0f / length : 0.0f;
      for (int32_t i = 0; i < head_dim; ++i) merged[i] *= inv_length;
      quantize_kv_vector(merged.data(), head_dim, dtype, code, scale_record);
      norms[layer.share_member] = norm;
      norms[record - 1] = length;
    }
  }
}

}  // namespace

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
#ifndef NDEBUG
  for (int64_t slot : slots) assert(slot < static_cast<int64_t>(layer.num_blocks) * layer.block_size);
#endif
  assert(kv_quant_of(layer.key_dtype) == KvQuant::kNone || layer.key_scales != nullptr);
  assert(kv_quant_of(layer.value_dtype) == KvQuant::kNone || layer.value_scales != nullptr);
  if (layer.share_norms != nullptr) {
    write_shared(k, slots, layer, layer.key, layer.key_scales, layer.key_dtype, 0);
    write_shared(v, slots, layer, layer.value, layer.value_scales, layer.value_dtype, 1);
    return;
  }
  write_pool(k, slots, layer, layer.key, layer.key_scales, layer.key_dtype, layer.key_fixed_scale);
  write_pool(v, slots, layer, layer.value, layer.value_scales, layer.value_dtype, layer.value_fixed_scale);
}

}  // namespace pagoda::kernels
