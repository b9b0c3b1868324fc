// Four-row panels of int8 / int4 weights (kernels/quant_panels.h): the packed
// values and scales are the per-row ones regrouped (the plain-loop panel dot
// equals the per-row reference bit for bit, dequantized rows equal), the SIMD
// panel dot matches the reference up to f32 summation order on odd lengths,
// and linear() on a panel matrix matches linear() on the same per-row matrix
// (decode dot path, trailing rows, several input rows, and prefill tiles).

#include "pagoda/backend/cpu/kernels/quant_panels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/random_data.h"
#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/backend/cpu/kernels/quant_dot.h"

namespace pagoda::kernels {
namespace {

struct QuantizedAct {
  std::vector<int8_t> q;
  std::vector<float> scale, scale4, offset4;
  std::vector<int32_t> sum;
  QuantizedActivation view() const { return {q.data(), scale.data(), sum.data()}; }
  PanelActivation panel_view() const { return {q.data(), scale4.data(), offset4.data()}; }
};

QuantizedAct quantize_act(const std::vector<float>& x) {
  const size_t blocks = quant_blocks(x.size());
  QuantizedAct a{std::vector<int8_t>(blocks * kQuantBlock), std::vector<float>(blocks),
                 std::vector<float>(4 * blocks), std::vector<float>(4 * blocks), std::vector<int32_t>(blocks)};
  quantize_activation(x.data(), x.size(), a.q.data(), a.scale.data(), a.sum.data());
  prepare_panel_activation(a.view(), blocks, a.scale4.data(), a.offset4.data());
  return a;
}

std::vector<uint8_t> quantize(DType dtype, const std::vector<float>& w, size_t rows, size_t cols) {
  std::vector<uint8_t> q(rows * quantized_row_bytes(dtype, cols));
  quantize_weight_rows(dtype, w.data(), rows, cols, q.data());
  return q;
}

TEST(QuantPanelsTest, PanelDotMatchesPerRowReference) {
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    // Block counts 1, 2, 3, 4, 5, 32, 23, 64 and 176: the four-block loop and the tail blocks after it.
    for (size_t k : {size_t{1}, size_t{17}, size_t{63}, size_t{128}, size_t{160}, size_t{1000}, size_t{731},
                     size_t{2048}, size_t{5632}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " k " << k);
      const size_t blocks = quant_blocks(k), row_bytes = quantized_row_bytes(dtype, k);
      const auto w = testing::random_values(4 * k, 7 * k + 1);
      const auto x = testing::random_values(k, 5 * k + 2, -4.0f, 4.0f);
      const auto rows = quantize(dtype, w, 4, k);
      auto panel = rows;
      pack_quant_panels(dtype, panel.data(), 4, k);
      EXPECT_NE(panel, rows);
      const QuantizedAct a = quantize_act(x);
      float ref[4], got[4];
      dot_quant_panel_reference(dtype, panel.data(), a.view(), blocks, ref);
      dot_quant_panel(dtype, panel.data(), a.panel_view(), blocks, got);
      std::vector<float> row_deq(4 * k), panel_deq(4 * k);
      dequantize_weight_rows(dtype, rows.data(), 4, k, row_deq.data());
      dequantize_panel_rows(dtype, panel.data(), 4, k, 0, 4, panel_deq.data());
      EXPECT_EQ(panel_deq, row_deq);
      for (size_t r = 0; r < 4; ++r) {
        // Same values, same block order, same arithmetic: bit for bit.
        EXPECT_EQ(ref[r], dot_quantized_reference(dtype, rows.data() + r * row_bytes, a.view(), blocks)) << "row " << r;
        double magnitude = 0;
        for (size_t i = 0; i < k; ++i) magnitude += std::abs(double(w[r * k + i]) * x[i]);
        EXPECT_NEAR(got[r], ref[r], 1e-5 * magnitude + 1e-6) << "row " << r;
      }
    }
  }
}

// A panel of zero rows gives zero; so does a zero activation (the offset term cancels exactly).
TEST(QuantPanelsTest, ZerosGiveZero) {
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    const size_t k = 160;
    const std::vector<float> zeros(4 * k, 0.0f);
    const auto x = testing::random_values(k, 3);
    auto panel = quantize(dtype, zeros, 4, k);
    pack_quant_panels(dtype, panel.data(), 4, k);
    float out[4];
    dot_quant_panel(dtype, panel.data(), quantize_act(x).panel_view(), quant_blocks(k), out);
    for (float v : out) EXPECT_EQ(v, 0.0f) << dtype_name(dtype);
    auto w = quantize(dtype, testing::random_values(4 * k, 9), 4, k);
    pack_quant_panels(dtype, w.data(), 4, k);
    dot_quant_panel(dtype, w.data(), quantize_act(std::vector<float>(k, 0.0f)).panel_view(), quant_blocks(k), out);
    for (float v : out) EXPECT_EQ(v, 0.0f) << dtype_name(dtype);
  }
}

// linear() on a panel-layout matrix against linear() on the per-row matrix it was packed from: n not a
// multiple of 4 (trailing rows), m = 1..4 (decode dot path) and m > 4 (dequantized tiles + sgemm).
TEST(QuantPanelsTest, LinearOnPanelsMatchesPerRowLayout) {
  struct Shape {
    size_t m, n, k;
  };
  for (DType dtype : {DType::kInt8, DType::kInt4}) {
    for (Shape s : {Shape{1, 37, 33}, Shape{1, 256, 2048}, Shape{3, 301, 1000}, Shape{4, 8, 64}, Shape{2, 19, 731},
                    Shape{1, 3, 64}, Shape{9, 129, 70}, Shape{5, 2502, 1000}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " m " << s.m << " n " << s.n << " k " << s.k);
      const auto x = testing::random_values(s.m * s.k, s.m + s.k);
      const auto w = testing::random_values(s.n * s.k, s.n);
      const auto bias = testing::random_values(s.n, 7);
      const auto rows = quantize(dtype, w, s.n, s.k);
      auto panels = rows;
      pack_quant_panels(dtype, panels.data(), s.n, s.k);
      WeightMatrix pw{dtype, panels.data(), s.n, s.k};
      pw.quant_panels = true;
      std::vector<float> got(s.m * s.n), want(s.m * s.n);
      linear(x.data(), s.m, pw, bias.data(), got.data());
      linear(x.data(), s.m, WeightMatrix{dtype, rows.data(), s.n, s.k}, bias.data(), want.data());
      for (size_t i = 0; i < got.size(); ++i) {
        double magnitude = 1;
        for (size_t c = 0; c < s.k; ++c) magnitude += std::abs(double(w[(i % s.n) * s.k + c]));
        ASSERT_NEAR(got[i], want[i], 1e-5 * magnitude) << "at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels
