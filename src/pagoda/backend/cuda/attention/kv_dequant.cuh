#pragma once
// Reading the quantized KV formats of runtime/kv_quant.h in registers: codes
// to f32 (exact: every fp8 e4m3 value, 0..255 and 0..15 are f32 numbers) and
// the scale records. The value of element e is code(e) * scale + zero (zero is
// 0 for fp8). Device code only; include from .cu files (C++17).

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "pagoda/runtime/kv_quant.h"

namespace pagoda::kernels::cuda::device {

// Four fp8 e4m3 codes (byte i = element i) -> four floats, through the
// hardware's e4m3x2 -> f16x2 conversion.
__device__ __forceinline__ void fp8x4_to_float(uint32_t w, float* f) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo));
  const float2 b = __half22float2(__half2(hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// Four unsigned bytes -> four floats: the byte becomes the low mantissa bits of
// 2^23, which is then subtracted (exact; cheaper than an integer conversion).
__device__ __forceinline__ void u8x4_to_float(uint32_t w, float* f) {
  constexpr uint32_t kMagic = 0x4b000000u;  // 8388608.0f
  f[0] = __uint_as_float(__byte_perm(w, kMagic, 0x7540)) - 8388608.0f;
  f[1] = __uint_as_float(__byte_perm(w, kMagic, 0x7541)) - 8388608.0f;
  f[2] = __uint_as_float(__byte_perm(w, kMagic, 0x7542)) - 8388608.0f;
  f[3] = __uint_as_float(__byte_perm(w, kMagic, 0x7543)) - 8388608.0f;
}

// Eight 4-bit codes (element i in bits [4i, 4i + 4)) -> eight floats.
__device__ __forceinline__ void u4x8_to_float(uint32_t w, float* f) {
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(0x4b000000u | ((w >> (4 * i)) & 0xfu)) - 8388608.0f;
}

// The scale and zero of one 4-byte record (fp8: an f32 scale; int8 / int4:
// f16 scale and f16 zero).
struct KvScale {
  float scale;
  float zero;
};
__device__ __forceinline__ KvScale decode_scale_record(uint32_t record, KvQuant format) {
  if (format == KvQuant::kFP8E4M3) return {__uint_as_float(record), 0.0f};
  return {__half2float(__ushort_as_half(static_cast<unsigned short>(record & 0xffffu))),
          __half2float(__ushort_as_half(static_cast<unsigned short>(record >> 16)))};
}

// Codes of elements [first, first + 8) of one vector (first a multiple of 8)
// as floats, before scale and zero. data points at the vector's codes.
__device__ __forceinline__ void codes8_to_float(const uint8_t* data, int first, KvQuant format, float* f) {
  if (format == KvQuant::kInt4) {
    u4x8_to_float(*reinterpret_cast<const uint32_t*>(data + first / 2), f);
    return;
  }
  const uint2 w = *reinterpret_cast<const uint2*>(data + first);
  if (format == KvQuant::kFP8E4M3) {
    fp8x4_to_float(w.x, f);
    fp8x4_to_float(w.y, f + 4);
  } else {
    u8x4_to_float(w.x, f);
    u8x4_to_float(w.y, f + 4);
  }
}

}  // namespace pagoda::kernels::cuda::device
