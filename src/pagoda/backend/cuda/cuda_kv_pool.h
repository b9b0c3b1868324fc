#pragma once
// The paged KV cache memory on the GPU: for every layer a K pool and a V pool of
// [num_blocks, block_size, num_kv_heads, head_dim] bf16 (the CpuKvPool layout,
// in bf16), or, for the quantized KV formats (fp8 / int8 / int4, K and V each
// their own), code pools of kv_head_data_bytes per (block, slot, head) vector
// beside scale pools of kv_scale_groups 4-byte records per vector, laid out as
// runtime/kv_quant.h says. All in one allocation; every sub-pool starts on a
// 256-byte boundary. Block id b names the same token range in every layer.
// An MLA latent pool (KvPoolShape::latent: one head of kv_lora_rank +
// qk_rope_head_dim) has the K codes and K scales only; its V segments are empty
// and layer() gives null value pointers. In fp8 its K codes are the
// self-contained records of runtime/mla_fp8_layout.h (FlashMLA's 656 bytes per
// token for 512 + 64, KvPoolShape::latent_vector_bytes) and there is no K scale
// pool (null key_scale).
// Cross-layer sharing (KvPoolShape::cross_layer_share > 1, kv_share_ops.h):
// the pool holds share().num_slots() layers, layer(l) is the view of layer l's
// slot (share().slot_of(l)), and after the slots come the norm records of the
// shared slots, [num_blocks * block_size * num_kv_heads][K, V][K + 1] f32 each
// (CpuKvPool's layout), returned by share(l). Copies and zeroing carry them;
// the host tier (append_block_copies) has no place for them (the runner
// refuses the combination).
// Memory only: which blocks belong to whom is the KV manager's business, handed
// over in ForwardBatch block tables. Copies (copy on write) move the codes and
// scales as they are.
//
// Sizing like vLLM's gpu_memory_utilization: the pool takes what is left of
// utilization * total GPU memory once weights and scratch (already allocated)
// are accounted for, i.e. (free - (1 - utilization) * total).
//
// Thread safety: plain memory; one forward writes it at a time.

#include <cstdint>
#include <memory>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "pagoda/runtime/kv_pool_shape.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/kv_share_ops.h"
#include "pagoda/backend/cuda/kv_host_copy.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::cuda {

struct KvPoolSizing {
  int32_t num_blocks = 0;
  size_t pool_bytes = 0;
  // "KV pool: 30000 blocks x 16 tokens = 480000 tokens, 58.59 GiB K bf16 / V bf16, 131072 bytes per
  // token (gpu_memory_utilization 0.90 of 139.8 GiB; 75.1 GiB free before the pool)".
  std::string report;
};

// floor((free_bytes - (1 - utilization) * total_bytes) / block_bytes), at least 0:
// the pure arithmetic of the sizing below (unit-tested without a GPU).
int64_t kv_pool_blocks_that_fit(size_t free_bytes, size_t total_bytes, double utilization, size_t block_bytes);

// How many blocks fit now (cudaMemGetInfo), counting codes and scales of both
// K and V (KvPoolShape::bytes_per_token). Errors: utilization outside (0, 1],
// or not even one block fits.
StatusOr<KvPoolSizing> size_kv_pool_from_free_memory(const KvPoolShape& shape_without_blocks,
                                                     double gpu_memory_utilization);

class CudaKvPool {
 public:
  // key_dtype / value_dtype: bf16, fp8, int8 or int4 (each on its own);
  // head_dim % 8 == 0. Memory is zeroed (codes and scales).
  static StatusOr<std::unique_ptr<CudaKvPool>> create(const KvPoolShape& shape);

  const KvPoolShape& shape() const { return shape_; }
  size_t total_bytes() const { return memory_.bytes(); }
  DevicePagedKvLayer layer(int32_t layer) const;
  // Layer `layer`'s norm records and place in its group; null norms outside the shared region.
  DeviceKvShare share(int32_t layer) const;
  // Zeroes the norm records of `blocks` in every shared slot on `stream` (nothing when not shared).
  // The caller checks the ids.
  cudaError_t zero_share_norms(std::span<const int32_t> blocks, cudaStream_t stream) const;

  // Copies block src -> dst in every layer, K and V, codes and scales
  // (copy-on-write forks), on `stream`. Errors: ids outside [0, num_blocks).
  Status copy_blocks(std::span<const runtime::BlockCopy> copies, cudaStream_t stream);

  // The contiguous pieces of device block `block` (every layer's K codes, V
  // codes, K scales, V scales, in that order) paired with where each sits in
  // a host chunk laid out as runtime/host_block_layout.h says: appends
  // (destination, source, bytes) for a copy to the host (to_host) or from it.
  // The caller checks the id.
  void append_block_copies(int32_t block, std::byte* host_chunk, bool to_host, std::vector<void*>& dsts,
                           std::vector<const void*>& srcs, std::vector<size_t>& sizes) const;
  // The same layout for the copy kernel (kv_host_copy.h), against a host pool
  // of chunks of host_block_bytes starting at `host`.
  KvHostCopyGeometry host_copy_geometry(std::byte* host, size_t host_block_bytes) const;

 private:
  // One block of one sub-pool of one layer, and where it starts inside a layer.
  struct SubPool {
    size_t block_bytes = 0;
    size_t offset = 0;  // from the layer's start
  };
  explicit CudaKvPool(const KvPoolShape& shape);

  KvPoolShape shape_;
  SubPool key_, value_, key_scale_, value_scale_;  // block_bytes 0: no scale pool (bf16)
  size_t layer_bytes_ = 0;
  int32_t num_slots_ = 0;            // layers' worth of K/V stored (num_layers when not shared)
  size_t norm_block_bytes_ = 0;      // one block's norm records of one shared slot (0: not shared)
  size_t norm_slot_bytes_ = 0;       // one shared slot's norm records, aligned
  DeviceBuffer memory_;  // [num_slots][K codes | V codes | K scales | V scales], [shared slots][norm records]
};

}  // namespace pagoda::cuda
