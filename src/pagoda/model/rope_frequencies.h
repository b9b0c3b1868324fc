#pragma once
// RoPE frequencies from config.json's rope settings: the model's math, shared by
// every backend (the CPU and CUDA rope kernels take the table this returns).

#include <cstdint>
#include <vector>

namespace pagoda {

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

}  // namespace pagoda
