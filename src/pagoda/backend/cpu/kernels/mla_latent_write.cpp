#include "pagoda/backend/cpu/kernels/mla_latent_write.h"

#include <cassert>
#include <cstring>

#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda::kernels {

void mla_latent_write(const float* src, size_t src_stride, std::span<const int64_t> slots, const PagedKvLayer& layer) {
  assert(layer.num_kv_heads == 1);
  if (layer.fp8_latent_records()) {  // self-contained records, no scale pool
    const int32_t rope = layer.latent_rope_dim, latent = layer.head_dim - rope;
    const size_t record_bytes = static_cast<size_t>(mla_fp8_record_bytes(latent, rope));
    auto* records = static_cast<uint8_t*>(layer.key);
    for (size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      mla_fp8_quantize(src + t * src_stride, latent, rope, records + static_cast<size_t>(slots[t]) * record_bytes);
    }
    return;
  }
  const size_t data_bytes = kv_head_bytes(layer.head_dim, layer.key_dtype);
  const size_t scale_bytes = kv_head_scale_bytes(layer.head_dim, layer.key_dtype);
  auto* data = static_cast<std::byte*>(layer.key);
  auto* scales = static_cast<std::byte*>(layer.key_scales);
  for (size_t t = 0; t < slots.size(); ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const float* x = src + t * src_stride;
    std::byte* out = data + static_cast<size_t>(slot) * data_bytes;
    if (layer.key_dtype == DType::kF32) {
      std::memcpy(out, x, data_bytes);
      continue;
    }
    void* record = scales != nullptr
                       ? scales + kv_scale_vector(slot, 0, layer.block_size, 1) * static_cast<int64_t>(scale_bytes)
                       : nullptr;
    quantize_kv_vector(x, layer.head_dim, layer.key_dtype, out, record);
  }
}

}  // namespace pagoda::kernels
