// The quantized KV formats of runtime/kv_quant.h on the CPU: exact codes for
// hand-computed vectors (so the CUDA kernel has a fixed target), round-trip
// error bounds per format over head dims that do and do not divide by 32, and
// the edge cases (zeros, all-equal, negative-only, one large outlier).

#include "pagoda/backend/cpu/kernels/kv_quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pagoda/backend/cpu/kernels/vector_dot.h"

#include "gpu/kv_quant_reference.h"
#include "kernels/random_data.h"

namespace pagoda::kernels {
namespace {

struct Stored {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
};

Stored quantize(const std::vector<float>& x, DType dtype) {
  const int32_t d = static_cast<int32_t>(x.size());
  Stored s;
  s.data.assign(kv_head_bytes(d, dtype), 0xAB);  // garbage first: every byte must be written
  s.scales.assign(kv_head_scale_bytes(d, dtype), 0xCD);
  quantize_kv_vector(x.data(), d, dtype, s.data.data(), s.scales.empty() ? nullptr : s.scales.data());
  return s;
}

std::vector<float> round_trip(const std::vector<float>& x, DType dtype) {
  const Stored s = quantize(x, dtype);
  std::vector<float> out(x.size(), -999.0f);
  dequantize_kv_vector(s.data.data(), s.scales.empty() ? nullptr : s.scales.data(),
                       static_cast<int32_t>(x.size()), dtype, out.data());
  return out;
}

float fp8_scale(const Stored& s) {
  float scale;
  std::memcpy(&scale, s.scales.data(), 4);
  return scale;
}

KvScaleZero record(const Stored& s, int32_t group) {
  KvScaleZero r;
  std::memcpy(&r, s.scales.data() + 4 * group, 4);
  return r;
}

// ------------------------------------------------------------ sizes

TEST(KvQuantizeTest, BytesPerVectorFollowTheFormat) {
  EXPECT_EQ(kv_head_bytes(128, DType::kF32), 512u);
  EXPECT_EQ(kv_head_bytes(128, DType::kBF16), 256u);
  EXPECT_EQ(kv_head_bytes(128, DType::kFP8E4M3), 128u);
  EXPECT_EQ(kv_head_bytes(128, DType::kInt8), 128u);
  EXPECT_EQ(kv_head_bytes(128, DType::kInt4), 64u);
  EXPECT_EQ(kv_head_bytes(33, DType::kInt4), 17u);
  EXPECT_EQ(kv_head_scale_bytes(128, DType::kF32), 0u);
  EXPECT_EQ(kv_head_scale_bytes(128, DType::kBF16), 0u);
  EXPECT_EQ(kv_head_scale_bytes(128, DType::kFP8E4M3), 4u);
  EXPECT_EQ(kv_head_scale_bytes(128, DType::kInt8), 4u);
  EXPECT_EQ(kv_head_scale_bytes(128, DType::kInt4), 16u);
  EXPECT_EQ(kv_head_scale_bytes(40, DType::kInt4), 8u);   // 32 + 8
  EXPECT_EQ(kv_head_scale_bytes(72, DType::kInt4), 12u);  // 32 + 32 + 8
}

// ------------------------------------------------------------ exact codes

TEST(KvQuantizeTest, Fp8ExactCodes) {
  // amax 448: scale 1, codes are plain e4m3.
  const Stored a = quantize({448.0f, -224.0f, 1.0f, 0.0f, -0.001953125f /* 2^-9: smallest subnormal */}, DType::kFP8E4M3);
  EXPECT_EQ(fp8_scale(a), 1.0f);
  EXPECT_EQ(a.data, (std::vector<uint8_t>{0x7e, 0xf6, 0x38, 0x00, 0x81}));
  // amax 2: scale 2/448, x * (1 / scale) = 224 x.
  const Stored b = quantize({2.0f, -1.0f, 0.5f, 0.25f}, DType::kFP8E4M3);
  EXPECT_EQ(fp8_scale(b), 2.0f / 448.0f);
  EXPECT_EQ(b.data, (std::vector<uint8_t>{0x7e, 0xf6, 0x6e, 0x66}));
  // Between 224 (0x76), 240 (0x77) and 256 (0x78) the steps are 16: halfway points go to the
  // even mantissa (232 -> 224, 248 -> 256), others to the nearest (236 -> 240).
  const Stored c = quantize({448.0f, 232.0f, 248.0f, 236.0f}, DType::kFP8E4M3);
  EXPECT_EQ(c.data, (std::vector<uint8_t>{0x7e, 0x76, 0x78, 0x77}));
}

TEST(KvQuantizeTest, Fp8FixedScaleCodesSaturateAndRecordTheScale) {
  // Per-tensor scale 0.5: codes are fp8(x / 0.5); 300 / 0.5 = 600 saturates at 448.
  const float x[4] = {1.0f, -0.75f, 300.0f, 0.0f};
  uint8_t codes[4];
  float record = 0.0f;
  quantize_kv_vector_fp8_fixed_scale(x, 4, 0.5f, codes, &record);
  EXPECT_EQ(record, 0.5f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], f32_to_fp8e4m3(x[i] * 2.0f)) << i;
  float back[4];
  dequantize_kv_vector(codes, &record, 4, DType::kFP8E4M3, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -0.75f);
  EXPECT_EQ(back[2], 224.0f);  // 448 x 0.5: the calibrated range clips outliers
  EXPECT_EQ(back[3], 0.0f);
}

TEST(KvQuantizeTest, Int8ExactCodesRoundHalfToEven) {
  // zero = -1, scale = (255/128) / 255 = 1/128, both exact in f16.
  const std::vector<float> x = {-1.0f, -1.0f + 10.0f / 128, -1.0f + 100.5f / 128, -1.0f + 101.5f / 128,
                                -1.0f + 255.0f / 128};
  const Stored s = quantize(x, DType::kInt8);
  EXPECT_EQ(s.data, (std::vector<uint8_t>{0, 10, 100, 102, 255}));
  const KvScaleZero r = record(s, 0);
  EXPECT_EQ(r.zero_f16, f32_to_f16(-1.0f));
  EXPECT_EQ(r.scale_f16, f32_to_f16(1.0f / 128));
  const auto back = round_trip(x, DType::kInt8);
  EXPECT_EQ(back[0], -1.0f);
  EXPECT_EQ(back[1], x[1]);
  EXPECT_EQ(back[2], -1.0f + 100.0f / 128);
  EXPECT_EQ(back[4], x[4]);
}

TEST(KvQuantizeTest, Int4ExactCodesPackingAndShortLastGroup) {
  // head_dim 40: group 0 (32 elements) = 0.25 + (i % 16) * 0.125 -> zero 0.25, scale 0.125,
  // codes i % 16; group 1 (8 elements) all -3: zero -3, scale f16(0) -> 1, codes 0.
  std::vector<float> x(40);
  for (int i = 0; i < 32; ++i) x[i] = 0.25f + static_cast<float>(i % 16) * 0.125f;
  for (int i = 32; i < 40; ++i) x[i] = -3.0f;
  const Stored s = quantize(x, DType::kInt4);
  ASSERT_EQ(s.data.size(), 20u);
  for (int i = 0; i < 16; ++i) {
    const int lo = (2 * i) % 16, hi = (2 * i + 1) % 16;
    EXPECT_EQ(s.data[i], lo | (hi << 4)) << "byte " << i;
  }
  for (int i = 16; i < 20; ++i) EXPECT_EQ(s.data[i], 0) << "byte " << i;
  EXPECT_EQ(record(s, 0).zero_f16, f32_to_f16(0.25f));
  EXPECT_EQ(record(s, 0).scale_f16, f32_to_f16(0.125f));
  EXPECT_EQ(record(s, 1).zero_f16, f32_to_f16(-3.0f));
  EXPECT_EQ(record(s, 1).scale_f16, f32_to_f16(1.0f));
  EXPECT_EQ(round_trip(x, DType::kInt4), x);  // every value is on the grid
}

TEST(KvQuantizeTest, Int4OddHeadDimLeavesTheLastHighNibbleZero) {
  std::vector<float> x(33);
  for (int i = 0; i < 33; ++i) x[i] = static_cast<float>(i % 3);
  const Stored s = quantize(x, DType::kInt4);
  ASSERT_EQ(s.data.size(), 17u);
  EXPECT_EQ(s.data[16] >> 4, 0);
  EXPECT_EQ(round_trip(x, DType::kInt4)[32], x[32]);
}

// ------------------------------------------------------------ round-trip bounds

struct BoundCase {
  const char* name;
  std::vector<float> x;
};

std::vector<BoundCase> bound_cases() {
  std::vector<BoundCase> cases;
  for (int32_t d : {8, 32, 33, 40, 64, 72, 128}) {
    cases.push_back({"uniform", pagoda::testing::random_values(d, 11 + d)});
    cases.push_back({"negative_only", pagoda::testing::random_values(d, 13 + d, -5.0f, -1.0f)});
    cases.push_back({"positive_wide", pagoda::testing::random_values(d, 17 + d, 0.0f, 300.0f)});
    auto outlier = pagoda::testing::random_values(d, 19 + d, -0.1f, 0.1f);
    outlier[d / 3] = 120.0f;
    cases.push_back({"outlier", outlier});
    std::mt19937 rng(23 + d);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> gauss(d);
    for (float& v : gauss) v = normal(rng);
    cases.push_back({"gaussian", gauss});
  }
  return cases;
}

TEST(KvQuantizeTest, Fp8ErrorWithinOneSixteenthOfTheValue) {
  for (const auto& c : bound_cases()) {
    SCOPED_TRACE(::testing::Message() << c.name << " d=" << c.x.size());
    const auto back = round_trip(c.x, DType::kFP8E4M3);
    float amax = 0;
    for (float v : c.x) amax = std::max(amax, std::abs(v));
    const float scale = amax / 448.0f;
    for (size_t i = 0; i < c.x.size(); ++i) {
      const float err = std::abs(back[i] - c.x[i]);
      // 3 mantissa bits: half an ulp is 2^-4 of the value; below the normal range the step is
      // 2^-9 of the scale (fixed), hence the second term.
      EXPECT_LE(err, std::ldexp(std::abs(c.x[i]), -4) + std::ldexp(scale, -10) + 1e-7f * amax) << i;
      EXPECT_LE(err, std::ldexp(amax, -4)) << i;
    }
  }
}

void expect_int_bound(const std::vector<float>& x, DType dtype) {
  const Stored s = quantize(x, dtype);
  const auto back = round_trip(x, dtype);
  const int32_t group = dtype == DType::kInt4 ? 32 : static_cast<int32_t>(x.size());
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::abs(v));
  for (size_t i = 0; i < x.size(); ++i) {
    const KvScaleZero r = record(s, static_cast<int32_t>(i) / group);
    // A group whose values all sit just below f16(min) gets a tiny negative scale (the format's
    // arithmetic, identical on the GPU); the step is |scale| either way.
    const float scale = std::abs(f16_to_f32(r.scale_f16));
    EXPECT_GT(scale, 0.0f);
    // Half a quantization step, plus f32 rounding of (x - zero) * inv and code * scale + zero.
    EXPECT_LE(std::abs(back[i] - x[i]), 0.5f * scale + 1e-6f * amax) << "element " << i;
  }
}

TEST(KvQuantizeTest, Int8ErrorWithinHalfAStep) {
  for (const auto& c : bound_cases()) {
    SCOPED_TRACE(::testing::Message() << c.name << " d=" << c.x.size());
    expect_int_bound(c.x, DType::kInt8);
  }
}

TEST(KvQuantizeTest, Int4ErrorWithinHalfAStepOfItsGroup) {
  for (const auto& c : bound_cases()) {
    SCOPED_TRACE(::testing::Message() << c.name << " d=" << c.x.size());
    expect_int_bound(c.x, DType::kInt4);
  }
}

TEST(KvQuantizeTest, Int4GroupsAreIndependent) {
  // A huge value in group 0 must not coarsen group 1.
  std::vector<float> x = pagoda::testing::random_values(64, 5, -0.01f, 0.01f);
  x[3] = 1000.0f;
  const Stored s = quantize(x, DType::kInt4);
  EXPECT_LT(f16_to_f32(record(s, 1).scale_f16), 0.02f / 15 * 1.01f);
  const auto back = round_trip(x, DType::kInt4);
  for (int i = 32; i < 64; ++i) EXPECT_NEAR(back[i], x[i], 0.02f / 15);
}

TEST(KvQuantizeTest, ZerosReadBackAsZeros) {
  for (DType dtype : {DType::kFP8E4M3, DType::kInt8, DType::kInt4, DType::kBF16}) {
    for (int32_t d : {8, 40}) {
      const std::vector<float> zeros(d, 0.0f);
      EXPECT_EQ(round_trip(zeros, dtype), zeros) << dtype_name(dtype) << " d=" << d;
    }
  }
  EXPECT_EQ(fp8_scale(quantize(std::vector<float>(8, 0.0f), DType::kFP8E4M3)), 1.0f);
  EXPECT_EQ(record(quantize(std::vector<float>(8, 0.0f), DType::kInt8), 0).scale_f16, f32_to_f16(1.0f));
}

TEST(KvQuantizeTest, AllEqualVectors) {
  for (float c : {0.5f, -3.0f, 0.3f, 1234.5f}) {
    for (int32_t d : {8, 40, 72}) {
      const std::vector<float> x(d, c);
      const auto fp8 = round_trip(x, DType::kFP8E4M3);
      for (float v : fp8) EXPECT_NEAR(v, c, std::abs(c) * 1e-6f) << "fp8 " << c;  // amax maps to 448 exactly
      for (DType dtype : {DType::kInt8, DType::kInt4}) {
        const auto back = round_trip(x, dtype);
        // zero = f16(c); the remainder (under half an f16 ulp) is what the codes must carry.
        for (float v : back) EXPECT_NEAR(v, c, std::abs(c) * std::ldexp(1.0f, -11)) << dtype_name(dtype) << " " << c;
      }
    }
  }
  // Exactly representable in f16: exact.
  const std::vector<float> half(40, 0.5f);
  EXPECT_EQ(round_trip(half, DType::kInt8), half);
  EXPECT_EQ(round_trip(half, DType::kInt4), half);
}

TEST(KvQuantizeTest, UnquantizedStorageTypesRoundToNearestEven) {
  const auto x = pagoda::testing::random_values(40, 3, -10.0f, 10.0f);
  const auto bf16 = round_trip(x, DType::kBF16);
  const auto f16 = round_trip(x, DType::kF16);
  const auto f32 = round_trip(x, DType::kF32);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bf16[i], round_to_bf16(x[i]));
    EXPECT_EQ(f16[i], f16_to_f32(f32_to_f16(x[i])));
    EXPECT_EQ(f32[i], x[i]);
  }
}

TEST(KvQuantizeTest, SixteenBitReadsEqualTheScalarConversionUnderEveryDotImplementation) {
  // Attention reads f16/bf16 pools through the vector widening (vector_dot.h): bit for bit the scalar
  // conversion, for head dims below, at and past the 8- and 16-lane steps, with zeros, subnormals and
  // infinities among the codes.
  const std::string chosen = vector_dot_implementation();
  for (const char* impl : {"generic", "avx2+fma+f16c", "avx512"}) {
    if (!select_vector_dot_implementation(impl)) continue;  // not on this CPU
    for (int32_t d : {1, 8, 40, 64, 72, 128, 256}) {
      for (DType dtype : {DType::kF16, DType::kBF16}) {
        std::vector<uint16_t> codes(static_cast<size_t>(d));
        std::mt19937 rng(static_cast<uint32_t>(d));
        for (auto& c : codes) c = static_cast<uint16_t>(rng());
        const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x007f, 0x7f80};
        for (size_t i = 0; i < std::min<size_t>(codes.size(), 8); ++i) codes[i] = special[i];
        for (auto& c : codes)  // NaN payloads are not part of the contract
          if (std::isnan(dtype == DType::kF16 ? f16_to_f32(c) : bf16_to_f32(c))) c = 0x3c00;
        std::vector<float> got(codes.size(), -1.0f);
        dequantize_kv_vector(codes.data(), nullptr, d, dtype, got.data());
        for (size_t i = 0; i < codes.size(); ++i) {
          const float want = dtype == DType::kF16 ? f16_to_f32(codes[i]) : bf16_to_f32(codes[i]);
          EXPECT_EQ(std::memcmp(&got[i], &want, sizeof want), 0) << impl << " " << dtype_name(dtype) << " d " << d
                                                                  << " i " << i;
        }
      }
    }
  }
  ASSERT_TRUE(select_vector_dot_implementation(chosen));
}

TEST(KvQuantizeTest, Fp8DecodeTableMatchesTheScalarConversion) {
  const float* table = fp8e4m3_decode_table();
  for (int c = 0; c < 256; ++c) {
    const float expected = fp8e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(expected)) EXPECT_TRUE(std::isnan(table[c])) << c;
    else EXPECT_EQ(table[c], expected) << c;
  }
}

TEST(KvQuantizeTest, QuantizingTwiceGivesTheSameBytes) {
  // Determinism: the same input always yields the same codes and scales (what lets CPU and
  // GPU, or two runs, agree byte for byte).
  for (const auto& c : bound_cases()) {
    for (DType dtype : {DType::kFP8E4M3, DType::kInt8, DType::kInt4}) {
      const Stored a = quantize(c.x, dtype), b = quantize(c.x, dtype);
      EXPECT_EQ(a.data, b.data);
      EXPECT_EQ(a.scales, b.scales);
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels

namespace pagoda::kernels {
namespace {

// The CPU quantizer against the host reference the CUDA kv_write is checked against bit for bit
// (tests/gpu/kv_quant_reference.h, written separately from kv_quant.h's formulas): equal codes
// and records here mean the CPU and GPU pools hold the same bytes for the same K/V.
TEST(KvQuantizeTest, SameBytesAsTheGpuReference) {
  int checked = 0;
  for (const auto& c : bound_cases()) {
    for (DType dtype : {DType::kFP8E4M3, DType::kInt8, DType::kInt4}) {
      const int32_t d = static_cast<int32_t>(c.x.size());
      const Stored cpu = quantize(c.x, dtype);
      const auto gpu = kernels::testing::quantize_reference(c.x.data(), d, kv_quant_of(dtype));
      ASSERT_EQ(cpu.data, gpu.codes) << c.name << " d=" << d << " " << dtype_name(dtype);
      ASSERT_EQ(cpu.scales.size(), gpu.records.size() * 4);
      EXPECT_EQ(std::memcmp(cpu.scales.data(), gpu.records.data(), cpu.scales.size()), 0)
          << c.name << " d=" << d << " " << dtype_name(dtype);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7 * 5 * 3);
}

}  // namespace
}  // namespace pagoda::kernels
