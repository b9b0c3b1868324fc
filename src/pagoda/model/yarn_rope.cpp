#include "pagoda/model/yarn_rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pagoda {

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

std::vector<float> yarn_inverse_frequencies(int32_t dim, double theta, const YarnRopeScaling& yarn) {
  const double beta_fast = yarn.beta_fast != 0.0 ? yarn.beta_fast : 32.0;
  const double beta_slow = yarn.beta_slow != 0.0 ? yarn.beta_slow : 1.0;
  const double original = static_cast<double>(yarn.original_max_position_embeddings);
  // The dimension at which a frequency makes `rotations` turns over the original context.
  const auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(theta));
  };
  double low = correction_dim(beta_fast);
  double high = correction_dim(beta_slow);
  if (yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no singular ramp

  const int32_t half = dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const float factor = static_cast<float>(yarn.factor);
  const float theta_f = static_cast<float>(theta);
  for (int32_t i = 0; i < half; ++i) {
    // f32 throughout, in transformers' order of operations.
    const float pos_freq = std::pow(theta_f, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                      static_cast<float>(high - low), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv_freq[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv_freq;
}

double yarn_attention_factor(const YarnRopeScaling& yarn) {
  if (yarn.attention_factor) return *yarn.attention_factor;
  if (yarn.mscale != 0.0 && yarn.mscale_all_dim != 0.0)
    return yarn_get_mscale(yarn.factor, yarn.mscale) / yarn_get_mscale(yarn.factor, yarn.mscale_all_dim);
  return yarn_get_mscale(yarn.factor, 1.0);
}

double deepseek_softmax_mscale(const YarnRopeScaling& yarn) {
  if (yarn.mscale_all_dim == 0.0) return 1.0;
  const double m = yarn_get_mscale(yarn.factor, yarn.mscale_all_dim);
  return m * m;
}

}  // namespace pagoda
