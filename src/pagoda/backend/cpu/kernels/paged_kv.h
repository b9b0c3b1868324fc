#pragma once
// Plain descriptors the paged-KV kernels take (plan on the host, then run).
// They hold no ownership; the KV pool (backend/) and the block tables
// (ForwardBatch) outlive the kernel call.

#include <cstddef>
#include <cstdint>
#include <span>

#include "pagoda/core/dtype.h"
#include "pagoda/runtime/kv_quant.h"

namespace pagoda::kernels {

// The quantized format of a KV dtype (kNone for f32 / f16 / bf16).
inline KvQuant kv_quant_of(DType dtype) {
  switch (dtype) {
    case DType::kFP8E4M3: return KvQuant::kFP8E4M3;
    case DType::kInt8: return KvQuant::kInt8;
    case DType::kInt4: return KvQuant::kInt4;
    default: return KvQuant::kNone;
  }
}

// Data bytes of one (token, head) vector of head_dim elements stored as dtype
// (scales not included: they live in the scale pool).
inline size_t kv_head_bytes(int32_t head_dim, DType dtype) {
  switch (dtype) {
    case DType::kF32: return static_cast<size_t>(head_dim) * 4;
    case DType::kF16:
    case DType::kBF16: return static_cast<size_t>(head_dim) * 2;
    default: return static_cast<size_t>(kv_head_data_bytes(head_dim, kv_quant_of(dtype)));
  }
}

// Bytes of the scale records of one (token, head) vector: 0 for unquantized dtypes.
inline size_t kv_head_scale_bytes(int32_t head_dim, DType dtype) {
  return static_cast<size_t>(kv_scale_groups(head_dim, kv_quant_of(dtype))) * 4;
}

// One layer of the paged KV pool. key and value each hold
// [num_blocks, block_size, num_kv_heads, kv_head_bytes(head_dim, dtype)] bytes,
// row-major: the vector of (block b, slot s, head h) starts at byte
// ((b * block_size + s) * num_kv_heads + h) * kv_head_bytes(head_dim, dtype).
// For quantized dtypes (runtime/kv_quant.h) key_scales / value_scales hold the
// 4-byte scale records of each vector at
// ((b * num_kv_heads + h) * block_size + s) * kv_head_scale_bytes(head_dim, dtype)
// (kernels::kv_scale_vector: one head's records of a block are contiguous);
// they are null for f32 / f16 / bf16. K and V may use different dtypes.
struct PagedKvLayer {
  void* key = nullptr;
  void* value = nullptr;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType key_dtype = DType::kF32;
  DType value_dtype = DType::kF32;
  void* key_scales = nullptr;
  void* value_scales = nullptr;
  // fp8 only: > 0 quantizes every vector with this per-tensor scale (a
  // checkpoint's calibrated k_scale / v_scale) instead of its own amax / 448.
  // The scale record still holds the scale used, so reading is unchanged.
  float key_fixed_scale = 0.0f;
  float value_fixed_scale = 0.0f;
  // Cross-layer sharing (runtime/cross_layer_share.h); null: off. The pool's
  // vectors are unit directions shared by a group of layers, and share_norms
  // holds per (slot, head) at ((b * block_size + s) * num_kv_heads + h) *
  // 2 * share_record floats a K record then a V record, each share_record
  // floats: the members' norms, then the length of the merged direction sum.
  // This view is member share_member of its group: kv_write merges its K/V
  // into the stored direction, attention reads norm[share_member] x direction.
  float* share_norms = nullptr;
  int32_t share_record = 0;
  int32_t share_member = 0;
  // An MLA latent pool (KvPoolShape::latent): one vector per token in `key`. In
  // fp8 each is a self-contained record of runtime/mla_fp8_layout.h
  // (latent_vector_bytes apart, key_scales null) whose last latent_rope_dim
  // values are the bf16 rope key.
  bool latent = false;
  int32_t latent_rope_dim = 0;
  bool fp8_latent_records() const { return latent && key_dtype == DType::kFP8E4M3; }

  // The pools as f32 (only when the dtype is f32).
  float* key_f32() const { return static_cast<float*>(key); }
  float* value_f32() const { return static_cast<float*>(value); }
};

// One sequence of a batch, as attention sees it. New token i (0-based) sits at
// sequence index num_cached_tokens + i and attends to indices
// [0, num_cached_tokens + i] (causal), restricted to the last `sliding_window`
// of them when the kernel is given a window. Index p lives in block
// block_table[p / block_size] at slot p % block_size.
// Token eviction (runtime/kv_compression.h): one sequence's view in one
// layer. Defaults mean "off" and cost the kernel one branch per (token, head).
struct PagedSequenceEviction {
  // Per KV head h, indices [head_kept[h], compacted_length) are holes: never
  // read, not attended. Null: no holes.
  const int32_t* head_kept = nullptr;
  int32_t compacted_length = 0;
  // New tokens at index >= score_from_index add, per KV head, the attention
  // probability of each index (summed over the head's query heads) to
  // mass[h * mass_stride + index], and the entropy of each query head's
  // distribution (divided by log of the indices it attended, so in [0, 1])
  // to entropy_sum[h], counting each in entropy_count[h]. mass null: no scores.
  float* mass = nullptr;
  int64_t mass_stride = 0;
  double* entropy_sum = nullptr;
  int64_t* entropy_count = nullptr;
  int32_t score_from_index = 0;

  bool is_hole(int32_t index, size_t kv_head) const {
    return head_kept != nullptr && index >= head_kept[kv_head] && index < compacted_length;
  }
};

struct PagedSequence {
  int32_t token_offset = 0;  // row of the first new token in q / out
  int32_t num_new_tokens = 0;
  int32_t num_cached_tokens = 0;
  std::span<const int32_t> block_table;
  PagedSequenceEviction eviction;
};

}  // namespace pagoda::kernels
