// The block-quantized weight formats (int8 / int4, kernels/quant_dot.h): the
// round trip within half a quantization step, the run-time-picked SIMD dot
// against the scalar reference on odd lengths, and linear() on quantized
// weights against f32 linear() on the dequantized weights (decode and prefill).

#include "pagoda/backend/cpu/kernels/quant_dot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/random_data.h"
#include "pagoda/backend/cpu/kernels/matmul.h"

namespace pagoda::kernels {
namespace {

struct QuantizedAct {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  QuantizedActivation view() const { return {q.data(), scale.data(), sum.data()}; }
};

QuantizedAct quantize_act(const std::vector<float>& x) {
  const size_t blocks = quant_blocks(x.size());
  QuantizedAct a{std::vector<int8_t>(blocks * kQuantBlock), std::vector<float>(blocks), std::vector<int32_t>(blocks)};
  quantize_activation(x.data(), x.size(), a.q.data(), a.scale.data(), a.sum.data());
  return a;
}

std::vector<uint8_t> quantize(DType dtype, const std::vector<float>& w, size_t rows, size_t cols) {
  std::vector<uint8_t> q(rows * quantized_row_bytes(dtype, cols));
  quantize_weight_rows(dtype, w.data(), rows, cols, q.data());
  return q;
}

TEST(QuantDotTest, RoundTripWithinHalfAStep) {
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    for (size_t cols : {size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{100}}) {
      const size_t rows = 5;
      const auto w = testing::random_values(rows * cols, cols);
      const auto q = quantize(dtype, w, rows, cols);
      std::vector<float> back(rows * cols);
      dequantize_weight_rows(dtype, q.data(), rows, cols, back.data());
      for (size_t r = 0; r < rows; ++r) {
        for (size_t b = 0; b < quant_blocks(cols); ++b) {
          const size_t lo = b * kQuantBlock, hi = std::min(cols, lo + kQuantBlock);
          float amax = 0;
          for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::abs(w[r * cols + i]));
          // int8: step amax/127, error <= step/2 (+ f16 scale rounding); int4: step amax/8, the far
          // end of the range clamps to 7 steps, so up to one step there.
          const float bound = dtype == DType::kInt8 ? amax / 127.0f * 0.51f + amax * 1e-3f : amax / 8.0f * 1.01f;
          for (size_t i = lo; i < hi; ++i)
            ASSERT_LE(std::abs(back[r * cols + i] - w[r * cols + i]), bound)
                << dtype_name(dtype) << " cols " << cols << " at " << r << "," << i;
        }
      }
    }
  }
}

TEST(QuantDotTest, SimdMatchesScalarReferenceOnOddLengths) {
  SCOPED_TRACE(quant_dot_implementation());
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    // Block counts 1, 2, 3, 32, 65, 23 (16 + a whole int4 quad + 3 tail blocks) and 176 (the ~0.85B
    // Llama's intermediate size): the 16-block AVX-512 loop, the quads left after it and the tail blocks.
    for (size_t k : {size_t{1}, size_t{17}, size_t{32}, size_t{63}, size_t{96}, size_t{1000}, size_t{2065}, size_t{731},
                     size_t{5632}}) {
      const auto w = testing::random_values(k, 3 * k + 1);
      const auto x = testing::random_values(k, 5 * k + 2, -4.0f, 4.0f);
      const auto q = quantize(dtype, w, 1, k);
      const QuantizedAct a = quantize_act(x);
      const float ref = dot_quantized_reference(dtype, q.data(), a.view(), quant_blocks(k));
      const float got = dot_quantized(dtype, q.data(), a.view(), quant_blocks(k));
      // Same integers per block; only the f32 summation order over blocks differs.
      double magnitude = 0;
      for (size_t i = 0; i < k; ++i) magnitude += std::abs(double(w[i]) * x[i]);
      EXPECT_NEAR(got, ref, 1e-5 * magnitude + 1e-6) << dtype_name(dtype) << " k " << k;
      EXPECT_NEAR(dot_quantized_avx2(dtype, q.data(), a.view(), quant_blocks(k)), ref, 1e-5 * magnitude + 1e-6)
          << "avx2 " << dtype_name(dtype) << " k " << k;
      // And against the f32 dot of the dequantized weights: only the activation rounding
      // (half a step of amax/127 per block) remains.
      std::vector<float> wd(k);
      dequantize_weight_rows(dtype, q.data(), 1, k, wd.data());
      double exact = 0, wsum = 0;
      for (size_t i = 0; i < k; ++i) {
        exact += double(wd[i]) * x[i];
        wsum += std::abs(double(wd[i]));
      }
      EXPECT_NEAR(got, exact, 4.0 / 127.0 * 0.5 * wsum * 1.01 + 1e-5) << dtype_name(dtype) << " k " << k;
    }
  }
}

