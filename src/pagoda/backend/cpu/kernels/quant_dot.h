#pragma once
// Block-quantized weight rows on the CPU (--quantization int8|int4) and the
// integer dot products that read them. The numbers are llama.cpp's Q8_0 / Q4_0
// (blocks of 32 weights with an f16 scale d; int8: w = d * q, |q| <= 127;
// int4: w = d * (q - 8), q a nibble 0..15, the value of largest magnitude at
// -8), laid out per row for the SIMD dot rather than block by block:
//
//   DType::kInt8: the row's blocks' 32 bytes each, stored as q + 128 (unsigned),
//                 then the row's f16 scales (34 bytes per block in all).
//   DType::kInt4: the row's nibbles, 16 bytes per block, then the f16 scales
//                 (18 bytes per block). Blocks go in groups of four (a "quad",
//                 64 bytes): byte t of a quad holds element t of blocks 0|1
//                 (concatenated, 64 elements) in its low nibble and element t
//                 of blocks 2|3 in its high nibble, so one mask gives two
//                 whole blocks in element order and one shift + mask the other
//                 two. The last blocks % 4 blocks are 16 bytes each: byte j
//                 holds element j (low) and j + 16 (high).
//
// A row of k weights takes ceil(k / 32) blocks; the last block is padded with
// zeros. The activation side is quantized per block of 32 to int8 (an f32
// scale, symmetric, |q| <= 127, plus the block's sum of q), so a dot product
// stays in integers within a block: AVX-512 VNNI vpdpbusd of the unsigned
// weight bytes by the signed activation bytes, two blocks per 512-bit product,
// with the unsigned offset (128 or 8 times the activation block's sum)
// subtracted once per row; else AVX2 maddubs; else plain loops (picked at run
// time). The result is scaled to f32 once per block. On AVX-512 VNNI the
// model's matrices are regrouped at load into four-row panels of these same
// bytes (quant_panels.h) and decoded by a panel kernel instead.
//
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

inline constexpr size_t kQuantBlock = 32;

inline size_t quant_blocks(size_t cols) { return (cols + kQuantBlock - 1) / kQuantBlock; }
// Bytes of one quantized row of `cols` weights (dtype kInt8 or kInt4).
size_t quantized_row_bytes(DType dtype, size_t cols);
// True for the block-quantized weight dtypes (kInt8, kInt4).
inline bool is_quantized_weight(DType dtype) { return dtype == DType::kInt8 || dtype == DType::kInt4; }

// Quantizes rows x cols f32 weights into dst (rows * quantized_row_bytes bytes).
void quantize_weight_rows(DType dtype, const float* src, size_t rows, size_t cols, uint8_t* dst);
// The inverse: rows x cols f32 from quantized rows.
void dequantize_weight_rows(DType dtype, const uint8_t* src, size_t rows, size_t cols, float* dst);

// The stored values of one quantized row of `blocks` blocks (int8: q + 128; int4: the nibble 0..15),
// blocks * 32 bytes in element order, and its f16 scales (raw bits, one per block): what a repacking
// (quant_panels.h) reads.
void quantized_row_values(DType dtype, const uint8_t* row, size_t blocks, uint8_t* values, uint16_t* scales);

// One activation row quantized per block: q holds quant_blocks(k) * 32 int8
// (zero padded), scale and sum one entry per block.
struct QuantizedActivation {
  const int8_t* q;
  const float* scale;
  const int32_t* sum;
};
void quantize_activation(const float* x, size_t k, int8_t* q, float* scale, int32_t* sum);

// sum_i w[i] * x[i] for one quantized weight row (dtype kInt8 or kInt4) of
// `blocks` blocks against a quantized activation of the same length.
float dot_quantized(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks);
// The same with plain loops (the reference the SIMD versions are tested against).
float dot_quantized_reference(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks);

// The AVX2 (maddubs) version even where VNNI is picked, so tests cover both
// on a VNNI machine; the reference where the CPU lacks AVX2.
float dot_quantized_avx2(DType dtype, const uint8_t* row, const QuantizedActivation& x, size_t blocks);

// "avx512vnni" (512-bit vpdpbusd), "avx2" or "generic": which implementation the dispatch picked.
const char* quant_dot_implementation();

}  // namespace pagoda::kernels
