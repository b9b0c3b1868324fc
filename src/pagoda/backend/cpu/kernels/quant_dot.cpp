#include "pagoda/backend/cpu/kernels/quant_dot.h"

#include <immintrin.h>

#include "pagoda/backend/cpu/kernels/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace pagoda::kernels {

namespace {

constexpr size_t kQ8Bytes = kQuantBlock;      // 32 x (q + 128) per block
constexpr size_t kQ4Bytes = kQuantBlock / 2;  // 32 nibbles per block
constexpr size_t kQuad = 4;                   // int4 blocks interleaved per 64 bytes

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

size_t quant_bytes(DType dtype, size_t blocks) { return blocks * (dtype == DType::kInt8 ? kQ8Bytes : kQ4Bytes); }
// The f16 scales of a row follow its quantized values.
const uint8_t* row_scales(DType dtype, const uint8_t* row, size_t blocks) { return row + quant_bytes(dtype, blocks); }

// Where element i of int4 block b sits: a byte offset in the row and whether it is the high nibble.
struct NibblePos {
  size_t byte;
  bool high;
};
NibblePos q4_position(size_t blocks, size_t b, size_t i) {
  const size_t full = blocks / kQuad * kQuad;
  if (b < full) {
    const size_t in_quad = b % kQuad, base = (b / kQuad) * kQuad * kQ4Bytes;
    return {base + (in_quad % 2) * kQuantBlock + i, in_quad >= 2};
  }
  const size_t base = full * kQ4Bytes + (b - full) * kQ4Bytes;
  return {base + i % 16, i >= 16};
}

// One block of 32 values from x (n <= 32 real ones, the rest zero).
void load_block(const float* x, size_t n, float* block) {
  std::fill(block, block + kQuantBlock, 0.0f);
  std::copy_n(x, n, block);
}

int round_clamp(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi); }

// The weights' int8 rounding is the activations' (quantize_activation: d = amax / 127, ties to even), so
// it runs 8 lanes at a time where the CPU allows.
void quantize_q8_row(const float* x, size_t cols, uint8_t* out) {
  const size_t blocks = quant_blocks(cols);
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  thread_local std::vector<int32_t> sum;
  q.resize(blocks * kQuantBlock);
  d.resize(blocks);
  sum.resize(blocks);
  quantize_activation(x, cols, q.data(), d.data(), sum.data());
  uint8_t* scales = out + quant_bytes(DType::kInt8, blocks);
  for (size_t b = 0; b < blocks; ++b) store_u16(scales + 2 * b, f32_to_f16(d[b]));
  for (size_t i = 0; i < blocks * kQuantBlock; ++i) out[i] = static_cast<uint8_t>(q[i] + 128);
}

// As llama.cpp's Q4_0: the value of largest magnitude maps to -8, so the range
// [-8, 7] is used fully on that side.
void quantize_q4_row(const float* x, size_t cols, uint8_t* out) {
  const size_t blocks = quant_blocks(cols);
  thread_local std::vector<uint8_t> q;  // the nibble values, block after block
  q.resize(blocks * kQuantBlock);
  uint8_t* scales = out + quant_bytes(DType::kInt4, blocks);
  float block[kQuantBlock];
  for (size_t b = 0; b < blocks; ++b) {
    load_block(x + b * kQuantBlock, std::min(kQuantBlock, cols - b * kQuantBlock), block);
    float amax = 0.0f, max = 0.0f;
    for (float v : block) {
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(scales + 2 * b, f32_to_f16(d));
    for (size_t i = 0; i < kQuantBlock; ++i)
      q[b * kQuantBlock + i] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::floor(block[i] * id + 8.5f)), 0, 15));
  }
  const size_t full = blocks / kQuad * kQuad;
  for (size_t b = 0; b < full; b += kQuad) {  // quads: blocks b|b+1 low nibbles, b+2|b+3 high
    const uint8_t* lo = q.data() + b * kQuantBlock;
    const uint8_t* hi = lo + 2 * kQuantBlock;
    uint8_t* o = out + b * kQ4Bytes;
    for (size_t t = 0; t < 2 * kQuantBlock; ++t) o[t] = static_cast<uint8_t>(lo[t] | (hi[t] << 4));
  }
  for (size_t b = full; b < blocks; ++b) {  // tail blocks: byte j holds elements j and j + 16
    const uint8_t* qb = q.data() + b * kQuantBlock;
    for (size_t j = 0; j < kQ4Bytes; ++j) out[b * kQ4Bytes + j] = static_cast<uint8_t>(qb[j] | (qb[j + 16] << 4));
  }
}

