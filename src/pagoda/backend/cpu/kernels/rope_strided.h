#pragma once
// Rotary position embedding on part of each head, for layouts where the rotated
// elements are not a whole contiguous head: DeepSeek's MLA rotates only the
// qk_rope_head_dim tail of each query head and the shared rope key that follows
// the latent. Two pairings:
//   kHalves       element i pairs with i + dim/2 (Hugging Face "rotate half")
//   kInterleaved  element 2i pairs with 2i + 1 (DeepSeek-V2, V3 with
//                 rope_interleave); the pair stays in place, so the values equal
//                 transformers' de-interleaved output up to a fixed permutation
//                 that query and key share, which leaves every dot product as is.
// Both rotate by angle position * inv_freq[i] (f32 product, as transformers) with
// cos and sin multiplied by `scale` (yarn's attention factor; 1 otherwise).

#include <cstddef>
#include <cstdint>

namespace pagoda::kernels {

enum class RopePairing { kHalves, kInterleaved };

// For token t and head h rotates dim elements at x + t * row_stride + h * head_stride
// in place. positions: [num_tokens]; inv_freq: [dim / 2]; dim even. Parallel over tokens.
void apply_rope_strided(float* x, const int32_t* positions, size_t num_tokens, size_t row_stride, size_t num_heads,
                        size_t head_stride, size_t dim, const float* inv_freq, RopePairing pairing, float scale);

}  // namespace pagoda::kernels
