#pragma once
// Plain descriptors the paged-KV kernels take (plan on the host, then run).
// They hold no ownership; the KV pool (backend/) and the block tables
// (ForwardBatch) outlive the kernel call.

#include <cstddef>
#include <cstdint>
#include <span>

namespace pagoda::kernels {

// One layer of the paged KV pool, f32. key and value are each
// [num_blocks, block_size, num_kv_heads, head_dim], row-major: the vector of
// (block b, slot s, head h) starts at ((b * block_size + s) * num_kv_heads + h) * head_dim.
struct PagedKvLayer {
  float* key = nullptr;
  float* value = nullptr;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// One sequence of a batch, as attention sees it. New token i (0-based) sits at
// sequence index num_cached_tokens + i and attends to indices
// [0, num_cached_tokens + i] (causal), restricted to the last `sliding_window`
// of them when the kernel is given a window. Index p lives in block
// block_table[p / block_size] at slot p % block_size.
struct PagedSequence {
  int32_t token_offset = 0;  // row of the first new token in q / out
  int32_t num_new_tokens = 0;
  int32_t num_cached_tokens = 0;
  std::span<const int32_t> block_table;
};

}  // namespace pagoda::kernels
