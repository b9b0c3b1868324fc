#include "pagoda/backend/cuda/cuda_kv_pool.h"

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

int64_t kv_pool_blocks_that_fit(size_t free_bytes, size_t total_bytes, double utilization, size_t block_bytes) {
  if (block_bytes == 0) return 0;
  const double keep_free = (1.0 - utilization) * static_cast<double>(total_bytes);
  const double usable = static_cast<double>(free_bytes) - keep_free;
  return usable > 0 ? static_cast<int64_t>(usable / static_cast<double>(block_bytes)) : 0;
}

StatusOr<KvPoolSizing> size_kv_pool_from_free_memory(const KvPoolShape& shape, double gpu_memory_utilization) {
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
    return invalid_argument_error("gpu_memory_utilization {} must be in (0, 1]", gpu_memory_utilization);
  size_t free_bytes = 0, total_bytes = 0;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t block_bytes = 2ull * shape.num_layers * shape.elements_per_block() * 2;  // K + V, bf16
  const int64_t blocks = kv_pool_blocks_that_fit(free_bytes, total_bytes, gpu_memory_utilization, block_bytes);
  const double usable = static_cast<double>(free_bytes) - (1.0 - gpu_memory_utilization) * total_bytes;
  if (blocks < 1) {
    return resource_exhausted_error(
        "no room for a KV pool: {:.2f} GiB free of {:.2f} GiB with gpu_memory_utilization {:.2f} leaves {:.2f} GiB, "
        "one block of {} tokens needs {} bytes", free_bytes / kGiB, total_bytes / kGiB, gpu_memory_utilization,
        usable / kGiB, shape.block_size, block_bytes);
  }
  KvPoolSizing sizing;
  sizing.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  sizing.pool_bytes = static_cast<size_t>(sizing.num_blocks) * block_bytes;
  sizing.report = fmt::format(
      "KV pool: {} blocks x {} tokens = {} tokens, {:.2f} GiB bf16 (gpu_memory_utilization {:.2f} of {:.1f} GiB; "
      "{:.1f} GiB free before the pool)", sizing.num_blocks, shape.block_size,
      static_cast<int64_t>(sizing.num_blocks) * shape.block_size, sizing.pool_bytes / kGiB, gpu_memory_utilization,
      total_bytes / kGiB, free_bytes / kGiB);
  return sizing;
}

StatusOr<std::unique_ptr<CudaKvPool>> CudaKvPool::create(const KvPoolShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 || shape.num_kv_heads <= 0 ||
      shape.head_dim <= 0 || shape.head_dim % 8 != 0) {
    return invalid_argument_error(
        "CUDA KV pool shape: layers={} blocks={} block_size={} kv_heads={} head_dim={} (all > 0, head_dim a "
        "multiple of 8)", shape.num_layers, shape.num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim);
  }
  if (shape.key_dtype != DType::kBF16 || shape.value_dtype != DType::kBF16)
    return unimplemented_error("CUDA KV pool dtype {}: only bf16 today", dtype_name(shape.key_dtype));
  std::unique_ptr<CudaKvPool> pool(new CudaKvPool(shape));
  const size_t bytes = 2ull * shape.num_layers * pool->layer_pool_elements() * 2;
  PAGODA_ASSIGN_OR_RETURN(pool->memory_, DeviceBuffer::allocate(bytes));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(pool->memory_.data(), 0, bytes));
  // The forward runs on a non-blocking stream, which does not wait for the legacy stream's memset.
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return pool;
}

DevicePagedKvLayer CudaKvPool::layer(int32_t layer) const {
  bf16* base = memory_.as<bf16>() + static_cast<size_t>(layer) * 2 * layer_pool_elements();
  return DevicePagedKvLayer{base, base + layer_pool_elements(), shape_.num_blocks, shape_.block_size,
                            shape_.num_kv_heads, shape_.head_dim};
}

Status CudaKvPool::copy_blocks(std::span<const kv::BlockCopy> copies, cudaStream_t stream) {
  for (const kv::BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= shape_.num_blocks || c.dst < 0 || c.dst >= shape_.num_blocks)
      return invalid_argument_error("block copy {} -> {}: ids must be in [0, {})", c.src, c.dst, shape_.num_blocks);
  }
  const size_t block_bytes = shape_.elements_per_block() * 2;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    const DevicePagedKvLayer kv = layer(l);
    for (const kv::BlockCopy& c : copies) {
      for (bf16* pool : {kv.key, kv.value}) {
        PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pool + c.dst * shape_.elements_per_block(),
                                                    pool + c.src * shape_.elements_per_block(), block_bytes,
                                                    cudaMemcpyDeviceToDevice, stream));
      }
    }
  }
  return ok_status();
}

}  // namespace pagoda::cuda