int q8_value(const uint8_t* row, size_t b, size_t i) { return static_cast<int>(row[b * kQ8Bytes + i]) - 128; }
int q4_value(const uint8_t* row, size_t blocks, size_t b, size_t i) {  // 0..15, the stored nibble
  const NibblePos at = q4_position(blocks, b, i);
  return at.high ? row[at.byte] >> 4 : row[at.byte] & 0x0F;
}

void dequantize_q8_row(const uint8_t* in, size_t cols, float* y) {
  const size_t blocks = quant_blocks(cols);
  const uint8_t* scales = row_scales(DType::kInt8, in, blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(load_u16(scales + 2 * b));
    const size_t n = std::min(kQuantBlock, cols - b * kQuantBlock);
    const uint8_t* q = in + b * kQ8Bytes;
    float* out = y + b * kQuantBlock;
    for (size_t i = 0; i < n; ++i) out[i] = d * static_cast<float>(static_cast<int>(q[i]) - 128);
  }
}

void dequantize_q4_row(const uint8_t* in, size_t cols, float* y) {
  const size_t blocks = quant_blocks(cols);
  const uint8_t* scales = row_scales(DType::kInt4, in, blocks);
  float d[kQuad];
  const size_t full = blocks / kQuad * kQuad;
  // Whole quads, when all four blocks are whole (the common case: cols a multiple of 128).
  size_t b = 0;
  for (; b < full && (b + kQuad) * kQuantBlock <= cols; b += kQuad) {
    for (size_t j = 0; j < kQuad; ++j) d[j] = f16_to_f32(load_u16(scales + 2 * (b + j)));
    const uint8_t* q = in + b * kQ4Bytes;
    float* out = y + b * kQuantBlock;
    for (size_t i = 0; i < 2 * kQuantBlock; ++i) {
      const float dl = i < kQuantBlock ? d[0] : d[1], dh = i < kQuantBlock ? d[2] : d[3];
      out[i] = dl * static_cast<float>((q[i] & 0x0F) - 8);
      out[2 * kQuantBlock + i] = dh * static_cast<float>((q[i] >> 4) - 8);
    }
  }
  for (; b < blocks; ++b) {
    const float db = f16_to_f32(load_u16(scales + 2 * b));
    const size_t n = std::min(kQuantBlock, cols - b * kQuantBlock);
    for (size_t i = 0; i < n; ++i) y[b * kQuantBlock + i] = db * static_cast<float>(q4_value(in, blocks, b, i) - 8);
  }
}

// ---- generic (the reference) ----
float dot_q8_generic(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  const uint8_t* scales = row_scales(DType::kInt8, row, blocks);
  float s = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t acc = 0;
    const int8_t* xq = x.q + b * kQuantBlock;
    for (size_t i = 0; i < kQuantBlock; ++i) acc += q8_value(row, b, i) * xq[i];
    s += f16_to_f32(load_u16(scales + 2 * b)) * x.scale[b] * static_cast<float>(acc);
  }
  return s;
}

float dot_q4_generic(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  const uint8_t* scales = row_scales(DType::kInt4, row, blocks);
  float s = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    int32_t acc = 0;
    const int8_t* xq = x.q + b * kQuantBlock;
    for (size_t i = 0; i < kQuantBlock; ++i) acc += q4_value(row, blocks, b, i) * xq[i];
    acc -= 8 * x.sum[b];
    s += f16_to_f32(load_u16(scales + 2 * b)) * x.scale[b] * static_cast<float>(acc);
  }
  return s;
}

float dot_generic(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dtype == DType::kInt8 ? dot_q8_generic(row, x, blocks) : dot_q4_generic(row, x, blocks);
}

// ---- AVX2 and AVX-512 VNNI ----
#define PAGODA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PAGODA_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

PAGODA_AVX2 inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

PAGODA_AVX2 inline float load_scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }

// The 32 nibbles of a tail int4 block (byte j: element j low, j + 16 high) as bytes in element order.
PAGODA_AVX2 inline __m256i unpack_tail_nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Products of unsigned bytes u and signed bytes s summed in groups of four into int32 lanes (u <= 15 here:
// maddubs's int16 pair sums cannot saturate).
PAGODA_AVX2 inline __m256i dot_u8s8_avx2(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// AVX2: int8 by the sign trick on the stored q + 128 (flipped back to signed): |w| * sign(x, w).
PAGODA_AVX2 float dot_q8_avx2(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  const uint8_t* scales = row_scales(DType::kInt8, row, blocks);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kQ8Bytes)), flip);
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * kQuantBlock));
    const __m256i prod = dot_u8s8_avx2(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
    const __m256 c = _mm256_set1_ps(load_scale(scales + 2 * b) * x.scale[b]);
    if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), c, acc1);
    else acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), c, acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// One int4 block (unpacked nibbles u) into acc, the -8 * sum offset in lane 0.
PAGODA_AVX2 inline __m256 q4_block_avx2(const uint8_t* scales, const QuantizedActivation& x, size_t b, __m256i u,
                                        __m256 acc) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * kQuantBlock));
  const __m256i prod = _mm256_add_epi32(dot_u8s8_avx2(u, xv), _mm256_castsi128_si256(_mm_cvtsi32_si128(-8 * x.sum[b])));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(load_scale(scales + 2 * b) * x.scale[b]), acc);
}

// AVX2 int4: whole quads as two 32-byte halves (low nibbles blocks 0 / 1, high nibbles 2 / 3), then the
// tail blocks; sum (q - 8) x = sum q x - 8 sum x, the offset folded in per block.
PAGODA_AVX2 float dot_q4_avx2(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  const uint8_t* scales = row_scales(DType::kInt4, row, blocks);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const size_t full = blocks / kQuad * kQuad;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  size_t b = 0;
  for (; b < full; b += kQuad) {
    const uint8_t* q = row + b * kQ4Bytes;
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
    acc0 = q4_block_avx2(scales, x, b, _mm256_and_si256(v0, mask), acc0);
    acc1 = q4_block_avx2(scales, x, b + 1, _mm256_and_si256(v1, mask), acc1);
    acc0 = q4_block_avx2(scales, x, b + 2, _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask), acc0);
    acc1 = q4_block_avx2(scales, x, b + 3, _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask), acc1);
  }
  for (; b < blocks; ++b) acc0 = q4_block_avx2(scales, x, b, unpack_tail_nibbles(row + b * kQ4Bytes), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_avx2(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dtype == DType::kInt8 ? dot_q8_avx2(row, x, blocks) : dot_q4_avx2(row, x, blocks);
}

// AVX-512 VNNI. vpdpbusd multiplies unsigned weight bytes (q + 128 for int8, the nibble for int4) by the
// signed activation bytes, so no per-vector sign handling; the offset (128 or 8 times the activation
// block's sum) is subtracted once per row from a running sum of scale_w * scale_x * sum_x. The blocks go
// 16 at a time: their 16 combined scales in one register, two blocks (one 512-bit product) per
// permute-and-FMA; the rest of the row 32 bytes at a time.
// GCC 12's unmasked forms of some AVX-512 intrinsics pass an "undefined" vector
// through and warn about it (-Wuninitialized) at every use: the zero-masked
// forms with every lane kept are the same instructions without the warning.
constexpr __mmask16 kAll16 = 0xFFFF;

PAGODA_AVX512 inline float hsum512(__m512 v) {
  const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(v), 0));
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(v), 1));
  return hsum(_mm256_add_ps(lo, hi));
}

alignas(64) constexpr int32_t kPairIndex[8][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},         {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},         {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},         {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13}, {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};

PAGODA_AVX512 inline __m512i pair_index(size_t k) {
  return _mm512_load_si512(reinterpret_cast<const void*>(kPairIndex[k]));
}

// Combined scales of blocks [b, b + 16), and the offset term's running sum.
PAGODA_AVX512 inline __m512 combined_scales(const uint8_t* scales, const QuantizedActivation& x, size_t b,
                                            __m512& offset_sum) {
  const __m512 c = _mm512_mul_ps(_mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 2 * b))),
                                 _mm512_loadu_ps(x.scale + b));
  offset_sum = _mm512_fmadd_ps(c, _mm512_maskz_cvtepi32_ps(kAll16, _mm512_loadu_si512(x.sum + b)), offset_sum);
  return c;
}

// One block of 32 unsigned bytes u against the activation's block b, 256-bit.
PAGODA_AVX512 inline __m256 tail_block(const uint8_t* scales, const QuantizedActivation& x, size_t b, __m256i u,
                                       __m256 acc, float& offset_sum) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * kQuantBlock));
  const __m256i prod = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xv);
  const float c = load_scale(scales + 2 * b) * x.scale[b];
  offset_sum += c * static_cast<float>(x.sum[b]);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(c), acc);
}

