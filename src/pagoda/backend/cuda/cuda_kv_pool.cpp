#include "pagoda/backend/cuda/cuda_kv_pool.h"

#include <optional>

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr size_t kSubPoolAlignment = 256;

size_t align_up(size_t bytes) { return (bytes + kSubPoolAlignment - 1) / kSubPoolAlignment * kSubPoolAlignment; }

std::optional<kernels::KvQuant> kv_quant_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return kernels::KvQuant::kNone;
    case DType::kFP8E4M3: return kernels::KvQuant::kFP8E4M3;
    case DType::kInt8: return kernels::KvQuant::kInt8;
    case DType::kInt4: return kernels::KvQuant::kInt4;
    default: return std::nullopt;
  }
}

// Bytes of one (token, head) vector's codes (bf16: the elements) and of its scale records.
size_t vector_data_bytes(int32_t head_dim, kernels::KvQuant q) {
  return q == kernels::KvQuant::kNone ? size_t(head_dim) * 2 : size_t(kernels::kv_head_data_bytes(head_dim, q));
}
size_t vector_scale_bytes(int32_t head_dim, kernels::KvQuant q) {
  return size_t(kernels::kv_scale_groups(head_dim, q)) * sizeof(kernels::KvScaleZero);
}

}  // namespace

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
  const size_t block_bytes = shape.bytes_per_token() * static_cast<size_t>(shape.block_size);  // codes + scales
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
      "KV pool: {} blocks x {} tokens = {} tokens, {:.2f} GiB K {} / V {}, {} bytes per token (gpu_memory_utilization "
      "{:.2f} of {:.1f} GiB; {:.1f} GiB free before the pool)", sizing.num_blocks, shape.block_size,
      static_cast<int64_t>(sizing.num_blocks) * shape.block_size, sizing.pool_bytes / kGiB,
      dtype_name(shape.key_dtype), dtype_name(shape.value_dtype), shape.bytes_per_token(), gpu_memory_utilization,
      total_bytes / kGiB, free_bytes / kGiB);
  return sizing;
}

CudaKvPool::CudaKvPool(const KvPoolShape& shape) : shape_(shape) {
  const auto kq = *kv_quant_of(shape.key_dtype), vq = *kv_quant_of(shape.value_dtype);
  const size_t vectors_per_block = size_t(shape.block_size) * shape.num_kv_heads;
  key_.block_bytes = vectors_per_block * vector_data_bytes(shape.head_dim, kq);
  value_.block_bytes = vectors_per_block * vector_data_bytes(shape.head_dim, vq);
  key_scale_.block_bytes = vectors_per_block * vector_scale_bytes(shape.head_dim, kq);
  value_scale_.block_bytes = vectors_per_block * vector_scale_bytes(shape.head_dim, vq);
  if (shape.latent) value_.block_bytes = value_scale_.block_bytes = 0;  // MLA: the latent (K) sub-pool only
  if (shape.latent && shape.key_dtype == DType::kFP8E4M3) {  // runtime/mla_fp8_layout.h's records, no scale pool
    key_.block_bytes = vectors_per_block * shape.latent_vector_bytes();
    key_scale_.block_bytes = 0;
  }
  size_t offset = 0;
  for (SubPool* sub : {&key_, &value_, &key_scale_, &value_scale_}) {
    sub->offset = offset;
    offset += align_up(sub->block_bytes * shape.num_blocks);
  }
  layer_bytes_ = offset;
  const runtime::CrossLayerShare share = shape.share();
  num_slots_ = share.num_slots();
  if (share.enabled()) {
    norm_block_bytes_ = vectors_per_block * 2 * static_cast<size_t>(share.norm_record()) * sizeof(float);
    norm_slot_bytes_ = align_up(norm_block_bytes_ * shape.num_blocks);
  }
}

