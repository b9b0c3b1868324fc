#include "pagoda/backend/cpu/cpu_kv_pool.h"

#include <cassert>
#include <cstring>
#include <new>

namespace pagoda {

namespace {

bool is_kv_dtype(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kFP8E4M3:
    case DType::kInt8:
    case DType::kInt4: return true;
  }
  return false;
}

std::unique_ptr<std::byte[]> zeroed_bytes(size_t n) {
  if (n == 0) return nullptr;
  return std::unique_ptr<std::byte[]>(new std::byte[n]());
}

}  // namespace

CpuKvPool::Store CpuKvPool::make_store(const KvPoolShape& shape, DType dtype) {
  Store s;
  s.dtype = dtype;
  const size_t vectors_per_block = static_cast<size_t>(shape.block_size) * shape.num_kv_heads;
  if (shape.latent && dtype == DType::kFP8E4M3) {  // self-contained records (runtime/mla_fp8_layout.h)
    s.block_data_bytes = vectors_per_block * shape.latent_vector_bytes();
  } else {
    s.block_data_bytes = vectors_per_block * kernels::kv_head_bytes(shape.head_dim, dtype);
    s.block_scale_bytes = vectors_per_block * kernels::kv_head_scale_bytes(shape.head_dim, dtype);
  }
  const size_t blocks = static_cast<size_t>(shape.share().num_slots()) * shape.num_blocks;
  s.data = zeroed_bytes(blocks * s.block_data_bytes);
  s.scales = zeroed_bytes(blocks * s.block_scale_bytes);
  return s;
}

StatusOr<CpuKvPool> CpuKvPool::create(const KvPoolShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return invalid_argument_error(
        "KV pool shape must be positive: layers={} blocks={} block_size={} kv_heads={} head_dim={}",
        shape.num_layers, shape.num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim);
  }
  if (!is_kv_dtype(shape.key_dtype) || !is_kv_dtype(shape.value_dtype)) {
    return invalid_argument_error("KV pool dtypes must be f32, f16, bf16, fp8, int8 or int4 (got K {}, V {})",
                                  static_cast<int>(shape.key_dtype), static_cast<int>(shape.value_dtype));
  }
  if (shape.latent && (shape.num_kv_heads != 1 || shape.value_dtype != shape.key_dtype)) {
    return invalid_argument_error(
        "an MLA latent pool caches one vector per token in one dtype: kv_heads must be 1 (got {}) and the V dtype "
        "must be the K dtype (got K {}, V {})", shape.num_kv_heads, dtype_name(shape.key_dtype),
        dtype_name(shape.value_dtype));
  }
  if (shape.latent && (shape.latent_rope_dim < 0 || shape.latent_rope_dim >= shape.head_dim))
    return invalid_argument_error("MLA latent pool: latent_rope_dim {} must be in [0, head_dim {})",
                                  shape.latent_rope_dim, shape.head_dim);
  if (shape.latent_pages != runtime::MlaLatentPages::kTokenMajor)
    return invalid_argument_error("CPU KV pool: {} latent pages are a GPU layout; the CPU's pools are token-major",
                                  runtime::mla_latent_pages_name(shape.latent_pages));
  if (shape.cross_layer_share < 1 || (shape.cross_layer_share > 1 && shape.latent))
    return invalid_argument_error("cross-layer KV sharing {}: must be >= 1 and not on an MLA latent pool",
                                  shape.cross_layer_share);
  try {
    Store key = make_store(shape, shape.key_dtype);
    Store value;  // an MLA latent pool has no V: an empty store
    value.dtype = shape.value_dtype;
    if (!shape.latent) value = make_store(shape, shape.value_dtype);
    return CpuKvPool(shape, std::move(key), std::move(value));
  } catch (const std::bad_alloc&) {
    return resource_exhausted_error("cannot allocate a CPU KV pool of {} blocks x {} tokens ({} MiB)",
                                    shape.num_blocks, shape.block_size,
                                    shape.bytes_per_token() * shape.block_size * shape.num_blocks >> 20);
  }
}

CpuKvPool::CpuKvPool(const KvPoolShape& shape, Store key, Store value)
    : shape_(shape), key_(std::move(key)), value_(std::move(value)) {
  const runtime::CrossLayerShare share = shape_.share();
  if (share.num_shared_slots() == 0) return;
  norm_block_floats_ = static_cast<size_t>(shape_.block_size) * shape_.num_kv_heads * 2 * share.norm_record();
  const size_t n = static_cast<size_t>(share.num_shared_slots()) * shape_.num_blocks * norm_block_floats_;
  norms_ = std::unique_ptr<float[]>(new float[n]());
}

