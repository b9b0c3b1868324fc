#include "pagoda/kernels/cpu/rope.h"

#include <cmath>
#include <numbers>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

std::vector<float> rope_inverse_frequencies(int32_t head_dim, float theta,
                                            const Llama3RopeScaling* llama3) {
  const int32_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int32_t i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all in f32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(theta, exponent);
  }
  if (llama3 == nullptr) return inv_freq;

  const float old_context = static_cast<float>(llama3->original_max_position_embeddings);
  const float low_freq_wavelen = old_context / llama3->low_freq_factor;
  const float high_freq_wavelen = old_context / llama3->high_freq_factor;
  for (float& f : inv_freq) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    if (wavelen > low_freq_wavelen) {
      f = f / llama3->factor;  // long wavelengths: plain interpolation
    } else if (wavelen >= high_freq_wavelen) {
      // Medium band: blend between scaled and unscaled frequency.
      const float smooth = (old_context / wavelen - llama3->low_freq_factor) /
                           (llama3->high_freq_factor - llama3->low_freq_factor);
      f = (1.0f - smooth) * f / llama3->factor + smooth * f;
    }  // short wavelengths stay as they are
  }
  return inv_freq;
}

void apply_rope(float* x, const int32_t* positions, size_t num_tokens, size_t num_heads,
                size_t head_dim, const float* inv_freq) {
  const size_t half = head_dim / 2;
  ThreadPool::global().parallel_for(num_tokens, [&](size_t begin, size_t end) {
    std::vector<float> cos_table(half), sin_table(half);
    for (size_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (size_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];  // f32 product, as transformers does
        cos_table[i] = std::cos(angle);
        sin_table[i] = std::sin(angle);
      }
      for (size_t h = 0; h < num_heads; ++h) {
        float* v = x + (t * num_heads + h) * head_dim;
        for (size_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_table[i] - b * sin_table[i];
          v[i + half] = b * cos_table[i] + a * sin_table[i];
        }
      }
    }
  });
}

}  // namespace pagoda::kernels
