#include "pagoda/backend/cpu/kernels/quant_panels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "pagoda/backend/cpu/kernels/cpu_features.h"

namespace pagoda::kernels {

namespace {

constexpr size_t kRows = kQuantPanelRows;
constexpr size_t kScaleBytes = 2 * kRows;  // the four rows' f16 scales of one block

constexpr size_t kGroup = 8;               // blocks per group: their scales fill one 64-byte line

// Bytes of one block's values for the four rows of a panel.
size_t panel_block_bytes(DType dtype) { return dtype == DType::kInt8 ? 4 * kQuantBlock : 2 * kQuantBlock; }

// Where things sit in a panel of `blocks` blocks: groups of 8 blocks, each its scales then its values.
struct PanelGeometry {
  size_t block_bytes, blocks;
  PanelGeometry(DType dtype, size_t blocks) : block_bytes(panel_block_bytes(dtype)), blocks(blocks) {}
  size_t group_start(size_t g) const { return g * kGroup * (block_bytes + kScaleBytes); }
  size_t group_blocks(size_t g) const { return std::min(kGroup, blocks - g * kGroup); }
  size_t scales(size_t b) const { return group_start(b / kGroup) + (b % kGroup) * kScaleBytes; }
  size_t values(size_t b) const {
    return group_start(b / kGroup) + group_blocks(b / kGroup) * kScaleBytes + (b % kGroup) * block_bytes;
  }
};

// Where element i of row r, block b sits in a panel (and, for int4, whether in the high nibble).
struct PanelPos {
  size_t byte;
  bool high;
};
PanelPos panel_position(DType dtype, size_t blocks, size_t b, size_t r, size_t i) {
  const size_t base = PanelGeometry(dtype, blocks).values(b);
  if (dtype == DType::kInt8) return {base + (i / 16) * 64 + 16 * r + i % 16, false};
  return {base + 16 * r + i % 16, i >= 16};
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The stored value (q + 128, or the nibble) of element i of row r, block b.
int panel_value(DType dtype, const uint8_t* panel, size_t blocks, size_t b, size_t r, size_t i) {
  const PanelPos at = panel_position(dtype, blocks, b, r, i);
  if (dtype == DType::kInt8) return panel[at.byte];
  return at.high ? panel[at.byte] >> 4 : panel[at.byte] & 0x0F;
}

float panel_scale(const uint8_t* panel, size_t blocks, DType dtype, size_t b, size_t r) {
  return f16_to_f32(load_u16(panel + PanelGeometry(dtype, blocks).scales(b) + 2 * r));
}

#define PAGODA_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// GCC 12 warns (-Wuninitialized) on the unmasked forms of some AVX-512 intrinsics; the zero-masked forms
// with every lane kept are the same instructions.
constexpr __mmask16 kAll16 = 0xFFFF;

// Lane l of block j's combined scales: entry 4 j + l / 4 of the four blocks' (block-major, row-minor) scales.
alignas(64) constexpr int32_t kBlockLanes[4][16] = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
    {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
    {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};

// One block of a panel: the int32 sums of the four rows (lanes 4 r .. 4 r + 3 row r's partial sums) of its
// stored values times the activation block, both 16-element halves chained into one product.
PAGODA_AVX512 inline __m512i block_product(bool int8, const uint8_t* q, const int8_t* xq, __m512i mask) {
  __m512i lo, hi;
  if (int8) {
    lo = _mm512_loadu_si512(q);
    hi = _mm512_loadu_si512(q + 64);
  } else {
    const __m512i v = _mm512_loadu_si512(q);
    lo = _mm512_and_si512(v, mask);
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  }
  const __m512i x_lo = _mm512_maskz_broadcast_i32x4(kAll16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
  const __m512i x_hi = _mm512_maskz_broadcast_i32x4(kAll16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_lo), hi, x_hi);
}

PAGODA_AVX512 inline __m512 scaled(__m512i product, __m512 scales, size_t j, __m512 acc) {
  const __m512 s = _mm512_maskz_permutexvar_ps(
      kAll16, _mm512_load_si512(reinterpret_cast<const void*>(kBlockLanes[j])), scales);
  return _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(kAll16, product), s, acc);
}

// Four blocks per step: their 16 f16 scales (block-major) in one conversion, times the activation scales;
// the unsigned offset (128 or 8 times each block's activation sum) is accumulated apart, per row, and
// subtracted once at the end.
// Four blocks per step: their 16 f16 scales (block-major) in one conversion, times the activation
// scales; the unsigned offset (128 or 8 times each block's activation sum) is accumulated apart, per row,
// and subtracted once at the end. The panel is read front to back (a group's scales, then its values).
template <bool kInt8>
PAGODA_AVX512 void dot_panel_avx512(const uint8_t* panel, const PanelActivation& x, size_t blocks, float* out) {
  constexpr size_t kBlockBytes = kInt8 ? 4 * kQuantBlock : 2 * kQuantBlock;
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
         acc3 = _mm512_setzero_ps(), offset = _mm512_setzero_ps();
  for (size_t g0 = 0; g0 < blocks; g0 += kGroup) {
    const size_t n = std::min(kGroup, blocks - g0);
    const uint8_t* scales = panel + g0 * (kBlockBytes + kScaleBytes);
    const uint8_t* values = scales + n * kScaleBytes;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      const size_t b = g0 + j;
      const __m512 w = _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + j * kScaleBytes)));
      const __m512 c = _mm512_mul_ps(w, _mm512_loadu_ps(x.scale4 + 4 * b));
      offset = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.offset4 + 4 * b), offset);
      const uint8_t* q = values + j * kBlockBytes;
      const int8_t* xq = x.q + b * kQuantBlock;
      acc0 = scaled(block_product(kInt8, q, xq, mask), c, 0, acc0);
      acc1 = scaled(block_product(kInt8, q + kBlockBytes, xq + kQuantBlock, mask), c, 1, acc1);
      acc2 = scaled(block_product(kInt8, q + 2 * kBlockBytes, xq + 2 * kQuantBlock, mask), c, 2, acc2);
      acc3 = scaled(block_product(kInt8, q + 3 * kBlockBytes, xq + 3 * kQuantBlock, mask), c, 3, acc3);
    }
    for (; j < n; ++j) {  // the last blocks % 4 blocks: four scales each, in lanes 0..3
      const size_t b = g0 + j;
      const __m128 w4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + j * kScaleBytes)));
      const __m512 w = _mm512_zextps128_ps512(w4);
      const __m512 c = _mm512_mul_ps(w, _mm512_set1_ps(x.scale4[4 * b]));
      offset = _mm512_fmadd_ps(w, _mm512_set1_ps(x.offset4[4 * b]), offset);
      acc0 = scaled(block_product(kInt8, values + j * kBlockBytes, x.q + b * kQuantBlock, mask), c, 0, acc0);
    }
  }
  alignas(64) float sums[16], offsets[16];
  _mm512_store_ps(sums, _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
  _mm512_store_ps(offsets, offset);
  const float k = kInt8 ? 128.0f : 8.0f;
  for (size_t r = 0; r < kRows; ++r) {
    const float row_sum = (sums[4 * r] + sums[4 * r + 1]) + (sums[4 * r + 2] + sums[4 * r + 3]);
    const float row_offset = (offsets[r] + offsets[4 + r]) + (offsets[8 + r] + offsets[12 + r]);
    out[r] = row_sum - k * row_offset;
  }
}

