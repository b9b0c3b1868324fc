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

}  // namespace
}  // namespace pagoda::kernels
