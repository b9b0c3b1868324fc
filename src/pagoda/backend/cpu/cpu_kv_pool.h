#pragma once
// The KV cache memory of the CPU backend: for every layer, a K pool and a V pool
// of [num_blocks, block_size, num_kv_heads, head_dim] elements of key_dtype /
// value_dtype (f32, f16, bf16, fp8 e4m3, int8, int4), plus for the quantized
// dtypes a scale pool of [num_blocks, num_kv_heads, block_size, groups] 4-byte
// records beside each (layout and arithmetic: runtime/kv_quant.h). An MLA
// model's pool (KvPoolShape::latent) holds only the K side: one latent vector
// per token (num_kv_heads 1), and layer() returns a null value pointer. Block id b
// names the same token range in every layer. This class is memory only: which
// blocks belong to which sequence is the KV manager's business (kv/), handed to
// the model through ForwardBatch block tables.
// Cross-layer sharing (KvPoolShape::cross_layer_share > 1,
// runtime/cross_layer_share.h): the pool holds share().num_slots() layers of
// K/V, layer(l) is the view of l's slot, and each shared slot has a norm store
// beside it (PagedKvLayer::share_norms), copied and zeroed with its block. A
// shared pool has no host-block form (export/import): no host tier with it.
//
// Thread safety: the pool is plain memory. One forward writes it at a time;
// distinct blocks may be read concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/backend/cpu/kernels/paged_kv.h"
#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda {

class CpuKvPool {
 public:
  // Allocates (zeroed) memory for the whole pool. Errors: non-positive sizes,
  // a dtype that is not a KV dtype, or allocation failure.
  static StatusOr<CpuKvPool> create(const KvPoolShape& shape);

  const KvPoolShape& shape() const { return shape_; }
  // Data plus scale bytes of all layers, K and V (= bytes_per_token() * block_size * num_blocks).
  size_t total_bytes() const {
    const runtime::CrossLayerShare share = shape_.share();
    return static_cast<size_t>(share.num_slots()) * shape_.num_blocks *
               (key_.block_data_bytes + key_.block_scale_bytes + value_.block_data_bytes + value_.block_scale_bytes) +
           static_cast<size_t>(share.num_shared_slots()) * shape_.num_blocks * norm_block_floats_ * sizeof(float);
  }

  // The view the kernels take for one layer (0 <= layer < num_layers).
  kernels::PagedKvLayer layer(int32_t layer);

  // Zeroes a block's data and scales in every layer (e.g. before handing it to
  // another tenant); a zeroed block reads back as zeros in every dtype.
  void zero_block(int32_t block);
  // Copies block src's data and scales to block dst in every layer, bytes as
  // they are (copy on write keeps quantized codes exact). 0 <= src, dst < num_blocks.
  void copy_block(int32_t src, int32_t dst);
  // Copies a block out to / in from one contiguous chunk of (not for a shared pool)
  // runtime::host_block_layout(shape()).block_bytes() bytes laid out as that
  // header says (every layer's K codes, V codes, K scales, V scales), bytes as
  // they are. 0 <= block < num_blocks.
  void export_block(int32_t block, std::byte* chunk) const;
  void import_block(int32_t block, const std::byte* chunk);

 private:
  // One of K or V over all layers: data [layers, blocks, block_size, kv_heads, head bytes]
  // and scales [layers, blocks, kv_heads, block_size, scale bytes] (kernels::kv_scale_vector).
  struct Store {
    DType dtype = DType::kF32;
    size_t block_data_bytes = 0;   // one block of one layer
    size_t block_scale_bytes = 0;  // 0 for unquantized dtypes
    std::unique_ptr<std::byte[]> data;
    std::unique_ptr<std::byte[]> scales;  // null for unquantized dtypes
  };

  CpuKvPool(const KvPoolShape& shape, Store key, Store value);
  static Store make_store(const KvPoolShape& shape, DType dtype);
  std::byte* block_data(const Store& store, int32_t layer, int32_t block) const;
  std::byte* block_scales(const Store& store, int32_t layer, int32_t block) const;  // null if unquantized
  // The norm records of a shared slot's block (shared_slot in [0, num_shared_slots)).
  float* block_norms(int32_t shared_slot, int32_t block) const {
    return norms_.get() + (static_cast<size_t>(shared_slot) * shape_.num_blocks + block) * norm_block_floats_;
  }

  KvPoolShape shape_;
  Store key_;
  Store value_;
  size_t norm_block_floats_ = 0;       // block_size * kv_heads * 2 * norm_record
  std::unique_ptr<float[]> norms_;     // [shared slots, blocks, norm_block_floats_]; null when not shared
};

}  // namespace pagoda