// Row r of a panel, its whole blocks as f32 (16 lanes per half block).
PAGODA_AVX512 void dequantize_panel_row_avx512(bool int8, const uint8_t* panel, size_t blocks, size_t whole, size_t r,
                                               float* y) {
  const PanelGeometry geometry(int8 ? DType::kInt8 : DType::kInt4, blocks);
  const __m512i zero = _mm512_set1_epi32(int8 ? 128 : 8), mask = _mm512_set1_epi32(0x0F);
  for (size_t b = 0; b < whole; ++b) {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(load_u16(panel + geometry.scales(b) + 2 * r)));
    const uint8_t* q = panel + geometry.values(b) + 16 * r;
    __m512i lo, hi;
    if (int8) {
      lo = _mm512_maskz_cvtepu8_epi32(kAll16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      hi = _mm512_maskz_cvtepu8_epi32(kAll16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 64)));
    } else {
      const __m512i v = _mm512_maskz_cvtepu8_epi32(kAll16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      lo = _mm512_and_si512(v, mask);
      hi = _mm512_maskz_srli_epi32(kAll16, v, 4);
    }
    float* yb = y + b * kQuantBlock;
    _mm512_storeu_ps(yb, _mm512_mul_ps(d, _mm512_maskz_cvtepi32_ps(kAll16, _mm512_sub_epi32(lo, zero))));
    _mm512_storeu_ps(yb + 16, _mm512_mul_ps(d, _mm512_maskz_cvtepi32_ps(kAll16, _mm512_sub_epi32(hi, zero))));
  }
}

bool has_avx512_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

}  // namespace

bool quant_panels_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("PAGODA_CPU_QUANT_PANELS");
    if (env != nullptr && std::string_view(env) == "0") return false;
    return has_avx512_vnni();
  }();
  return enabled;
}

