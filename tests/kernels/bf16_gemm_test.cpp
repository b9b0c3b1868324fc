// The AVX512-BF16 prefill GEMM (kernels/bf16_gemm.h): against a double reference
// on the bf16-rounded operands (only f32 summation error allowed), on shapes that
// hit every edge (partial 16-row groups and 64-row blocks, partial 6-row panels,
// odd k, k in several chunks, f16 weights rounded per tile, several threads), and the stated bound
// against the unrounded f32 product.

#include "pagoda/backend/cpu/kernels/bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "kernels/random_data.h"
#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {
namespace {

struct Shape {
  size_t m, n, k;
};

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

TEST(Bf16GemmTest, MatchesReferenceOnRoundedOperands) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ThreadPool pool(3);
  ThreadPool::ScopedCurrent scope(&pool);
  for (Shape s : {Shape{5, 1, 1}, Shape{16, 6, 2}, Shape{17, 7, 3}, Shape{64, 48, 64}, Shape{65, 49, 31},
                  Shape{130, 97, 257}, Shape{200, 300, 130}, Shape{33, 13, 1000}, Shape{70, 13, 4101}}) {
    const auto x = testing::random_values(s.m * s.k, s.m * 7 + s.k);
    const auto w = testing::random_values(s.n * s.k, s.n * 3 + s.k);
    const auto bias = testing::random_values(s.n, 5);
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      std::vector<uint16_t> wq(w.size());
      std::vector<float> w_used(w.size());  // the weights as the kernel multiplies them (bf16)
      for (size_t i = 0; i < w.size(); ++i) {
        wq[i] = dtype == DType::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
        w_used[i] = dtype == DType::kBF16 ? bf16_to_f32(wq[i]) : round_bf16(f16_to_f32(wq[i]));
      }
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> y(s.m * s.n, 12345.0f);
        gemm_bf16(x.data(), s.m, wq.data(), dtype, s.n, s.k, b, y.data());
        for (size_t r = 0; r < s.m; ++r)
          for (size_t j = 0; j < s.n; ++j) {
            double sum = b != nullptr ? b[j] : 0.0, abs_sum = 0.0;
            for (size_t i = 0; i < s.k; ++i) {
              const double p = double(round_bf16(x[r * s.k + i])) * w_used[j * s.k + i];
              sum += p;
              abs_sum += std::abs(p);
            }
            // f32 accumulation over k products: a few ulps of the magnitude sum.
            ASSERT_NEAR(y[r * s.n + j], sum, 1e-6 * (double(s.k) + 8) * (abs_sum + 1e-3))
                << dtype_name(dtype) << " m=" << s.m << " n=" << s.n << " k=" << s.k << " r=" << r << " j=" << j;
          }
      }
    }
  }
}

TEST(Bf16GemmTest, WithinStatedBoundOfF32Product) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Shape s{70, 40, 2048};
  const auto x = testing::random_values(s.m * s.k, 11, -4.0f, 4.0f);
  const auto w = testing::random_values(s.n * s.k, 12, -0.1f, 0.1f);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> wq(w.size());
    std::vector<float> w_file(w.size());  // the checkpoint's values (what the f32 reference multiplies)
    for (size_t i = 0; i < w.size(); ++i) {
      wq[i] = dtype == DType::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
      w_file[i] = dtype == DType::kBF16 ? bf16_to_f32(wq[i]) : f16_to_f32(wq[i]);
    }
    std::vector<float> y(s.m * s.n);
    gemm_bf16(x.data(), s.m, wq.data(), dtype, s.n, s.k, nullptr, y.data());
    double worst = 0.0;
    for (size_t r = 0; r < s.m; ++r)
      for (size_t j = 0; j < s.n; ++j) {
        double sum = 0.0, abs_sum = 0.0;
        for (size_t i = 0; i < s.k; ++i) {
          const double p = double(x[r * s.k + i]) * w_file[j * s.k + i];
          sum += p;
          abs_sum += std::abs(p);
        }
        // bf16 activations: 2^-9 relative each; f16 weights rounded to bf16: 2^-9 again.
        const double bound = (dtype == DType::kBF16 ? 1.0 : 2.0) * std::ldexp(abs_sum, -9) * 1.01 + 1e-6 * abs_sum;
        ASSERT_NEAR(y[r * s.n + j], sum, bound) << dtype_name(dtype) << " r=" << r << " j=" << j;
        worst = std::max(worst, std::abs(y[r * s.n + j] - sum) / abs_sum);
      }
    // The rounding is not a no-op (the test would pass on an f32 kernel otherwise).
    EXPECT_GT(worst, 1e-6) << dtype_name(dtype);
  }
}

// The dispatch decision: the bf16 GEMM is the default exactly where the CPU has
// AVX512-BF16; PAGODA_CPU_BF16_GEMM=0 (or "exact") picks the f32-exact path; a CPU
// without the instructions keeps the exact path whatever the environment says, and
// an unrecognized value is flagged and falls back to the exact path.
TEST(Bf16GemmTest, StartingChoiceIsTheFastPathOnlyWhereTheCpuHasIt) {
  for (const char* on : {static_cast<const char*>(nullptr), "", "1", "bf16"}) {
    bool unrecognized = true;
    EXPECT_TRUE(bf16_gemm_starting_choice(true, on, &unrecognized)) << (on ? on : "(unset)");
    EXPECT_FALSE(unrecognized);
    EXPECT_FALSE(bf16_gemm_starting_choice(false, on, &unrecognized)) << (on ? on : "(unset)");
    EXPECT_FALSE(unrecognized);
  }
  for (const char* off : {"0", "exact"}) {
    bool unrecognized = true;
    EXPECT_FALSE(bf16_gemm_starting_choice(true, off, &unrecognized)) << off;
    EXPECT_FALSE(unrecognized);
    EXPECT_FALSE(bf16_gemm_starting_choice(false, off)) << off;
  }
  for (const char* bad : {"yes", "2", "BF16x"}) {
    bool unrecognized = false;
    EXPECT_FALSE(bf16_gemm_starting_choice(true, bad, &unrecognized)) << bad;
    EXPECT_TRUE(unrecognized) << bad;
  }
}

// The switch never turns the path on where the CPU cannot run it, and on this
// process it started as the starting choice for this CPU and environment.
TEST(Bf16GemmTest, SwitchFollowsTheCpuAndTheEnvironment) {
  const bool started = bf16_gemm_enabled();
  EXPECT_EQ(started, bf16_gemm_starting_choice(bf16_gemm_supported(), std::getenv("PAGODA_CPU_BF16_GEMM")));
  set_bf16_gemm_enabled(true);
  EXPECT_EQ(bf16_gemm_enabled(), bf16_gemm_supported());
  set_bf16_gemm_enabled(false);
  EXPECT_FALSE(bf16_gemm_enabled());
  set_bf16_gemm_enabled(started);
}

}  // namespace
}  // namespace pagoda::kernels
