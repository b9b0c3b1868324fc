#pragma once
// Element types pagoda stores (weights, KV cache) and the scalar conversions
// between them and f32, the CPU compute type. Conversions round to nearest even,
// like PyTorch, so CPU results match the reference bit for bit where they can.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace pagoda {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kFP8E4M3,  // KV cache only (float8_e4m3fn: no infinities, max 448)
  kInt8,     // KV cache; CPU weights as 32-element blocks with a scale (--quantization)
  kInt4,     // KV cache, two per byte; CPU weights as 32-element blocks with a scale
};

// "f32", "f16", "bf16", "fp8", "int8", "int4".
std::string_view dtype_name(DType dtype);
// Accepts the names above and safetensors' "F32", "F16", "BF16", "F8_E4M3", "I8".
std::optional<DType> dtype_from_name(std::string_view name);
// Storage bits per element: 32, 16, 16, 8, 8, 4.
int dtype_bits(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float f);

// float8_e4m3fn: saturates to +-448 (as PyTorch's conversion with clamping does).
float fp8e4m3_to_f32(uint8_t bits);
uint8_t f32_to_fp8e4m3(float f);

// The 256 values of float8_e4m3fn (index: the byte), for fast conversions.
const float* fp8e4m3_table();

// Rounds f through the type and back (e.g. to emulate a bf16 activation on the CPU).
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// fp8e4m3_to_f32(f32_to_fp8e4m3(f)) without the byte: saturates at +-448, rounds
// to nearest even, subnormals in steps of 2^-9; NaN stays NaN.
float round_to_fp8e4m3(float f);

// Converts n elements of src (of dtype) into f32.
void convert_to_f32(DType dtype, const void* src, float* dst, size_t n);

}  // namespace pagoda
