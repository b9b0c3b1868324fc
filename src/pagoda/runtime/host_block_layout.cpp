#include "pagoda/runtime/host_block_layout.h"

#include "pagoda/runtime/kv_quant.h"

namespace pagoda::runtime {
namespace {

// Bytes of one (token, head) vector's codes and of its scale records.
size_t code_bytes(int32_t head_dim, DType dtype) {
  switch (dtype) {
    case DType::kF32: return static_cast<size_t>(head_dim) * 4;
    case DType::kF16:
    case DType::kBF16: return static_cast<size_t>(head_dim) * 2;
    case DType::kInt4: return static_cast<size_t>(kernels::kv_head_data_bytes(head_dim, kernels::KvQuant::kInt4));
    default: return static_cast<size_t>(head_dim);  // fp8, int8: one byte per element
  }
}

size_t scale_bytes(int32_t head_dim, DType dtype) {
  kernels::KvQuant q = kernels::KvQuant::kNone;
  if (dtype == DType::kFP8E4M3) q = kernels::KvQuant::kFP8E4M3;
  if (dtype == DType::kInt8) q = kernels::KvQuant::kInt8;
  if (dtype == DType::kInt4) q = kernels::KvQuant::kInt4;
  return static_cast<size_t>(kernels::kv_scale_groups(head_dim, q)) * sizeof(kernels::KvScaleZero);
}

}  // namespace

HostBlockLayout host_block_layout(const KvPoolShape& shape) {
  const size_t vectors = static_cast<size_t>(shape.block_size) * static_cast<size_t>(shape.num_kv_heads);
  HostBlockLayout layout;
  layout.num_layers = shape.num_layers;
  if (shape.latent && shape.key_dtype == DType::kFP8E4M3) {
    layout.segment_bytes[kKeyCodes] = vectors * shape.latent_vector_bytes();  // records hold their scales
  } else {
    layout.segment_bytes[kKeyCodes] = vectors * code_bytes(shape.head_dim, shape.key_dtype);
    layout.segment_bytes[kKeyScales] = vectors * scale_bytes(shape.head_dim, shape.key_dtype);
  }
  if (!shape.latent) {  // an MLA latent pool has no V
    layout.segment_bytes[kValueCodes] = vectors * code_bytes(shape.head_dim, shape.value_dtype);
    layout.segment_bytes[kValueScales] = vectors * scale_bytes(shape.head_dim, shape.value_dtype);
  }
  return layout;
}

}  // namespace pagoda::runtime
