#include "pagoda/backend/cpu_kv_pool.h"

#include <algorithm>
#include <cassert>
#include <new>

namespace pagoda {

StatusOr<CpuKvPool> CpuKvPool::create(const KvPoolShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return invalid_argument_error(
        "KV pool shape must be positive: layers={} blocks={} block_size={} kv_heads={} head_dim={}",
        shape.num_layers, shape.num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim);
  }
  if (shape.key_dtype != DType::kF32 || shape.value_dtype != DType::kF32) {
    return unimplemented_error("CPU KV pool supports dtype f32 only (got {})",
                               dtype_name(shape.key_dtype));
  }
  try {
    return CpuKvPool(shape);
  } catch (const std::bad_alloc&) {
    return resource_exhausted_error("cannot allocate a CPU KV pool of {} blocks x {} tokens ({} MiB)",
                                    shape.num_blocks, shape.block_size,
                                    shape.bytes_per_token() * shape.block_size * shape.num_blocks >> 20);
  }
}

CpuKvPool::CpuKvPool(const KvPoolShape& shape)
    : shape_(shape),
      keys_(layer_elements() * shape.num_layers, 0.0f),
      values_(layer_elements() * shape.num_layers, 0.0f) {}

kernels::PagedKvLayer CpuKvPool::layer(int32_t layer) {
  assert(layer >= 0 && layer < shape_.num_layers);
  const size_t offset = static_cast<size_t>(layer) * layer_elements();
  return kernels::PagedKvLayer{keys_.data() + offset, values_.data() + offset, shape_.num_blocks,
                               shape_.block_size, shape_.num_kv_heads, shape_.head_dim};
}

void CpuKvPool::zero_block(int32_t block) {
  assert(block >= 0 && block < shape_.num_blocks);
  const size_t n = shape_.elements_per_block();
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    const size_t offset = static_cast<size_t>(l) * layer_elements() + block * n;
    std::fill_n(keys_.data() + offset, n, 0.0f);
    std::fill_n(values_.data() + offset, n, 0.0f);
  }
}

}  // namespace pagoda
