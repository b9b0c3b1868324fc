#pragma once
// Rotary position embedding, Hugging Face "rotate half" convention (Llama, Mistral,
// Qwen2, Qwen3): within each head, element i (i < head_dim/2) pairs with element
// i + head_dim/2, rotated by angle position * inv_freq[i].

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pagoda::kernels {

// Llama 3.x frequency scaling ("rope_type": "llama3" in config.json).
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_max_position_embeddings = 8192;
};

// inv_freq[i] = theta^(-2i / head_dim) for i in [0, head_dim/2), computed in f32
// like transformers. With `llama3` set, long wavelengths are divided by `factor`
// and the band between low and high frequency is interpolated smoothly.
std::vector<float> rope_inverse_frequencies(int32_t head_dim, float theta,
                                            const Llama3RopeScaling* llama3 = nullptr);

// Rotates x in place. x: [num_tokens, num_heads, head_dim] f32 (row stride
// num_heads * head_dim); positions: [num_tokens] absolute positions; inv_freq:
// [head_dim / 2]. head_dim must be even. Parallel over tokens.
void apply_rope(float* x, const int32_t* positions, size_t num_tokens, size_t num_heads,
                size_t head_dim, const float* inv_freq);

}  // namespace pagoda::kernels