StatusOr<std::unique_ptr<CudaKvPool>> CudaKvPool::create(const KvPoolShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 || shape.num_kv_heads <= 0 ||
      shape.head_dim <= 0 || shape.head_dim % 8 != 0 || (shape.latent && shape.num_kv_heads != 1)) {
    return invalid_argument_error(
        "CUDA KV pool shape: layers={} blocks={} block_size={} kv_heads={} head_dim={} (all > 0, head_dim a "
        "multiple of 8, one head for a latent pool)", shape.num_layers, shape.num_blocks, shape.block_size,
        shape.num_kv_heads, shape.head_dim);
  }
  if (shape.cross_layer_share != 1) {
    PAGODA_RETURN_IF_ERROR(
        runtime::validate_cross_layer_share(shape.cross_layer_share, shape.num_layers, "--kv-cross-layer-share"));
    if (shape.latent)
      return invalid_argument_error("--kv-cross-layer-share {}: not for an MLA latent pool", shape.cross_layer_share);
  }
  if (shape.latent && (shape.latent_rope_dim < 0 || shape.latent_rope_dim >= shape.head_dim ||
                       (shape.key_dtype == DType::kFP8E4M3 && (shape.head_dim - shape.latent_rope_dim) % 8 != 0))) {
    return invalid_argument_error(
        "CUDA MLA latent pool: latent_rope_dim {} must be in [0, head_dim {}), and an fp8 pool's latent "
        "(head_dim - latent_rope_dim) a multiple of 8", shape.latent_rope_dim, shape.head_dim);
  }
  if (shape.latent_pages != runtime::MlaLatentPages::kTokenMajor) {
    if (!shape.latent || !runtime::mla_swizzled_pages_apply(shape.head_dim, shape.key_dtype == DType::kBF16,
                                                            shape.block_size))
      return invalid_argument_error(
          "CUDA KV pool: {} pages need a bf16 MLA latent pool with head_dim a multiple of 64 and block_size a "
          "multiple of 8 (got {}{} head_dim={} block_size={})", runtime::mla_latent_pages_name(shape.latent_pages),
          shape.latent ? "" : "a K/V pool, ", dtype_name(shape.key_dtype), shape.head_dim, shape.block_size);
  }
  for (DType dtype : {shape.key_dtype, shape.value_dtype}) {
    if (!kv_quant_of(dtype))
      return unimplemented_error("CUDA KV pool dtype {}: bf16, fp8, int8 or int4", dtype_name(dtype));
  }
  std::unique_ptr<CudaKvPool> pool(new CudaKvPool(shape));
  const size_t bytes = pool->layer_bytes_ * static_cast<size_t>(pool->num_slots_) +
                       pool->norm_slot_bytes_ * static_cast<size_t>(shape.share().num_shared_slots());
  PAGODA_ASSIGN_OR_RETURN(pool->memory_, DeviceBuffer::allocate(bytes));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(pool->memory_.data(), 0, bytes));
  // The forward runs on a non-blocking stream, which does not wait for the legacy stream's memset.
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return pool;
}

DevicePagedKvLayer CudaKvPool::layer(int32_t layer) const {
  char* base = memory_.as<char>() + static_cast<size_t>(shape_.share().slot_of(layer)) * layer_bytes_;
  auto at = [&](const SubPool& sub) -> void* { return sub.block_bytes > 0 ? base + sub.offset : nullptr; };
  return DevicePagedKvLayer{at(key_),
                            at(value_),
                            shape_.num_blocks,
                            shape_.block_size,
                            shape_.num_kv_heads,
                            shape_.head_dim,
                            *kv_quant_of(shape_.key_dtype),
                            *kv_quant_of(shape_.value_dtype),
                            at(key_scale_),
                            at(value_scale_),
                            shape_.latent_pages};
}

DeviceKvShare CudaKvPool::share(int32_t layer) const {
  const runtime::CrossLayerShare s = shape_.share();
  if (norm_block_bytes_ == 0 || s.member_of(layer) < 0) return DeviceKvShare{};
  char* norms = memory_.as<char>() + static_cast<size_t>(num_slots_) * layer_bytes_ +
                static_cast<size_t>(s.slot_of(layer) - s.first_shared()) * norm_slot_bytes_;
  return DeviceKvShare{reinterpret_cast<float*>(norms), s.norm_record(), s.member_of(layer)};
}

