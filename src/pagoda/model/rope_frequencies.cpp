#include "pagoda/model/rope_frequencies.h"

#include <cmath>
#include <numbers>

namespace pagoda {

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

}  // namespace pagoda
