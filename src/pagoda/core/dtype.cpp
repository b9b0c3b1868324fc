#include "pagoda/core/dtype.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>

namespace pagoda {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kFP8E4M3: return "fp8";
    case DType::kInt8: return "int8";
    case DType::kInt4: return "int4";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name == "f32" || name == "F32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "F16" || name == "float16" || name == "fp16") return DType::kF16;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp8" || name == "F8_E4M3" || name == "fp8_e4m3") return DType::kFP8E4M3;
  if (name == "int8" || name == "I8") return DType::kInt8;
  if (name == "int4") return DType::kInt4;
  return std::nullopt;
}

int dtype_bits(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 32;
    case DType::kF16:
    case DType::kBF16: return 16;
    case DType::kFP8E4M3:
    case DType::kInt8: return 8;
    case DType::kInt4: return 4;
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // overflow (rounds to inf)
  if (abs < 0x38800000u) {                                 // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                    // below half the smallest subnormal
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(abs >> 23);         // 14 + (113 - exp) ... in [14, 24]
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);   // round to nearest even
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float fp8e4m3_to_f32(uint8_t b) {
  uint32_t sign = b >> 7;
  uint32_t exp = (b >> 3) & 0xfu;
  uint32_t mant = b & 0x7u;
  float v;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, static_cast<int>(exp) - 7);
  }
  return sign ? -v : v;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::min(std::fabs(f), 448.0f);
  if (a < std::ldexp(1.0f, -10)) return sign;  // below half the smallest subnormal (2^-9)
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 7;  // biased exponent for 1.xxx form
  float scaled;
  if (exp <= 0) {  // subnormal: steps of 2^-9
    scaled = a * 512.0f;
    float r = std::nearbyint(scaled);  // ties to even under the default rounding mode
    int m = static_cast<int>(r);
    if (m >= 8) return sign | 0x08;  // rounded up into the smallest normal
    return sign | static_cast<uint8_t>(m);
  }
  scaled = std::ldexp(a, -(exp - 7)) * 8.0f;  // in [8, 16)
  int m = static_cast<int>(std::nearbyint(scaled));
  if (m == 16) { m = 8; ++exp; }
  if (exp > 15 || (exp == 15 && m - 8 > 6)) return sign | 0x7e;  // saturate at 448
  return sign | static_cast<uint8_t>(exp << 3) | static_cast<uint8_t>(m - 8);
}

const float* fp8e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table.data();
}

float round_to_fp8e4m3(float f) {
  if (std::isnan(f)) return f;
  const float a = std::min(std::fabs(f), 448.0f);
  float r;
  if (a < 0.015625f) {  // below the smallest normal 2^-6: subnormal steps of 2^-9
    r = std::nearbyint(a * 512.0f) * (1.0f / 512.0f);
  } else {  // keep 3 mantissa bits, round to nearest even
    uint32_t u;
    std::memcpy(&u, &a, sizeof u);
    u += 0x7ffffu + ((u >> 20) & 1u);
    u &= 0xfff00000u;
    std::memcpy(&r, &u, sizeof r);
    r = std::min(r, 448.0f);
  }
  return std::signbit(f) ? -r : r;
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kFP8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      const float* table = fp8e4m3_table();
      for (size_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::kInt8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kInt4:
      assert(false && "int4 needs a codec with scales, not a plain conversion");
      return;
  }
}

}  // namespace pagoda
