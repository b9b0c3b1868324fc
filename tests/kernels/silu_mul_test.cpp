#include "pagoda/backend/cpu/kernels/silu_mul.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/random_data.h"

namespace pagoda::kernels {
namespace {

TEST(SiluMulTest, MatchesDefinition) {
  const size_t n = 20001;  // several parallel chunks, odd tail
  const auto gate = testing::random_values(n, 1, -8.0f, 8.0f);
  const auto up = testing::random_values(n, 2, -2.0f, 2.0f);
  std::vector<float> out(n);
  silu_mul(gate.data(), up.data(), out.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(out[i], expected, 1e-5 * std::max(1.0, std::abs(expected))) << i;
  }
}

// Large |gate|: exp(-gate) over- or underflows in f32 (the vector exp clamps its input).
TEST(SiluMulTest, ExtremeGates) {
  const std::vector<float> gate = {-200.0f, -100.0f, -88.0f, -30.0f, 0.0f, 30.0f, 88.0f, 100.0f, 200.0f,
                                   -1e-30f, 1e-30f, 5.0f, -5.0f, 20.0f, -20.0f, 1.0f, -1.0f};
  const std::vector<float> up(gate.size(), 1.5f);
  std::vector<float> out(gate.size());
  silu_mul(gate.data(), up.data(), out.data(), gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * 1.5;
    ASSERT_TRUE(std::isfinite(out[i])) << g;
    ASSERT_NEAR(out[i], expected, 1e-5 * std::max(1e-30, std::abs(expected))) << g;
  }
}

}  // namespace
}  // namespace pagoda::kernels
