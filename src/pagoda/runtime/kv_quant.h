#pragma once
// The quantized KV formats, shared by the CPU and CUDA kernels so both write
// the same bytes and read them back the same way. runtime/kv_sizing.h counts the
// bytes; this header says what they are. Header-only, C++17, host + device
// (included from .cu files): no std:: containers.
//
// A pool of one layer holds, for K and for V separately:
//   data   [num_blocks, block_size, num_kv_heads, kv_head_data_bytes(D, dtype)]
//   scales [num_blocks, num_kv_heads, block_size, kv_scale_groups(D, dtype)] of 4-byte records
// so the (block b, slot s, head h) vector has its bytes at
//   ((b * block_size + s) * num_kv_heads + h) * data_bytes
// and its scale records at ((b * num_kv_heads + h) * block_size + s) * groups
// (kv_scale_vector): one head's records of a block are contiguous, so a decode
// kernel reads those of 4 tokens (fp8 / int8) with one 16-byte load instead of
// a 4-byte load per token: a quarter of the copies, and whole sectors rather
// than scattered 4-byte pieces (docs/KERNELS.md, "Quantized decode").
//
//   fp8 e4m3  one f32 scale per (token, head): x ~= fp8(x / scale) * scale,
//             scale = amax / 448 (1 when the vector is all zeros).
//   int8      one record {f16 scale, f16 zero} per (token, head), asymmetric:
//             x ~= q * scale + zero, q in [0, 255], zero = f16(min),
//             scale = f16((max - zero) / 255) (1 when max == zero).
//   int4      the int8 scheme per group of 32 elements (the last group of a
//             head dim not divisible by 32 is shorter), q in [0, 15]; element
//             2i in the low nibble of byte i, 2i + 1 in the high nibble.
//
// The arithmetic, identical on host and device (f32, round-to-nearest-even,
// no fast-math) so both write the same codes:
//   fp8:  amax = max |x|; scale = amax > 0 ? amax / 448 : 1; inv = 1 / scale;
//         code = fp8_e4m3_satfinite(x * inv).        Read: fp8(code) * scale.
//   int:  zero = f16(min x); s = f16((max x - float(zero)) / levels);
//         if s == 0: s = f16(1); inv = 1 / float(s);
//         code = clamp(rint((x - float(zero)) * inv), 0, levels).
//                                                    Read: code * s + zero.
// i.e. quantization uses the scale and zero *as stored* (after rounding to f16).

#include <cstdint>

#if defined(__CUDACC__)
#define PAGODA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PAGODA_HOST_DEVICE inline
#endif

namespace pagoda::kernels {

enum class KvQuant : int32_t { kNone = 0, kFP8E4M3 = 1, kInt8 = 2, kInt4 = 3 };

constexpr int32_t kKvInt4GroupSize = 32;
constexpr float kKvFp8Max = 448.0f;

// Bytes of one (token, head) vector of head_dim elements.
PAGODA_HOST_DEVICE int32_t kv_head_data_bytes(int32_t head_dim, KvQuant q) {
  return q == KvQuant::kInt4 ? (head_dim + 1) / 2 : head_dim;  // kNone: caller's own element size
}
// 4-byte scale records per (token, head): 0 for unquantized.
PAGODA_HOST_DEVICE int32_t kv_scale_groups(int32_t head_dim, KvQuant q) {
  switch (q) {
    case KvQuant::kFP8E4M3:
    case KvQuant::kInt8: return 1;
    case KvQuant::kInt4: return (head_dim + kKvInt4GroupSize - 1) / kKvInt4GroupSize;
    default: return 0;
  }
}
// Elements covered by one scale record.
PAGODA_HOST_DEVICE int32_t kv_scale_group_size(int32_t head_dim, KvQuant q) {
  return q == KvQuant::kInt4 ? kKvInt4GroupSize : head_dim;
}
PAGODA_HOST_DEVICE int32_t kv_quant_levels(KvQuant q) { return q == KvQuant::kInt4 ? 15 : 255; }

// Record vector (multiply by kv_scale_groups for the record index) of the
// vector of pool slot `slot` = b * block_size + s and head h: (b * num_kv_heads + h) * block_size + s.
PAGODA_HOST_DEVICE int64_t kv_scale_vector(int64_t slot, int32_t head, int32_t block_size, int32_t num_kv_heads) {
  const int64_t block = slot / block_size;
  return (block * num_kv_heads + head) * block_size + (slot - block * block_size);
}

// The 4-byte record of the integer formats: raw f16 bits of scale and zero.
struct KvScaleZero {
  uint16_t scale_f16;
  uint16_t zero_f16;
};
static_assert(sizeof(KvScaleZero) == 4, "scale records are 4 bytes");

}  // namespace pagoda::kernels