std::byte* CpuKvPool::block_data(const Store& store, int32_t layer, int32_t block) const {
  return store.data.get() + (static_cast<size_t>(layer) * shape_.num_blocks + block) * store.block_data_bytes;
}

std::byte* CpuKvPool::block_scales(const Store& store, int32_t layer, int32_t block) const {
  if (!store.scales) return nullptr;
  return store.scales.get() + (static_cast<size_t>(layer) * shape_.num_blocks + block) * store.block_scale_bytes;
}

kernels::PagedKvLayer CpuKvPool::layer(int32_t model_layer) {
  assert(model_layer >= 0 && model_layer < shape_.num_layers);
  const runtime::CrossLayerShare share = shape_.share();
  const int32_t layer = share.slot_of(model_layer);
  kernels::PagedKvLayer view;
  if (norms_ && share.member_of(model_layer) >= 0) {
    view.share_norms = block_norms(layer - share.first_shared(), 0);
    view.share_record = share.norm_record();
    view.share_member = share.member_of(model_layer);
  }
  view.key = block_data(key_, layer, 0);
  view.value = value_.data ? block_data(value_, layer, 0) : nullptr;
  view.num_blocks = shape_.num_blocks;
  view.block_size = shape_.block_size;
  view.num_kv_heads = shape_.num_kv_heads;
  view.head_dim = shape_.head_dim;
  view.key_dtype = shape_.key_dtype;
  view.value_dtype = shape_.value_dtype;
  view.key_scales = block_scales(key_, layer, 0);
  view.latent = shape_.latent;
  view.latent_rope_dim = shape_.latent_rope_dim;
  view.value_scales = block_scales(value_, layer, 0);
  return view;
}

void CpuKvPool::zero_block(int32_t block) {
  assert(block >= 0 && block < shape_.num_blocks);
  const runtime::CrossLayerShare share = shape_.share();
  for (int32_t l = 0; l < share.num_shared_slots(); ++l)
    std::memset(block_norms(l, block), 0, norm_block_floats_ * sizeof(float));
  for (int32_t l = 0; l < share.num_slots(); ++l) {
    for (const Store* s : {&key_, &value_}) {
      if (!s->data) continue;  // the V store of an MLA latent pool
      std::memset(block_data(*s, l, block), 0, s->block_data_bytes);
      if (s->scales) std::memset(block_scales(*s, l, block), 0, s->block_scale_bytes);
    }
  }
}

void CpuKvPool::copy_block(int32_t src, int32_t dst) {
  assert(src >= 0 && src < shape_.num_blocks && dst >= 0 && dst < shape_.num_blocks);
  if (src == dst) return;
  const runtime::CrossLayerShare share = shape_.share();
  for (int32_t l = 0; l < share.num_shared_slots(); ++l)
    std::memcpy(block_norms(l, dst), block_norms(l, src), norm_block_floats_ * sizeof(float));
  for (int32_t l = 0; l < share.num_slots(); ++l) {
    for (const Store* s : {&key_, &value_}) {
      if (!s->data) continue;  // the V store of an MLA latent pool
      std::memcpy(block_data(*s, l, dst), block_data(*s, l, src), s->block_data_bytes);
      if (s->scales) std::memcpy(block_scales(*s, l, dst), block_scales(*s, l, src), s->block_scale_bytes);
    }
  }
}

void CpuKvPool::export_block(int32_t block, std::byte* chunk) const {
  assert(block >= 0 && block < shape_.num_blocks);
  assert(!norms_);  // a shared pool has no host-block form (the runner refuses a host tier)
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    // The host block layout's order: K codes, V codes, K scales, V scales (an MLA pool has no V).
    for (const Store* s : {&key_, &value_}) {
      if (!s->data) continue;
      std::memcpy(chunk, block_data(*s, l, block), s->block_data_bytes);
      chunk += s->block_data_bytes;
    }
    for (const Store* s : {&key_, &value_}) {
      if (!s->data || !s->scales) continue;
      std::memcpy(chunk, block_scales(*s, l, block), s->block_scale_bytes);
      chunk += s->block_scale_bytes;
    }
  }
}

void CpuKvPool::import_block(int32_t block, const std::byte* chunk) {
  assert(block >= 0 && block < shape_.num_blocks);
  assert(!norms_);
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    for (const Store* s : {&key_, &value_}) {
      if (!s->data) continue;
      std::memcpy(block_data(*s, l, block), chunk, s->block_data_bytes);
      chunk += s->block_data_bytes;
    }
    for (const Store* s : {&key_, &value_}) {
      if (!s->data || !s->scales) continue;
      std::memcpy(block_scales(*s, l, block), chunk, s->block_scale_bytes);
      chunk += s->block_scale_bytes;
    }
  }
}

}  // namespace pagoda
