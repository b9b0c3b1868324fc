#pragma once
// The shape of a backend's paged KV memory: what a ModelRunner reports as its
// KV geometry and what the engine's KV manager must agree with (block size and
// block count). Per layer, K and V pools of [num_blocks, block_size,
// num_kv_heads, head_dim] elements of key_dtype / value_dtype, plus scale
// records for the quantized dtypes (runtime/kv_quant.h); the bytes are counted
// by runtime/kv_sizing.h, the one copy of that arithmetic.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda {

struct KvPoolShape {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Element types of the K and V pools (runtime/kv_quant.h for the quantized
  // formats and their scale pools).
  DType key_dtype = DType::kF32;
  DType value_dtype = DType::kF32;

  // Elements of one block of one layer's K (or V) pool.
  size_t elements_per_block() const {
    return static_cast<size_t>(block_size) * num_kv_heads * head_dim;
  }
  // Bytes of K plus V for one token over all layers, scales included (kv_sizing.h).
  size_t bytes_per_token() const {
    return static_cast<size_t>(num_layers) * num_kv_heads *
           static_cast<size_t>(kv_vector_bytes(head_dim, key_dtype) + kv_vector_bytes(head_dim, value_dtype));
  }
};

}  // namespace pagoda