PAGODA_AVX512 inline __m512 pair_product(__m512i u, const int8_t* xq, __m512 scale, __m512 acc) {
  const __m512i prod = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xq));
  return _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(kAll16, prod), scale, acc);
}

PAGODA_AVX512 float dot_q8_avx512(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  const uint8_t* scales = row_scales(DType::kInt8, row, blocks);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), offset = _mm512_setzero_ps();
  size_t b = 0;
  for (; b + 16 <= blocks; b += 16) {
    const __m512 c = combined_scales(scales, x, b, offset);
#pragma GCC unroll 4
    for (size_t k = 0; k < 8; k += 2) {
      const uint8_t* w = row + (b + 2 * k) * kQ8Bytes;
      const int8_t* xq = x.q + (b + 2 * k) * kQuantBlock;
      acc0 = pair_product(_mm512_loadu_si512(w), xq, _mm512_maskz_permutexvar_ps(kAll16, pair_index(k), c), acc0);
      acc1 = pair_product(_mm512_loadu_si512(w + 64), xq + 64, _mm512_maskz_permutexvar_ps(kAll16, pair_index(k + 1), c), acc1);
    }
  }
  __m256 tail = _mm256_setzero_ps();
  float tail_offset = 0.0f;
  for (; b < blocks; ++b)
    tail = tail_block(scales, x, b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kQ8Bytes)), tail,
                      tail_offset);
  const float sum = hsum512(_mm512_add_ps(acc0, acc1)) + hsum(tail);
  return sum - 128.0f * (hsum512(offset) + tail_offset);
}

PAGODA_AVX512 float dot_q4_avx512(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  const uint8_t* scales = row_scales(DType::kInt4, row, blocks);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), offset = _mm512_setzero_ps();
  size_t b = 0;
  for (; b + 16 <= blocks; b += 16) {  // four whole quads
    const __m512 c = combined_scales(scales, x, b, offset);
#pragma GCC unroll 4
    for (size_t k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(row + (b + kQuad * k) * kQ4Bytes);
      const int8_t* xq = x.q + (b + kQuad * k) * kQuantBlock;
      acc0 = pair_product(_mm512_and_si512(v, mask), xq, _mm512_maskz_permutexvar_ps(kAll16, pair_index(2 * k), c), acc0);
      acc1 = pair_product(_mm512_and_si512(_mm512_srli_epi16(v, 4), mask), xq + 64,
                          _mm512_maskz_permutexvar_ps(kAll16, pair_index(2 * k + 1), c), acc1);
    }
  }
  __m256 tail = _mm256_setzero_ps();
  float tail_offset = 0.0f;
  const __m256i mask256 = _mm256_set1_epi8(0x0F);
  for (; b + kQuad <= blocks; b += kQuad) {  // whole quads left
    const uint8_t* q = row + b * kQ4Bytes;
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
    tail = tail_block(scales, x, b, _mm256_and_si256(v0, mask256), tail, tail_offset);
    tail = tail_block(scales, x, b + 1, _mm256_and_si256(v1, mask256), tail, tail_offset);
    tail = tail_block(scales, x, b + 2, _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask256), tail, tail_offset);
    tail = tail_block(scales, x, b + 3, _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask256), tail, tail_offset);
  }
  for (; b < blocks; ++b) tail = tail_block(scales, x, b, unpack_tail_nibbles(row + b * kQ4Bytes), tail, tail_offset);
  const float sum = hsum512(_mm512_add_ps(acc0, acc1)) + hsum(tail);
  return sum - 8.0f * (hsum512(offset) + tail_offset);
}

float dot_avx512(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dtype == DType::kInt8 ? dot_q8_avx512(row, x, blocks) : dot_q4_avx512(row, x, blocks);
}

// Activation quantization, 8 lanes at a time (round to nearest even, as std::nearbyint in the generic loop).
PAGODA_AVX2 void quantize_activation_avx2(const float* x, size_t k, int8_t* q, float* scale, int32_t* sum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const size_t whole = k / kQuantBlock;
  for (size_t b = 0; b < whole; ++b) {
    const float* xb = x + b * kQuantBlock;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float d = _mm_cvtss_f32(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i qi[4];
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));
      s = _mm256_add_epi32(s, qi[i]);
    }
    // int32 -> int8 (|q| <= 127, no saturation), then undo the packs' lane interleave.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQuantBlock), ordered);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    scale[b] = d;
    sum[b] = _mm_cvtsi128_si32(s4);
  }
}

