#pragma once
// The KV cache memory of the CPU backend: for every layer, a K pool and a V pool
// of [num_blocks, block_size, num_kv_heads, head_dim] elements. Block id b names
// the same token range in every layer. This class is memory only: which blocks
// belong to which sequence is the KV manager's business (kv/), handed to the
// model through ForwardBatch block tables.
//
// dtype is part of the shape so quantized KV (fp8/int8/int4 + scale pools) can
// come later; today only f32 is accepted.
//
// Thread safety: the pool is plain memory. One forward writes it at a time;
// distinct blocks may be read concurrently.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/kernels/cpu/paged_kv.h"
#include "pagoda/kv/kv_sizing.h"

namespace pagoda {

struct KvPoolShape {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Element types of the K and V pools (kernels/kv_quant.h for the quantized
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

class CpuKvPool {
 public:
  // Allocates (zeroed) memory for the whole pool. Errors: non-positive sizes,
  // unsupported dtype (only f32 today), or allocation failure.
  static StatusOr<CpuKvPool> create(const KvPoolShape& shape);

  const KvPoolShape& shape() const { return shape_; }
  size_t total_bytes() const { return keys_.size() * sizeof(float) * 2; }

  // The view the kernels take for one layer (0 <= layer < num_layers).
  kernels::PagedKvLayer layer(int32_t layer);

  // Zeroes a block in every layer (e.g. before handing it to another tenant).
  void zero_block(int32_t block);

 private:
  explicit CpuKvPool(const KvPoolShape& shape);
  size_t layer_elements() const { return shape_.elements_per_block() * shape_.num_blocks; }

  KvPoolShape shape_;
  std::vector<float> keys_;    // [num_layers, num_blocks, block_size, kv_heads, head_dim]
  std::vector<float> values_;  // same layout
};

}  // namespace pagoda
