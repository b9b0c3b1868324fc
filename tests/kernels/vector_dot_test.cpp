#include "pagoda/backend/cpu/kernels/vector_dot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/random_data.h"

namespace pagoda::kernels {
namespace {

// Every implementation this CPU can run, the dispatched one last (so later
// tests see the default).
std::vector<std::string> runnable_implementations() {
  const std::string chosen = vector_dot_implementation();
  std::vector<std::string> names;
  for (const char* name : {"generic", "avx2+fma+f16c", "avx512"})
    if (name != chosen && select_vector_dot_implementation(name)) names.push_back(name);
  EXPECT_TRUE(select_vector_dot_implementation(chosen));
  names.push_back(chosen);
  return names;
}

void expect_dots_match_double_loop() {
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 33u, 63u, 64u, 65u, 79u, 127u, 1000u, 2048u, 5632u}) {
    const auto x = testing::random_values(n, n + 1), w = testing::random_values(n, n + 2);
    std::vector<uint16_t> bf16(n), f16(n);
    double exact = 0, exact_bf16 = 0, exact_f16 = 0;
    for (size_t i = 0; i < n; ++i) {
      bf16[i] = f32_to_bf16(w[i]);
      f16[i] = f32_to_f16(w[i]);
      exact += double(x[i]) * w[i];
      exact_bf16 += double(x[i]) * bf16_to_f32(bf16[i]);
      exact_f16 += double(x[i]) * f16_to_f32(f16[i]);
    }
    const double tol = 1e-6 * (1.0 + std::sqrt(double(n)));
    EXPECT_NEAR(dot_f32(x.data(), w.data(), n), exact, tol) << n;
    EXPECT_NEAR(dot_weights(x.data(), w.data(), DType::kF32, n), exact, tol) << n;
    EXPECT_NEAR(dot_weights(x.data(), bf16.data(), DType::kBF16, n), exact_bf16, tol) << n;
    EXPECT_NEAR(dot_weights(x.data(), f16.data(), DType::kF16, n), exact_f16, tol) << n;

    std::vector<float> y = w;
    axpy(0.37f, x.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], w[i] + 0.37 * x[i], 1e-6) << n << " " << i;
  }
}

TEST(VectorDotTest, MatchesDoubleLoopForEveryLengthDtypeAndImplementation) {
  for (const std::string& name : runnable_implementations()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(select_vector_dot_implementation(name));
    std::printf("vector_dot implementation: %s\n", vector_dot_implementation());
    expect_dots_match_double_loop();
  }
}

TEST(VectorDotTest, UnknownImplementationIsRefusedAndChangesNothing) {
  const std::string before = vector_dot_implementation();
  EXPECT_FALSE(select_vector_dot_implementation("avx1024"));
  EXPECT_EQ(before, vector_dot_implementation());
}

TEST(VectorDotTest, DispatchPrefersAvx512WhereTheCpuHasIt) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2");
  if (!avx512) GTEST_SKIP() << "no AVX-512 F/BW/VL here";
  EXPECT_STREQ(vector_dot_implementation(), "avx512");
}

TEST(VectorDotTest, WidenEqualsConvertToF32BitForBit) {
  for (const std::string& name : runnable_implementations()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(select_vector_dot_implementation(name));
    // Lengths around the 8- and 16-lane steps, and special values: zeros,
    // subnormals, infinities, the extremes.
    for (size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 1000u}) {
      const auto w = testing::random_values(n, n + 5, -3.0f, 3.0f);
      std::vector<uint16_t> bf16(n), f16(n);
      for (size_t i = 0; i < n; ++i) {
        bf16[i] = f32_to_bf16(w[i]);
        f16[i] = f32_to_f16(w[i]);
      }
      const uint16_t f16_special[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7bff, 0x0400};
      const uint16_t bf16_special[] = {0x0000, 0x8000, 0x0001, 0x007f, 0x7f80, 0xff80, 0x7f7f, 0x0080};
      for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
        f16[i] = f16_special[i];
        bf16[i] = bf16_special[i];
      }
      for (DType dtype : {DType::kBF16, DType::kF16}) {
        const std::vector<uint16_t>& src = dtype == DType::kBF16 ? bf16 : f16;
        std::vector<float> got(n, -1.0f), want(n, -2.0f);
        widen_to_f32(src.data(), dtype, got.data(), n);
        convert_to_f32(dtype, src.data(), want.data(), n);
        for (size_t i = 0; i < n; ++i)
          EXPECT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << dtype_name(dtype) << " n " << n << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels
