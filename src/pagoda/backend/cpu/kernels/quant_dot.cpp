#include "pagoda/backend/cpu/kernels/quant_dot.h"

#include <immintrin.h>

#include "pagoda/backend/cpu/kernels/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pagoda::kernels {

namespace {

constexpr size_t kQ8BlockBytes = 2 + kQuantBlock;      // f16 scale + 32 x int8
constexpr size_t kQ4BlockBytes = 2 + kQuantBlock / 2;  // f16 scale + 32 nibbles

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// One block of 32 values from x (n <= 32 real ones, the rest zero).
void load_block(const float* x, size_t n, float* block) {
  std::fill(block, block + kQuantBlock, 0.0f);
  std::copy_n(x, n, block);
}

void quantize_q8_row(const float* x, size_t cols, uint8_t* out) {
  float block[kQuantBlock];
  for (size_t b = 0; b < quant_blocks(cols); ++b, out += kQ8BlockBytes) {
    load_block(x + b * kQuantBlock, std::min(kQuantBlock, cols - b * kQuantBlock), block);
    float amax = 0.0f;
    for (float v : block) amax = std::max(amax, std::fabs(v));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f32_to_f16(d));
    for (size_t i = 0; i < kQuantBlock; ++i)
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::lround(block[i] * id), -127L, 127L)));
  }
}

// As llama.cpp's Q4_0: the value of largest magnitude maps to -8, so the range
// [-8, 7] is used fully on that side.
void quantize_q4_row(const float* x, size_t cols, uint8_t* out) {
  float block[kQuantBlock];
  for (size_t b = 0; b < quant_blocks(cols); ++b, out += kQ4BlockBytes) {
    load_block(x + b * kQuantBlock, std::min(kQuantBlock, cols - b * kQuantBlock), block);
    float amax = 0.0f, max = 0.0f;
    for (float v : block) {
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f32_to_f16(d));
    auto q = [&](size_t i) {
      return static_cast<uint8_t>(std::clamp(static_cast<int>(std::floor(block[i] * id + 8.5f)), 0, 15));
    };
    for (size_t j = 0; j < kQuantBlock / 2; ++j) out[2 + j] = static_cast<uint8_t>(q(j) | (q(j + 16) << 4));
  }
}

void dequantize_q8_row(const uint8_t* in, size_t cols, float* y) {
  for (size_t b = 0; b < quant_blocks(cols); ++b, in += kQ8BlockBytes) {
    const float d = f16_to_f32(load_u16(in));
    const size_t n = std::min(kQuantBlock, cols - b * kQuantBlock);
    for (size_t i = 0; i < n; ++i) y[b * kQuantBlock + i] = d * static_cast<float>(static_cast<int8_t>(in[2 + i]));
  }
}

void dequantize_q4_row(const uint8_t* in, size_t cols, float* y) {
  for (size_t b = 0; b < quant_blocks(cols); ++b, in += kQ4BlockBytes) {
    const float d = f16_to_f32(load_u16(in));
    const size_t n = std::min(kQuantBlock, cols - b * kQuantBlock);
    for (size_t i = 0; i < n; ++i) {
      const int q = i < 16 ? (in[2 + i] & 0x0F) : (in[2 + i - 16] >> 4);
      y[b * kQuantBlock + i] = d * static_cast<float>(q - 8);
    }
  }
}

// ---- generic ----
float dot_q8_generic(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  float s = 0.0f;
  for (size_t b = 0; b < blocks; ++b, row += kQ8BlockBytes) {
    int32_t acc = 0;
    const int8_t* xq = x.q + b * kQuantBlock;
    for (size_t i = 0; i < kQuantBlock; ++i) acc += static_cast<int8_t>(row[2 + i]) * xq[i];
    s += f16_to_f32(load_u16(row)) * x.scale[b] * static_cast<float>(acc);
  }
  return s;
}

float dot_q4_generic(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  float s = 0.0f;
  for (size_t b = 0; b < blocks; ++b, row += kQ4BlockBytes) {
    int32_t acc = 0;
    const int8_t* xq = x.q + b * kQuantBlock;
    for (size_t j = 0; j < kQuantBlock / 2; ++j) {
      acc += (row[2 + j] & 0x0F) * xq[j];
      acc += (row[2 + j] >> 4) * xq[j + 16];
    }
    acc -= 8 * x.sum[b];
    s += f16_to_f32(load_u16(row)) * x.scale[b] * static_cast<float>(acc);
  }
  return s;
}

float dot_generic(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) {
  return dtype == DType::kInt8 ? dot_q8_generic(row, x, blocks) : dot_q4_generic(row, x, blocks);
}

// ---- AVX2 (+ AVX-512 VNNI on 256-bit lanes) ----
#define PAGODA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PAGODA_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

PAGODA_AVX2 inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

PAGODA_AVX2 inline float load_scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }

// The 32 nibbles of a Q4 block as bytes 0..15, in element order.
PAGODA_AVX2 inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// acc + products of unsigned bytes u and signed bytes s, summed in groups of four into int32 lanes.
PAGODA_AVX2 inline __m256i dot_u8s8_avx2(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
PAGODA_VNNI inline __m256i dot_u8s8_vnni(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }

// The Q8 and Q4 dot products for one target and integer product (dot_u8s8_*):
// written once, compiled per target so the AVX2 copy holds no AVX-512 code.
// Blocks go in pairs into two register accumulators, which hides the add
// latency without indexing an accumulator array (that kept it in memory).
#define PAGODA_QUANT_DOTS(SUFFIX, TARGET, DOT_U8S8)                                                   \
  TARGET inline __m256 q8_block_##SUFFIX(const uint8_t* p, const int8_t* xq, float xs, __m256 acc) {  \
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));                   \
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));                     \
    const __m256i prod = DOT_U8S8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w)); \
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(load_scale(p) * xs), acc);        \
  }                                                                                                   \
  /* sum (q - 8) x = sum q x - 8 sum x: the offset starts lane 0, the lanes are summed at the end */  \
  TARGET inline __m256 q4_block_##SUFFIX(const uint8_t* p, const int8_t* xq, float xs, int32_t xsum,  \
                                         __m256 acc) {                                                \
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));                     \
    const __m256i offset = _mm256_castsi128_si256(_mm_cvtsi32_si128(-8 * xsum));                      \
    const __m256i prod = DOT_U8S8(offset, unpack_nibbles(p + 2), xv);                                  \
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(load_scale(p) * xs), acc);        \
  }                                                                                                   \
  TARGET float dot_q8_##SUFFIX(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {     \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                    \
    size_t b = 0;                                                                                     \
    for (; b + 2 <= blocks; b += 2) {                                                                 \
      acc0 = q8_block_##SUFFIX(row + b * kQ8BlockBytes, x.q + b * kQuantBlock, x.scale[b], acc0);     \
      acc1 = q8_block_##SUFFIX(row + (b + 1) * kQ8BlockBytes, x.q + (b + 1) * kQuantBlock, x.scale[b + 1], acc1); \
    }                                                                                                 \
    if (b < blocks) acc0 = q8_block_##SUFFIX(row + b * kQ8BlockBytes, x.q + b * kQuantBlock, x.scale[b], acc0); \
    return hsum(_mm256_add_ps(acc0, acc1));                                                           \
  }                                                                                                   \
  TARGET float dot_q4_##SUFFIX(const uint8_t* row, const QuantizedActivation& x, size_t blocks) {     \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                    \
    size_t b = 0;                                                                                     \
    for (; b + 2 <= blocks; b += 2) {                                                                 \
      acc0 = q4_block_##SUFFIX(row + b * kQ4BlockBytes, x.q + b * kQuantBlock, x.scale[b], x.sum[b], acc0); \
      acc1 = q4_block_##SUFFIX(row + (b + 1) * kQ4BlockBytes, x.q + (b + 1) * kQuantBlock, x.scale[b + 1], \
                               x.sum[b + 1], acc1);                                                   \
    }                                                                                                 \
    if (b < blocks)                                                                                   \
      acc0 = q4_block_##SUFFIX(row + b * kQ4BlockBytes, x.q + b * kQuantBlock, x.scale[b], x.sum[b], acc0); \
    return hsum(_mm256_add_ps(acc0, acc1));                                                           \
  }                                                                                                   \
  TARGET float dot_##SUFFIX(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks) { \
    return dtype == DType::kInt8 ? dot_q8_##SUFFIX(row, x, blocks) : dot_q4_##SUFFIX(row, x, blocks); \
  }

PAGODA_QUANT_DOTS(avx2, PAGODA_AVX2, dot_u8s8_avx2)
PAGODA_QUANT_DOTS(vnni, PAGODA_VNNI, dot_u8s8_vnni)
#undef PAGODA_QUANT_DOTS

struct Dispatch {
  float (*dot)(DType, const uint8_t*, const QuantizedActivation&, size_t);
  const char* name;
};

const Dispatch& dispatch() {
  static const Dispatch d = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      cpu_has_f16c();
    if (avx2 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
      return Dispatch{dot_vnni, "avx512vnni"};
    if (avx2) return Dispatch{dot_avx2, "avx2"};
    return Dispatch{dot_generic, "generic"};
  }();
  return d;
}

}  // namespace

size_t quantized_row_bytes(DType dtype, size_t cols) {
  return quant_blocks(cols) * (dtype == DType::kInt8 ? kQ8BlockBytes : kQ4BlockBytes);
}

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

void quantize_activation(const float* x, size_t k, int8_t* q, float* scale, int32_t* sum) {
  for (size_t b = 0; b < quant_blocks(k); ++b) {
    const size_t n = std::min(kQuantBlock, k - b * kQuantBlock);
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    int8_t* qb = q + b * kQuantBlock;
    for (size_t i = 0; i < kQuantBlock; ++i) {
      qb[i] = i < n ? static_cast<int8_t>(std::clamp(std::lround(xb[i] * id), -127L, 127L)) : int8_t{0};
      s += qb[i];
    }
    scale[b] = d;
    sum[b] = s;
  }
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
