#pragma once
// YaRN rope scaling ("rope_type": "yarn"), as DeepSeek V2/V3 configure it and
// transformers computes it (modeling_rope_utils, _compute_yarn_parameters):
// frequencies below the correction range are interpolated (divided by
// `factor`), those above it kept, a linear ramp between; the cos/sin tables are
// multiplied by the attention factor; and DeepSeek multiplies the softmax scale
// by mscale(factor, mscale_all_dim)^2 on top (deepseek_softmax_mscale).
//
// Thread safety: plain functions.

#include <cstdint>
#include <optional>
#include <vector>

namespace pagoda {

struct YarnRopeScaling {
  double factor = 1.0;                          // absent in config.json: max_position_embeddings / original
  int32_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;                      // 0 / absent: 32
  double beta_slow = 1.0;                       // 0 / absent: 1
  double mscale = 0.0;                          // 0: absent
  double mscale_all_dim = 0.0;                  // 0: absent
  std::optional<double> attention_factor;       // explicit cos/sin multiplier
  bool truncate = true;                         // floor/ceil the correction range
};

// 1.0 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double yarn_get_mscale(double scale, double mscale);

// inv_freq[i] for i in [0, dim / 2), in f32 like transformers.
std::vector<float> yarn_inverse_frequencies(int32_t dim, double theta, const YarnRopeScaling& yarn);

// The factor the cos/sin tables are multiplied by: attention_factor when given,
// else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are
// set, else mscale(factor, 1).
double yarn_attention_factor(const YarnRopeScaling& yarn);

// DeepSeek's extra softmax scale: mscale(factor, mscale_all_dim)^2 when
// mscale_all_dim is set, else 1.
double deepseek_softmax_mscale(const YarnRopeScaling& yarn);

}  // namespace pagoda