struct Dispatch {
  float (*dot)(DType, const uint8_t*, const QuantizedActivation&, size_t);
  bool avx2_activation;
  const char* name;
};

const Dispatch& dispatch() {
  static const Dispatch d = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      cpu_has_f16c();
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
      return Dispatch{dot_avx512, true, "avx512vnni"};
    if (avx2) return Dispatch{dot_avx2, true, "avx2"};
    return Dispatch{dot_generic, false, "generic"};
  }();
  return d;
}

void quantize_activation_generic(const float* x, size_t k, int8_t* q, float* scale, int32_t* sum, size_t from) {
  for (size_t b = from; b < quant_blocks(k); ++b) {
    const size_t n = std::min(kQuantBlock, k - b * kQuantBlock);
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    int8_t* qb = q + b * kQuantBlock;
    for (size_t i = 0; i < kQuantBlock; ++i) {
      qb[i] = i < n ? static_cast<int8_t>(round_clamp(xb[i] * id, -127, 127)) : int8_t{0};
      s += qb[i];
    }
    scale[b] = d;
    sum[b] = s;
  }
}

}  // namespace

size_t quantized_row_bytes(DType dtype, size_t cols) { return quant_bytes(dtype, quant_blocks(cols)) + 2 * quant_blocks(cols); }

void quantize_weight_rows(DType dtype, const float* src, size_t rows, size_t cols, uint8_t* dst) {
  const size_t row_bytes = quantized_row_bytes(dtype, cols);
  for (size_t r = 0; r < rows; ++r) {
    if (dtype == DType::kInt8) quantize_q8_row(src + r * cols, cols, dst + r * row_bytes);
    else quantize_q4_row(src + r * cols, cols, dst + r * row_bytes);
  }
}

void dequantize_weight_rows(DType dtype, const uint8_t* src, size_t rows, size_t cols, float* dst) {
  const size_t row_bytes = quantized_row_bytes(dtype, cols);
  for (size_t r = 0; r < rows; ++r) {
    if (dtype == DType::kInt8) dequantize_q8_row(src + r * row_bytes, cols, dst + r * cols);
    else dequantize_q4_row(src + r * row_bytes, cols, dst + r * cols);
  }
}

void quantized_row_values(DType dtype, const uint8_t* row, size_t blocks, uint8_t* values, uint16_t* scales) {
  const uint8_t* s = row_scales(dtype, row, blocks);
  for (size_t b = 0; b < blocks; ++b) scales[b] = load_u16(s + 2 * b);
  if (dtype == DType::kInt8) {
    std::memcpy(values, row, blocks * kQ8Bytes);
    return;
  }
  const size_t full = blocks / kQuad * kQuad;
  for (size_t b = 0; b < full; b += kQuad) {  // a quad: byte t low nibble element t of blocks b|b+1, high b+2|b+3
    const uint8_t* q = row + b * kQ4Bytes;
    uint8_t* v = values + b * kQuantBlock;
    for (size_t t = 0; t < 2 * kQuantBlock; ++t) {
      v[t] = q[t] & 0x0F;
      v[2 * kQuantBlock + t] = static_cast<uint8_t>(q[t] >> 4);
    }
  }
  for (size_t b = full; b < blocks; ++b)
    for (size_t i = 0; i < kQuantBlock; ++i) values[b * kQuantBlock + i] = static_cast<uint8_t>(q4_value(row, blocks, b, i));
}

void quantize_activation(const float* x, size_t k, int8_t* q, float* scale, int32_t* sum) {
  size_t from = 0;
  if (dispatch().avx2_activation) {
    quantize_activation_avx2(x, k, q, scale, sum);
    from = k / kQuantBlock;
  }
  quantize_activation_generic(x, k, q, scale, sum, from);
}

float dot_quantized(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dispatch().dot(dtype, row, x, blocks);
}
float dot_quantized_reference(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dot_generic(dtype, row, x, blocks);
}
float dot_quantized_avx2(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dispatch().dot == dot_generic ? dot_generic(dtype, row, x, blocks) : dot_avx2(dtype, row, x, blocks);
}
const char* quant_dot_implementation() { return dispatch().name; }

}  // namespace pagoda::kernels