cudaError_t CudaKvPool::zero_share_norms(std::span<const int32_t> blocks, cudaStream_t stream) const {
  const int32_t shared_slots = shape_.share().num_shared_slots();
  if (norm_block_bytes_ == 0) return cudaSuccess;
  char* norms = memory_.as<char>() + static_cast<size_t>(num_slots_) * layer_bytes_;
  for (int32_t s = 0; s < shared_slots; ++s) {
    for (int32_t b : blocks) {
      const cudaError_t err = cudaMemsetAsync(
          norms + static_cast<size_t>(s) * norm_slot_bytes_ + static_cast<size_t>(b) * norm_block_bytes_, 0,
          norm_block_bytes_, stream);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

Status CudaKvPool::copy_blocks(std::span<const runtime::BlockCopy> copies, cudaStream_t stream) {
  for (const runtime::BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= shape_.num_blocks || c.dst < 0 || c.dst >= shape_.num_blocks)
      return invalid_argument_error("block copy {} -> {}: ids must be in [0, {})", c.src, c.dst, shape_.num_blocks);
  }
  for (int32_t l = 0; l < num_slots_; ++l) {
    char* base = memory_.as<char>() + static_cast<size_t>(l) * layer_bytes_;
    for (const runtime::BlockCopy& c : copies) {
      for (const SubPool* sub : {&key_, &value_, &key_scale_, &value_scale_}) {
        if (sub->block_bytes == 0) continue;
        char* pool = base + sub->offset;
        PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pool + c.dst * sub->block_bytes, pool + c.src * sub->block_bytes,
                                                    sub->block_bytes, cudaMemcpyDeviceToDevice, stream));
      }
    }
  }
  char* norms = memory_.as<char>() + static_cast<size_t>(num_slots_) * layer_bytes_;
  for (int32_t s = 0; norm_block_bytes_ > 0 && s < shape_.share().num_shared_slots(); ++s) {
    char* pool = norms + static_cast<size_t>(s) * norm_slot_bytes_;
    for (const runtime::BlockCopy& c : copies)
      PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pool + c.dst * norm_block_bytes_, pool + c.src * norm_block_bytes_,
                                                  norm_block_bytes_, cudaMemcpyDeviceToDevice, stream));
  }
  return ok_status();
}

void CudaKvPool::append_block_copies(int32_t block, std::byte* host_chunk, bool to_host, std::vector<void*>& dsts,
                                     std::vector<const void*>& srcs, std::vector<size_t>& sizes) const {
  std::byte* host = host_chunk;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    char* base = memory_.as<char>() + static_cast<size_t>(l) * layer_bytes_;
    for (const SubPool* sub : {&key_, &value_, &key_scale_, &value_scale_}) {
      if (sub->block_bytes == 0) continue;
      char* device = base + sub->offset + static_cast<size_t>(block) * sub->block_bytes;
      dsts.push_back(to_host ? static_cast<void*>(host) : static_cast<void*>(device));
      srcs.push_back(to_host ? static_cast<const void*>(device) : static_cast<const void*>(host));
      sizes.push_back(sub->block_bytes);
      host += sub->block_bytes;
    }
  }
}

KvHostCopyGeometry CudaKvPool::host_copy_geometry(std::byte* host, size_t host_block_bytes) const {
  KvHostCopyGeometry g;
  g.device = memory_.as<char>();
  g.host = reinterpret_cast<char*>(host);
  g.layer_bytes = layer_bytes_;
  g.host_block_bytes = host_block_bytes;
  const SubPool* subs[4] = {&key_, &value_, &key_scale_, &value_scale_};
  for (int s = 0; s < 4; ++s) {
    g.segment_offset[s] = subs[s]->offset;
    g.segment_bytes[s] = subs[s]->block_bytes;
  }
  g.num_layers = num_slots_;  // the slots stored (the zeroer's geometry; the host tier is not used with sharing)
  return g;
}

}  // namespace pagoda::cuda
