#include "pagoda/backend/cpu/kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/random_data.h"

namespace pagoda::kernels {
namespace {

TEST(RmsnormTest, MatchesDefinitionIncludingInPlace) {
  for (size_t dim : {1u, 7u, 64u, 257u}) {
    const size_t rows = 5;
    const auto x = testing::random_values(rows * dim, dim, -3.0f, 3.0f);
    const auto w = testing::random_values(dim, dim + 1);
    std::vector<float> out(rows * dim);
    rmsnorm(x.data(), w.data(), out.data(), rows, dim, 1e-5f);
    for (size_t r = 0; r < rows; ++r) {
      double ms = 0;
      for (size_t i = 0; i < dim; ++i) ms += double(x[r * dim + i]) * x[r * dim + i];
      ms /= dim;
      for (size_t i = 0; i < dim; ++i) {
        const double expected = x[r * dim + i] / std::sqrt(ms + 1e-5) * w[i];
        EXPECT_NEAR(out[r * dim + i], expected, 1e-5 * std::max(1.0, std::abs(expected))) << dim;
      }
    }
    std::vector<float> in_place = x;
    rmsnorm(in_place.data(), w.data(), in_place.data(), rows, dim, 1e-5f);
    EXPECT_EQ(in_place, out);
  }
}

}  // namespace
}  // namespace pagoda::kernels
