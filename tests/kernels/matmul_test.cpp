#include "pagoda/backend/cpu/kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/random_data.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"

namespace pagoda::kernels {
namespace {

// y = x W^T + b in double, on the weights as stored (after dtype rounding); abs_sum
// gets sum_i |x_i w_i| per output (the scale of the bf16 GEMM's rounding error).
std::vector<double> reference(const std::vector<float>& x, size_t m, const std::vector<float>& w, size_t n,
                              size_t k, const float* bias, std::vector<double>* abs_sum) {
  std::vector<double> y(m * n);
  abs_sum->assign(m * n, 0.0);
  for (size_t r = 0; r < m; ++r)
    for (size_t j = 0; j < n; ++j) {
      double s = bias ? bias[j] : 0.0;
      for (size_t i = 0; i < k; ++i) {
        s += double(x[r * k + i]) * w[j * k + i];
        (*abs_sum)[r * n + j] += std::abs(double(x[r * k + i]) * w[j * k + i]);
      }
      y[r * n + j] = s;
    }
  return y;
}

struct Shape {
  size_t m, n, k;
};

TEST(LinearTest, MatchesReferenceForEveryDtypeAndShape) {
  // m = 1 (decode, gemv path), small and odd prefill sizes; n large enough for several
  // threads and, with n = 2500 and k = 1000, several converted (4 MiB) tiles per thread.
  for (Shape s : {Shape{1, 33, 17}, Shape{7, 129, 64}, Shape{3, 301, 1000}, Shape{16, 5, 3}, Shape{5, 2500, 1000}}) {
    const auto x = testing::random_values(s.m * s.k, s.m + s.k);
    auto w = testing::random_values(s.n * s.k, s.n);
    const auto bias = testing::random_values(s.n, 99);
    std::vector<uint16_t> bf16(w.size()), f16(w.size());
    std::vector<float> w_bf16(w.size()), w_f16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      bf16[i] = f32_to_bf16(w[i]);
      f16[i] = f32_to_f16(w[i]);
      w_bf16[i] = bf16_to_f32(bf16[i]);
      w_f16[i] = f16_to_f32(f16[i]);
    }
    struct Case {
      DType dtype;
      const void* data;
      const std::vector<float>* values;
    };
    for (const Case& c : {Case{DType::kF32, w.data(), &w}, Case{DType::kBF16, bf16.data(), &w_bf16},
                          Case{DType::kF16, f16.data(), &w_f16}}) {
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> y(s.m * s.n, 12345.0f);
        linear(x.data(), s.m, WeightMatrix{c.dtype, c.data, s.n, s.k}, b, y.data());
        std::vector<double> abs_sum;
        const auto expected = reference(x, s.m, *c.values, s.n, s.k, b, &abs_sum);
        // Prefill on f16/bf16 weights takes the AVX512-BF16 GEMM where the CPU has it: bf16
        // activations (2^-9 relative) and, for f16, weights rounded to bf16 (2^-9 again).
        const bool bf16_gemm = c.dtype != DType::kF32 && s.m > 4 && bf16_gemm_enabled();
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], expected[i],
                      2e-5 * std::sqrt(double(s.k)) + 1e-5 + (bf16_gemm ? std::ldexp(abs_sum[i], -8) * 1.01 : 0.0))
              << dtype_name(c.dtype) << " m=" << s.m << " n=" << s.n << " k=" << s.k << " i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels
