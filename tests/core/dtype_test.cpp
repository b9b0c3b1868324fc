#include "pagoda/core/dtype.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

namespace pagoda {
namespace {

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 ties up to 1 + 2^-6 (even mantissa).
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DTypeTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf / nan
    EXPECT_EQ(f32_to_f16(f16_to_f32(bits)), bits) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(DTypeTest, Fp8E4M3RoundTripsAndSaturates) {
  for (uint32_t b = 0; b < 256; ++b) {
    uint8_t bits = static_cast<uint8_t>(b);
    if ((bits & 0x7f) == 0x7f) continue;  // nan
    float f = fp8e4m3_to_f32(bits);
    if (f == 0.0f) continue;  // -0 and +0
    EXPECT_EQ(f32_to_fp8e4m3(f), bits) << b;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4}) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_from_name("BF16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_name("F64").has_value());
}

}  // namespace
}  // namespace pagoda
