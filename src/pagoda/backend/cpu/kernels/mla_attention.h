#pragma once
// Multi-head latent attention over the paged latent pool, in the absorbed form:
// every query head attends to the same cached vectors [c, kr] (MQA with K dim
// kv_lora_rank + qk_rope_head_dim and V = c, the first kv_lora_rank elements), so
// a cached token is read once for all heads and never decompressed. With the
// query absorbed (q_h = [W_UK_h^T q_nope_h, q_pe_h]) this equals DeepSeek's
// decompressed attention: q_nope_h . (W_UK_h c) = (W_UK_h^T q_nope_h) . c, and the
// output o_h = sum_p softmax_p c_p is expanded by the caller (W_UV_h o_h).
// This is the CPU reference of the GPU's MLA decode kernel.
//
// Shapes: q [num_tokens, num_heads, layer.head_dim], out [num_tokens, num_heads,
// kv_lora_rank], f32, rows in batch order. layer: a latent pool (num_kv_heads 1,
// head_dim = kv_lora_rank + rope; key / key_scales hold it). New token i of a
// sequence attends to indices [0, num_cached_tokens + i] (causal) through the
// block table. Softmax is exact (max-subtracted) in f32 with `scale` on q . k.
// Quantized or 16-bit pools are read one vector at a time, dequantized
// (kv_quantize.h): the result is attention over the dequantized values. The new
// tokens' vectors must already be in the pool (mla_latent_write).
// Parallel over (token, group of heads) on ThreadPool::global(); call from one
// thread at a time.

#include <cstddef>
#include <cstdint>
#include <span>

#include "pagoda/backend/cpu/kernels/paged_kv.h"

namespace pagoda::kernels {

struct MlaAttentionParams {
  int32_t num_heads = 0;
  int32_t kv_lora_rank = 0;  // the V part: the first kv_lora_rank elements of a cached vector
  float scale = 1.0f;        // softmax scale (1 / sqrt(qk_head_dim), times yarn's mscale^2)
};

void mla_paged_attention(const float* q, const PagedKvLayer& layer, std::span<const PagedSequence> sequences,
                         const MlaAttentionParams& params, float* out);

}  // namespace pagoda::kernels
