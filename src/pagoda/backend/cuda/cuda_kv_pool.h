#pragma once
// The paged KV cache memory on the GPU: for every layer a K pool and a V pool of
// [num_blocks, block_size, num_kv_heads, head_dim] bf16 (the CpuKvPool layout,
// in bf16), all in one allocation. Block id b names the same token range in
// every layer. Memory only: which blocks belong to whom is the KV manager's
// business, handed over in ForwardBatch block tables.
//
// Sizing like vLLM's gpu_memory_utilization: the pool takes what is left of
// utilization * total GPU memory once weights and scratch (already allocated)
// are accounted for, i.e. (free - (1 - utilization) * total).
//
// Thread safety: plain memory; one forward writes it at a time.

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cpu_kv_pool.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/status.h"
#include "pagoda/kv/kv_types.h"

namespace pagoda::cuda {

struct KvPoolSizing {
  int32_t num_blocks = 0;
  size_t pool_bytes = 0;
  // "KV pool: 30000 blocks x 16 tokens = 480000 tokens, 58.59 GiB bf16 (gpu_memory_utilization 0.90 of
  // 139.8 GiB; 75.1 GiB free before the pool)".
  std::string report;
};

// floor((free_bytes - (1 - utilization) * total_bytes) / block_bytes), at least 0:
// the pure arithmetic of the sizing below (unit-tested without a GPU).
int64_t kv_pool_blocks_that_fit(size_t free_bytes, size_t total_bytes, double utilization, size_t block_bytes);

// How many blocks fit now (cudaMemGetInfo). Errors: utilization outside (0, 1],
// or not even one block fits.
StatusOr<KvPoolSizing> size_kv_pool_from_free_memory(const KvPoolShape& shape_without_blocks,
                                                     double gpu_memory_utilization);

class CudaKvPool {
 public:
  // shape.dtype must be kBF16; head_dim % 8 == 0. Memory is zeroed.
  static StatusOr<std::unique_ptr<CudaKvPool>> create(const KvPoolShape& shape);

  const KvPoolShape& shape() const { return shape_; }
  size_t total_bytes() const { return memory_.bytes(); }
  DevicePagedKvLayer layer(int32_t layer) const;

  // Copies block src -> dst in every layer, K and V (copy-on-write forks), on
  // `stream`. Errors: ids outside [0, num_blocks).
  Status copy_blocks(std::span<const kv::BlockCopy> copies, cudaStream_t stream);

 private:
  explicit CudaKvPool(const KvPoolShape& shape) : shape_(shape) {}
  size_t layer_pool_elements() const { return shape_.elements_per_block() * shape_.num_blocks; }

  KvPoolShape shape_;
  DeviceBuffer memory_;  // [num_layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim]
};

}  // namespace pagoda::cuda
