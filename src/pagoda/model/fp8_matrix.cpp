#include "pagoda/model/fp8_matrix.h"

#include <algorithm>
#include <cmath>

namespace pagoda {

namespace {

// x[0, n) rounded through fp8 with the multiplier scale (x / scale is what is stored).
void fake_quantize_span(float* x, size_t n, float scale) {
  if (!(scale > 0.0f)) return;  // an all-zero span stays zero
  for (size_t i = 0; i < n; ++i) x[i] = round_to_fp8e4m3(x[i] / scale) * scale;
}

float amax(const float* x, size_t n) {
  float a = 0.0f;
  for (size_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

}  // namespace

void dequantize_fp8_rows(const WeightMatrix& w, size_t r0, size_t r1, float* out) {
  const float* table = fp8e4m3_table();
  const auto* bytes = static_cast<const uint8_t*>(w.data);
  const Fp8MatrixScales& s = w.fp8;
  const size_t k = w.cols;
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = bytes + r * k;
    float* dst = out + (r - r0) * k;
    switch (s.layout) {
      case Fp8WeightScale::kTensor:
      case Fp8WeightScale::kChannel: {
        const float scale = s.layout == Fp8WeightScale::kTensor ? s.scales[0] : s.scales[r];
        for (size_t c = 0; c < k; ++c) dst[c] = table[row[c]] * scale;
        break;
      }
      case Fp8WeightScale::kBlock: {
        const size_t bc = static_cast<size_t>(s.block_cols);
        const size_t col_blocks = (k + bc - 1) / bc;
        const float* scales = s.scales + (r / static_cast<size_t>(s.block_rows)) * col_blocks;
        for (size_t c0 = 0, b = 0; c0 < k; c0 += bc, ++b) {
          const size_t c1 = std::min(k, c0 + bc);
          for (size_t c = c0; c < c1; ++c) dst[c] = table[row[c]] * scales[b];
        }
        break;
      }
    }
  }
}

float quantize_fp8_row(const float* src, size_t cols, uint8_t* dst) {
  const float a = amax(src, cols);
  if (!(a > 0.0f)) {
    std::fill(dst, dst + cols, uint8_t{0});
    return 0.0f;
  }
  const float scale = a / kFp8E4M3Max;
  for (size_t c = 0; c < cols; ++c) dst[c] = f32_to_fp8e4m3(src[c] / scale);
  return scale;
}

void fake_quantize_fp8_activations(float* x, size_t m, size_t k, const Fp8MatrixScales& s) {
  switch (s.activation) {
    case Fp8Activation::kNone: return;
    case Fp8Activation::kDynamicToken:
      for (size_t r = 0; r < m; ++r) fake_quantize_span(x + r * k, k, amax(x + r * k, k) / kFp8E4M3Max);
      return;
    case Fp8Activation::kDynamicGroup: {
      const size_t g = static_cast<size_t>(s.activation_group);
      for (size_t r = 0; r < m; ++r) {
        for (size_t c0 = 0; c0 < k; c0 += g) {
          float* span = x + r * k + c0;
          const size_t n = std::min(g, k - c0);
          fake_quantize_span(span, n, amax(span, n) / kFp8E4M3Max);
        }
      }
      return;
    }
    case Fp8Activation::kStaticTensor:
      fake_quantize_span(x, m * k, s.input_scale);
      return;
  }
}

}  // namespace pagoda
