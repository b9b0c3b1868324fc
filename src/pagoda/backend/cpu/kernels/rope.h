#pragma once
// Rotary position embedding, Hugging Face "rotate half" convention (Llama, Mistral,
// Qwen2, Qwen3): within each head, element i (i < head_dim/2) pairs with element
// i + head_dim/2, rotated by angle position * inv_freq[i].

#include <cstddef>
#include <cstdint>

namespace pagoda::kernels {

// Rotates x in place. x: [num_tokens, num_heads, head_dim] f32 (row stride
// num_heads * head_dim); positions: [num_tokens] absolute positions; inv_freq:
// [head_dim / 2]. head_dim must be even. Parallel over tokens.
void apply_rope(float* x, const int32_t* positions, size_t num_tokens, size_t num_heads,
                size_t head_dim, const float* inv_freq);

}  // namespace pagoda::kernels
