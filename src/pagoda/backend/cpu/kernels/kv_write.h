#pragma once
// Writes new tokens' K and V into the paged pool (vLLM's reshape_and_cache),
// converting to the pool's K and V dtypes on the way: f32 is copied, f16 / bf16
// are rounded to nearest even, fp8 / int8 / int4 are quantized per (token, head)
// (int4 per group of 32) with their scale records written beside them
// (runtime/kv_quant.h, backend/cpu/kernels/kv_quantize.h).
// k, v: [num_tokens, num_kv_heads, head_dim] f32. slots[t] = block * block_size +
// slot-in-block for token t, from plan_kv_slots; a negative slot skips the token.
// A view with share_norms (cross-layer sharing, paged_kv.h) merges each vector's
// direction into the slot's stored one and records its norm; the fp8 fixed
// scale is not used then (directions are unit vectors, not the calibrated range).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/backend/cpu/kernels/paged_kv.h"

namespace pagoda::kernels {

// The flat slot of every new token of every sequence, in token order (rows of
// q/k/v). Computed once per batch and reused by every layer. Block tables must
// already cover num_cached_tokens + num_new_tokens positions (checked by the caller).
std::vector<int64_t> plan_kv_slots(std::span<const PagedSequence> sequences, int32_t block_size,
                                   size_t num_tokens);

void kv_write(const float* k, const float* v, std::span<const int64_t> slots,
              const PagedKvLayer& layer);

}  // namespace pagoda::kernels