void pack_quant_panels(DType dtype, uint8_t* data, size_t rows, size_t cols) {
  const size_t blocks = quant_blocks(cols), row_bytes = quantized_row_bytes(dtype, cols);
  const PanelGeometry geometry(dtype, blocks);
  std::vector<uint8_t> values(kRows * blocks * kQuantBlock);
  std::vector<uint16_t> scales(kRows * blocks);
  for (size_t p = 0; p + 1 <= rows / kRows; ++p) {
    uint8_t* panel = data + p * kRows * row_bytes;
    for (size_t r = 0; r < kRows; ++r)
      quantized_row_values(dtype, panel + r * row_bytes, blocks, values.data() + r * blocks * kQuantBlock,
                           scales.data() + r * blocks);
    for (size_t b = 0; b < blocks; ++b) {
      uint8_t* out = panel + geometry.values(b);
      for (size_t r = 0; r < kRows; ++r) {
        const uint8_t* v = values.data() + (r * blocks + b) * kQuantBlock;
        if (dtype == DType::kInt8) {
          std::memcpy(out + 16 * r, v, 16);
          std::memcpy(out + 64 + 16 * r, v + 16, 16);
        } else {
          for (size_t i = 0; i < 16; ++i) out[16 * r + i] = static_cast<uint8_t>(v[i] | (v[i + 16] << 4));
        }
        std::memcpy(panel + geometry.scales(b) + 2 * r, &scales[r * blocks + b], 2);
      }
    }
  }
}

void dequantize_panel_rows(DType dtype, const uint8_t* data, size_t rows, size_t cols, size_t r0, size_t r1,
                           float* out) {
  const size_t blocks = quant_blocks(cols), row_bytes = quantized_row_bytes(dtype, cols);
  const size_t panel_rows = rows / kRows * kRows;
  static const bool vnni = has_avx512_vnni();
  const int zero = dtype == DType::kInt8 ? 128 : 8;
  for (size_t j = r0; j < r1; ++j) {
    float* y = out + (j - r0) * cols;
    if (j >= panel_rows) {  // a trailing row in the per-row layout
      dequantize_weight_rows(dtype, data + j * row_bytes, 1, cols, y);
      continue;
    }
    const uint8_t* panel = data + (j / kRows) * kRows * row_bytes;
    const size_t r = j % kRows;
    size_t b = 0;
    if (vnni) {
      b = cols / kQuantBlock;
      dequantize_panel_row_avx512(dtype == DType::kInt8, panel, blocks, b, r, y);
    }
    for (; b < blocks; ++b) {
      const float d = panel_scale(panel, blocks, dtype, b, r);
      const size_t n = std::min(kQuantBlock, cols - b * kQuantBlock);
      float* yb = y + b * kQuantBlock;
      for (size_t i = 0; i < n; ++i) yb[i] = d * static_cast<float>(panel_value(dtype, panel, blocks, b, r, i) - zero);
    }
  }
}

void prepare_panel_activation(const QuantizedActivation& x, size_t blocks, float* scale4, float* offset4) {
  for (size_t b = 0; b < blocks; ++b) {
    const float off = x.scale[b] * static_cast<float>(x.sum[b]);
    for (size_t r = 0; r < kRows; ++r) {
      scale4[4 * b + r] = x.scale[b];
      offset4[4 * b + r] = off;
    }
  }
}

void dot_quant_panel(DType dtype, const uint8_t* panel, const PanelActivation& x, size_t blocks, float* out) {
  static const bool vnni = has_avx512_vnni();
  if (vnni) {
    if (dtype == DType::kInt8) dot_panel_avx512<true>(panel, x, blocks, out);
    else dot_panel_avx512<false>(panel, x, blocks, out);
    return;
  }
  // Without VNNI panels are not packed at load (quant_panels_enabled); this keeps a direct call correct.
  std::vector<float> scale(blocks);
  std::vector<int32_t> sum(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    scale[b] = x.scale4[4 * b];
    sum[b] = 0;
    for (size_t i = 0; i < kQuantBlock; ++i) sum[b] += x.q[b * kQuantBlock + i];
  }
  dot_quant_panel_reference(dtype, panel, QuantizedActivation{x.q, scale.data(), sum.data()}, blocks, out);
}

void dot_quant_panel_reference(DType dtype, const uint8_t* panel, const QuantizedActivation& x, size_t blocks,
                               float* out) {
  for (size_t r = 0; r < kRows; ++r) {
    float s = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      int32_t acc = 0;
      const int8_t* xq = x.q + b * kQuantBlock;
      if (dtype == DType::kInt8) {
        for (size_t i = 0; i < kQuantBlock; ++i) acc += (panel_value(dtype, panel, blocks, b, r, i) - 128) * xq[i];
      } else {
        for (size_t i = 0; i < kQuantBlock; ++i) acc += panel_value(dtype, panel, blocks, b, r, i) * xq[i];
        acc -= 8 * x.sum[b];
      }
      s += panel_scale(panel, blocks, dtype, b, r) * x.scale[b] * static_cast<float>(acc);
    }
    out[r] = s;
  }
}

}  // namespace pagoda::kernels
