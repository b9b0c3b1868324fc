#pragma once
// One 16-byte chunk of a KV vector as bf16, whatever the pool's format: the
// shared read of the builtin attention kernel (paged_attention.cu) and of the
// scratch copy for the prefill over quantized KV (kv_dequantize_blocks.cu), so
// that both see exactly the same values: code x scale + zero in f32, rounded
// once to bf16 (runtime/kv_quant.h's formats). Device code only (.cu files).

#include <cstdint>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/attention/kv_dequant.cuh"

namespace pagoda::cuda {

// Elements [8 c, 8 c + 8) of vector `vec` (kv_quant.h's numbering: (block *
// block_size + slot) * num_kv_heads + head) of a pool in `format`; its scale
// records are record vector `scale_vec` (kernels::kv_scale_vector).
__device__ __forceinline__ uint4 load_kv_chunk_bf16(const void* pool, const void* scales, kernels::KvQuant format,
                                                    int64_t vec, int64_t scale_vec, int32_t head_dim, int32_t c) {
  if (format == kernels::KvQuant::kNone)
    return reinterpret_cast<const uint4*>(static_cast<const bf16*>(pool) + vec * head_dim)[c];
  const uint8_t* data = static_cast<const uint8_t*>(pool) + vec * kernels::kv_head_data_bytes(head_dim, format);
  float f[8];
  kernels::cuda::device::codes8_to_float(data, c * 8, format, f);
  const int32_t groups = kernels::kv_scale_groups(head_dim, format);
  const int32_t group = c * 8 / kernels::kv_scale_group_size(head_dim, format);
  const kernels::cuda::device::KvScale s = kernels::cuda::device::decode_scale_record(
      static_cast<const uint32_t*>(scales)[scale_vec * groups + group], format);
  uint4 out;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int w = 0; w < 4; ++w)
    pairs[w] = __floats2bfloat162_rn(f[2 * w] * s.scale + s.zero, f[2 * w + 1] * s.scale + s.zero);
  return out;
}

}  // namespace pagoda::cuda