// The activation quantization (AVX2 for whole blocks where the CPU has it) against the scalar definition:
// d = amax / 127, q = round-to-nearest-even(x / d), zero padding, the block's sum of q.
TEST(QuantDotTest, ActivationQuantizationMatchesDefinition) {
  for (size_t k : {size_t{1}, size_t{31}, size_t{32}, size_t{100}, size_t{2048}, size_t{2065}}) {
    auto x = testing::random_values(k, 9 * k, -3.0f, 3.0f);
    if (k >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block: scale 0, q 0
    const QuantizedAct a = quantize_act(x);
    for (size_t b = 0; b < quant_blocks(k); ++b) {
      const size_t lo = b * kQuantBlock, hi = std::min(k, lo + kQuantBlock);
      float amax = 0.0f;
      for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      ASSERT_EQ(a.scale[b], d) << "k " << k << " block " << b;
      int32_t sum = 0;
      for (size_t i = 0; i < kQuantBlock; ++i) {
        const int want = lo + i < hi ? static_cast<int>(std::nearbyint(x[lo + i] * id)) : 0;
        ASSERT_EQ(a.q[lo + i], want) << "k " << k << " element " << lo + i;
        sum += want;
      }
      ASSERT_EQ(a.sum[b], sum) << "k " << k << " block " << b;
    }
  }
}

TEST(QuantDotTest, ZeroBlocksGiveZero) {
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    const std::vector<float> w(64, 0.0f), x = testing::random_values(64, 1);
    const auto q = quantize(dtype, w, 1, 64);
    EXPECT_EQ(dot_quantized(dtype, q.data(), quantize_act(x).view(), 2), 0.0f);
    const auto qx = quantize(dtype, x, 1, 64);
    EXPECT_EQ(dot_quantized(dtype, qx.data(), quantize_act(w).view(), 2), 0.0f);
  }
}

// linear() on quantized weights (the integer dot path up to 4 rows, dequantized
// tiles + sgemm beyond; n = 2500 at k = 1000 makes several 4 MiB tiles per thread) against f32 linear() on the dequantized weights.
TEST(QuantDotTest, LinearMatchesDequantizedF32) {
  struct Shape {
    size_t m, n, k;
  };
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    for (Shape s : {Shape{1, 37, 33}, Shape{3, 301, 1000}, Shape{4, 5, 64}, Shape{9, 129, 70}, Shape{40, 33, 17}, Shape{5, 2500, 1000}, Shape{2, 19, 731}}) {
      const auto x = testing::random_values(s.m * s.k, s.m + s.k);
      const auto w = testing::random_values(s.n * s.k, s.n);
      const auto bias = testing::random_values(s.n, 7);
      const auto q = quantize(dtype, w, s.n, s.k);
      std::vector<float> wd(s.n * s.k);
      dequantize_weight_rows(dtype, q.data(), s.n, s.k, wd.data());
      std::vector<float> got(s.m * s.n), want(s.m * s.n);
      linear(x.data(), s.m, WeightMatrix{dtype, q.data(), s.n, s.k}, bias.data(), got.data());
      linear(x.data(), s.m, WeightMatrix{DType::kF32, wd.data(), s.n, s.k}, bias.data(), want.data());
      for (size_t r = 0; r < s.m; ++r) {
        for (size_t j = 0; j < s.n; ++j) {
          double wsum = 0;
          for (size_t i = 0; i < s.k; ++i) wsum += std::abs(double(wd[j * s.k + i]));
          // Integer path: activation rounding, half a step of amax/127 (amax <= 1); sgemm path: f32 rounding.
          const double tol = s.m <= 4 ? 0.5 / 127.0 * wsum * 1.01 + 1e-5 : 1e-4 * (1 + wsum);
          ASSERT_NEAR(got[r * s.n + j], want[r * s.n + j], tol)
              << dtype_name(dtype) << " m " << s.m << " n " << s.n << " k " << s.k << " at " << r << "," << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels
