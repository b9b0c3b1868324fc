#include "pagoda/backend/cpu/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "kernels/random_data.h"
#include "pagoda/model/rope_frequencies.h"

namespace pagoda::kernels {
namespace {

TEST(RopeTest, DefaultFrequencies) {
  const auto inv = rope_inverse_frequencies(64, 10000.0f);
  ASSERT_EQ(inv.size(), 32u);
  for (size_t i = 0; i < inv.size(); ++i)
    EXPECT_NEAR(inv[i], std::pow(10000.0, -2.0 * i / 64), 1e-6 * std::pow(10000.0, -2.0 * i / 64));
}

TEST(RopeTest, Llama3ScalingBands) {
  // Llama 3.1 settings: wavelengths above 8192 are divided by 8, below 2048 kept,
  // between them interpolated.
  Llama3RopeScaling s{8.0f, 1.0f, 4.0f, 8192};
  const auto plain = rope_inverse_frequencies(128, 500000.0f);
  const auto scaled = rope_inverse_frequencies(128, 500000.0f, &s);
  int low = 0, mid = 0, high = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    double expected = plain[i];
    if (wavelen > 8192) {
      expected = plain[i] / 8.0, ++low;
    } else if (wavelen >= 2048) {
      const double smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * plain[i] / 8.0 + smooth * plain[i], ++mid;
    } else {
      ++high;
    }
    EXPECT_NEAR(scaled[i], expected, 1e-5 * expected) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
}

TEST(RopeTest, MatchesComplexRotation) {
  const size_t tokens = 5, heads = 3, head_dim = 10, half = head_dim / 2;
  const auto inv = rope_inverse_frequencies(head_dim, 100.0f);
  const auto x = testing::random_values(tokens * heads * head_dim, 4);
  const std::vector<int32_t> positions = {0, 1, 7, 300, 4095};
  std::vector<float> y = x;
  apply_rope(y.data(), positions.data(), tokens, heads, head_dim, inv.data());
  for (size_t t = 0; t < tokens; ++t)
    for (size_t h = 0; h < heads; ++h)
      for (size_t i = 0; i < half; ++i) {
        const size_t base = (t * heads + h) * head_dim;
        // Pair (i, i + half) as a complex number, rotated by e^{i * pos * freq}.
        const std::complex<double> z(x[base + i], x[base + i + half]);
        const std::complex<double> r = z * std::polar(1.0, double(float(positions[t]) * inv[i]));
        EXPECT_NEAR(y[base + i], r.real(), 2e-6);
        EXPECT_NEAR(y[base + i + half], r.imag(), 2e-6);
      }
}

TEST(RopeTest, DotProductDependsOnlyOnRelativePosition) {
  const size_t head_dim = 16;
  const auto inv = rope_inverse_frequencies(head_dim, 10000.0f);
  const auto q = testing::random_values(head_dim, 8), k = testing::random_values(head_dim, 9);
  auto rotated_dot = [&](int32_t pq, int32_t pk) {
    std::vector<float> a = q, b = k;
    apply_rope(a.data(), &pq, 1, 1, head_dim, inv.data());
    apply_rope(b.data(), &pk, 1, 1, head_dim, inv.data());
    double d = 0;
    for (size_t i = 0; i < head_dim; ++i) d += double(a[i]) * b[i];
    return d;
  };
  EXPECT_NEAR(rotated_dot(10, 3), rotated_dot(107, 100), 1e-4);
  EXPECT_GT(std::abs(rotated_dot(10, 3) - rotated_dot(10, 4)), 1e-4);  // and it does depend on it
}

}  // namespace
}  // namespace pagoda::kernels
