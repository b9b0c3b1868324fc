// FlashMLA's 656-byte fp8 record of an MLA latent vector (runtime/mla_fp8_layout.h):
// where the bytes go, the per-128 scales, the error bound of the round trip, an
// all-zero group, and that group scales beat one scale over the vector when the
// groups' magnitudes differ.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda::kernels {
namespace {

std::vector<float> random_vector(uint32_t seed, float group_gain_step) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> v(576);
  for (int i = 0; i < 576; ++i) v[i] = unit(rng) * (i < 512 ? std::pow(group_gain_step, float(i / 128)) : 3.0f);
  return v;
}

TEST(MlaFp8LayoutTest, BytesScalesAndRope) {
  const auto v = random_vector(1, 1.0f);
  std::vector<uint8_t> r(kMlaFp8VectorBytes, 0xee);
  mla_fp8_quantize(v.data(), r.data());
  for (int g = 0; g < 4; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[128 * g + i]));
    EXPECT_EQ(mla_fp8_scale(r.data(), g), amax / 448.0f) << "group " << g;
    for (int i = 0; i < 128; ++i)
      EXPECT_EQ(r[128 * g + i], f32_to_fp8e4m3(v[128 * g + i] * (1.0f / (amax / 448.0f)))) << "value " << 128 * g + i;
  }
  for (int i = 0; i < 64; ++i) {
    uint16_t b;
    std::memcpy(&b, &r[528 + 2 * i], 2);
    EXPECT_EQ(b, f32_to_bf16(v[512 + i])) << "rope " << i;
    EXPECT_EQ(mla_fp8_value(r.data(), 512 + i), bf16_to_f32(b));
  }
}

TEST(MlaFp8LayoutTest, RoundTripWithinHalfAnFp8Step) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const auto v = random_vector(seed, 0.1f);  // groups of 1, 0.1, 0.01, 0.001 magnitudes
    std::vector<uint8_t> r(kMlaFp8VectorBytes);
    mla_fp8_quantize(v.data(), r.data());
    for (int i = 0; i < 512; ++i) {
      const float scale = mla_fp8_scale(r.data(), i / 128);
      // e4m3: 3 mantissa bits (half a step is 2^-4 relative), subnormal steps of 2^-9 times the scale.
      const float bound = std::max(std::fabs(v[i]) * 0.0625f, scale * std::ldexp(1.0f, -10)) * 1.0001f;
      EXPECT_LE(std::fabs(mla_fp8_value(r.data(), i) - v[i]), bound) << "seed " << seed << " value " << i;
    }
    for (int i = 512; i < 576; ++i)
      EXPECT_LE(std::fabs(mla_fp8_value(r.data(), i) - v[i]), std::fabs(v[i]) * std::ldexp(1.0f, -8));
  }
}

TEST(MlaFp8LayoutTest, ZeroGroupHasUnitScale) {
  std::vector<float> v(576, 0.5f);
  for (int i = 128; i < 256; ++i) v[i] = 0.0f;
  std::vector<uint8_t> r(kMlaFp8VectorBytes);
  mla_fp8_quantize(v.data(), r.data());
  EXPECT_EQ(mla_fp8_scale(r.data(), 1), 1.0f);
  for (int i = 128; i < 256; ++i) EXPECT_EQ(mla_fp8_value(r.data(), i), 0.0f);
  EXPECT_EQ(mla_fp8_value(r.data(), 0), 0.5f);
}

TEST(MlaFp8LayoutTest, GroupScalesBeatOneScaleWhenGroupsDiffer) {
  // One amax scale over the whole vector (runtime/kv_quant.h's fp8) pushes the
  // small groups into fp8's subnormals; a scale per 128 keeps them normal.
  double group_err = 0.0, vector_err = 0.0, norm = 0.0;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const auto v = random_vector(seed, 0.05f);
    std::vector<uint8_t> r(kMlaFp8VectorBytes);
    mla_fp8_quantize(v.data(), r.data());
    float amax = 0.0f;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    const float scale = amax / 448.0f;
    for (int i = 0; i < 512; ++i) {
      const double one = double(fp8e4m3_to_f32(f32_to_fp8e4m3(v[i] * (1.0f / scale)))) * scale;
      group_err += std::pow(mla_fp8_value(r.data(), i) - v[i], 2);
      vector_err += std::pow(one - v[i], 2);
      norm += double(v[i]) * v[i];
    }
  }
  std::printf("latent rel L2: scale per 128 %.3e, one scale per vector %.3e\n", std::sqrt(group_err / norm),
              std::sqrt(vector_err / norm));
  EXPECT_LT(group_err, vector_err);
}

}  // namespace
}  // namespace pagoda::kernels
