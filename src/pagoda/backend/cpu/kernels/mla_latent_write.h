#pragma once
// Writes new tokens' MLA cache vectors into the paged latent pool: per token one
// vector of layer.head_dim = kv_lora_rank + qk_rope_head_dim floats (the
// normalized latent, then the rotated rope key), stored like a one-head K pool
// (layer.num_kv_heads == 1, layer.key / layer.key_scales; there is no V pool):
// f32 copied, f16 / bf16 rounded to nearest even, int8 / int4 quantized per
// vector in the formats of runtime/kv_quant.h (one scale record per token, int4
// per group of 32), exactly as kv_write stores a K vector; fp8 as one
// self-contained record per token (runtime/mla_fp8_layout.h: FlashMLA's layout,
// a scale per 128 latent values, the rope key in bf16).
//
// src: token t's vector at src + t * src_stride. slots[t] = block * block_size +
// slot-in-block (plan_kv_slots); a negative slot skips the token. The caller has
// checked the slots against the pool.

#include <cstddef>
#include <cstdint>
#include <span>

#include "pagoda/backend/cpu/kernels/paged_kv.h"

namespace pagoda::kernels {

void mla_latent_write(const float* src, size_t src_stride, std::span<const int64_t> slots, const PagedKvLayer& layer);

}  // namespace pagoda::kernels
