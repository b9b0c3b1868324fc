// The weight-streaming GEMV (backend/cuda/gemv.h) against a CPU reference in double (bf16 weights; e4m3
// weights with per-channel, per-tensor and 128x128 block scales, dequantized on the CPU) and against the
// cuBLASLt GEMM it replaces at decode sizes, at the Llama-3-8B shapes and at odd sizes (n not a multiple of
// the block's rows, k of one chunk, k off the 128-column blocks); the launch contract (unsupported shapes are
// refused, not run); then weight-read bandwidth against cuBLASLt at m = 1, 2, 4, 8 (printed; no bound).
// Bound: f32 summation order plus one bf16 rounding of the output.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/core/dtype.h"
#include "pagoda/model/fp8_matrix.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

struct GemvCase {
  int32_t m, n, k;
};

std::ostream& operator<<(std::ostream& os, const GemvCase& c) {
  return os << "m" << c.m << "_n" << c.n << "_k" << c.k;
}

// want[r, c] = sum_k x[r, k] * w[c, k] (w already dequantized), in double.
std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w, const GemvCase& c) {
  std::vector<float> want(static_cast<size_t>(c.m) * c.n);
  for (int32_t r = 0; r < c.m; ++r)
    for (int32_t col = 0; col < c.n; ++col) {
      double sum = 0.0;
      const float* xr = x.data() + static_cast<size_t>(r) * c.k;
      const float* wr = w.data() + static_cast<size_t>(col) * c.k;
      for (int32_t k = 0; k < c.k; ++k) sum += static_cast<double>(xr[k]) * wr[k];
      want[static_cast<size_t>(r) * c.n + col] = static_cast<float>(sum);
    }
  return want;
}

double bound_abs(const GemvCase& c) { return 1e-4 * std::sqrt(static_cast<double>(c.k)); }

class GemvTest : public ::testing::TestWithParam<GemvCase> {};

TEST_P(GemvTest, Bf16MatchesTheCpuReferenceAndTheGemm) {
  PAGODA_SKIP_WITHOUT_GPU();
  const GemvCase c = GetParam();
  const std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -2, 2, 51);
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(c.n) * c.k, -0.1f, 0.1f, 52);
  const std::vector<float> want = reference(x, w, c);
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_w = to_device(to_bf16_bits(w));
  auto d_y = DeviceBuffer::allocate(want.size() * 2);
  auto d_y32 = DeviceBuffer::allocate(want.size() * 4);
  auto d_gemm = DeviceBuffer::allocate(want.size() * 2);
  ASSERT_TRUE(d_y.ok() && d_y32.ok() && d_gemm.ok());
  ASSERT_TRUE(gemv_supported(c.m, c.k, false, d_x.data(), d_w.data()));
  ASSERT_EQ(gemv_bf16(d_x.as<__nv_bfloat16>(), c.m, d_w.as<__nv_bfloat16>(), c.n, c.k, d_y->data(), false, nullptr),
            cudaSuccess);
  ASSERT_EQ(gemv_bf16(d_x.as<__nv_bfloat16>(), c.m, d_w.as<__nv_bfloat16>(), c.n, c.k, d_y32->data(), true, nullptr),
            cudaSuccess);
  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.ok());
  const Status s = (*gemm)->linear(d_x.as<__nv_bfloat16>(), c.m, d_w.as<__nv_bfloat16>(), c.n, c.k, d_gemm->data(),
                                   GemmOutput::kBF16, nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(*d_y, want.size()));
  const std::vector<float> got32 = to_host<float>(*d_y32, want.size());
  const std::vector<float> cublas = from_bf16_bits(to_host<uint16_t>(*d_gemm, want.size()));
  EXPECT_LE(worst_error_ratio(got, want, bound_abs(c), 1.0 / 128), 1.0);
  EXPECT_LE(worst_error_ratio(got32, want, bound_abs(c), 1e-5), 1.0);
  // Against cuBLASLt: both round to bf16 once, so two roundings apart at most.
  EXPECT_LE(worst_error_ratio(got, cublas, 2 * bound_abs(c), 2.0 / 128), 1.0);
}

enum class ScaleKind { kChannel, kTensor, kBlock128 };

void fp8_case(const GemvCase& c, ScaleKind kind) {
  const std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -2, 2, 61);
  std::vector<float> w = random_bf16_values(static_cast<size_t>(c.n) * c.k, -0.1f, 0.1f, 62);
  // Uneven magnitudes per row so the per-row / per-block scales matter.
  for (int32_t r = 0; r < c.n; ++r)
    for (int32_t k = 0; k < c.k; ++k) w[static_cast<size_t>(r) * c.k + k] *= 1.0f + static_cast<float>((r * 7 + k / 128) % 5);
  std::vector<uint8_t> q(w.size());
  std::vector<float> deq(w.size());
  std::vector<float> scales;
  int32_t block_stride = 0;
  if (kind == ScaleKind::kBlock128) {
    const int32_t row_blocks = (c.n + 127) / 128, groups = fp8_block_groups(c.k);
    block_stride = fp8_block_weight_scale_stride(c.k);
    scales.assign(static_cast<size_t>(row_blocks) * block_stride, -1.0f);  // padding never read
    for (int32_t rb = 0; rb < row_blocks; ++rb)
      for (int32_t g = 0; g < groups; ++g) {
        float amax = 0.0f;
        for (int32_t r = rb * 128; r < std::min(c.n, rb * 128 + 128); ++r)
          for (int32_t k = g * 128; k < std::min(c.k, g * 128 + 128); ++k)
            amax = std::max(amax, std::fabs(w[static_cast<size_t>(r) * c.k + k]));
        const float s = amax / kFp8E4M3Max;
        scales[static_cast<size_t>(rb) * block_stride + g] = s;
        for (int32_t r = rb * 128; r < std::min(c.n, rb * 128 + 128); ++r)
          for (int32_t k = g * 128; k < std::min(c.k, g * 128 + 128); ++k) {
            const size_t i = static_cast<size_t>(r) * c.k + k;
            q[i] = s > 0 ? f32_to_fp8e4m3(w[i] / s) : 0;
            deq[i] = fp8e4m3_to_f32(q[i]) * s;
          }
      }
  } else {
    scales.resize(static_cast<size_t>(c.n));
    float tensor_amax = 0.0f;
    for (float v : w) tensor_amax = std::max(tensor_amax, std::fabs(v));
    for (int32_t r = 0; r < c.n; ++r) {
      if (kind == ScaleKind::kChannel) {
        scales[r] = quantize_fp8_row(w.data() + static_cast<size_t>(r) * c.k, c.k, q.data() + static_cast<size_t>(r) * c.k);
      } else {
        scales[r] = tensor_amax / kFp8E4M3Max;
        for (int32_t k = 0; k < c.k; ++k)
          q[static_cast<size_t>(r) * c.k + k] = f32_to_fp8e4m3(w[static_cast<size_t>(r) * c.k + k] / scales[r]);
      }
      for (int32_t k = 0; k < c.k; ++k)
        deq[static_cast<size_t>(r) * c.k + k] = fp8e4m3_to_f32(q[static_cast<size_t>(r) * c.k + k]) * scales[r];
    }
  }
  const std::vector<float> want = reference(x, deq, c);
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_w = to_device(q), d_s = to_device(scales);
  auto d_y = DeviceBuffer::allocate(want.size() * 2);
  ASSERT_TRUE(d_y.ok());
  ASSERT_TRUE(gemv_supported(c.m, c.k, true, d_x.data(), d_w.data()));
  double max_want = 0.0;
  for (float v : want) max_want = std::max(max_want, static_cast<double>(std::fabs(v)));
  EXPECT_GT(max_want, 0.1);  // the case is not trivially zero
  // Every load depth, each run twice: the same bits both times and within the reference bound.
  for (int32_t depth : kGemvFp8Depths) {
    std::vector<uint16_t> first;
    for (int run = 0; run < 2; ++run) {
      ASSERT_EQ(cudaMemset(d_y->data(), 0xff, d_y->bytes()), cudaSuccess);
      ASSERT_EQ(gemv_fp8(d_x.as<__nv_bfloat16>(), c.m, d_w.as<uint8_t>(), d_s.as<float>(), block_stride, c.n, c.k,
                         d_y->as<__nv_bfloat16>(), nullptr, depth),
                cudaSuccess)
          << "depth " << depth;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> bits = to_host<uint16_t>(*d_y, want.size());
      if (run == 0) {
        first = bits;
        const std::vector<float> got = from_bf16_bits(bits);
        EXPECT_LE(worst_error_ratio(got, want, bound_abs(c), 1.0 / 128), 1.0) << "depth " << depth;
      } else {
        EXPECT_EQ(bits, first) << "depth " << depth << ": results differ between runs";
      }
    }
  }
  // The f32-output form (the e4m3 lm_head): the direct kernel's sums before their bf16 rounding.
  ASSERT_EQ(gemv_fp8(d_x.as<__nv_bfloat16>(), c.m, d_w.as<uint8_t>(), d_s.as<float>(), block_stride, c.n, c.k,
                     d_y->as<__nv_bfloat16>(), nullptr, 1),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> bf16_bits = to_host<uint16_t>(*d_y, want.size());
  auto d_f = DeviceBuffer::allocate(want.size() * 4);
  ASSERT_TRUE(d_f.ok());
  ASSERT_EQ(gemv_fp8_logits(d_x.as<__nv_bfloat16>(), c.m, d_w.as<uint8_t>(), d_s.as<float>(), block_stride, c.n,
                            c.k, d_f->as<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> logits = to_host<float>(*d_f, want.size());
  EXPECT_LE(worst_error_ratio(logits, want, bound_abs(c), 1.0 / 128), 1.0);
  EXPECT_EQ(to_bf16_bits(logits), bf16_bits) << "f32 output rounded to bf16 differs from the bf16 output";
}

// Every e4m3 byte but the NaNs through the fp8 GEMV's widening: one weight row per byte value (the byte row
// rotated) against a one-hot activation reads back each byte's value exactly, subnormals included (the sum
// starts at +0, so -0 reads as +0).
TEST(GemvFp8Bytes, EveryE4m3ByteWidensExactly) {
  PAGODA_SKIP_WITHOUT_GPU();
  constexpr int32_t k = 256;
  std::vector<uint8_t> row(k);
  for (int32_t i = 0; i < k; ++i) row[i] = static_cast<uint8_t>((i & 0x7f) == 0x7f ? 0 : i);
  std::vector<uint8_t> w(static_cast<size_t>(k) * k);
  for (int32_t j = 0; j < k; ++j)
    for (int32_t i = 0; i < k; ++i) w[static_cast<size_t>(j) * k + i] = row[(i + j) % k];
  std::vector<float> x(k, 0.0f);
  x[0] = 1.0f;
  const std::vector<float> scales(k, 1.0f);
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_w = to_device(w), d_s = to_device(scales);
  auto d_y = DeviceBuffer::allocate(static_cast<size_t>(k) * 4);
  ASSERT_TRUE(d_y.ok());
  ASSERT_EQ(gemv_fp8_logits(d_x.as<__nv_bfloat16>(), 1, d_w.as<uint8_t>(), d_s.as<float>(), 0, k, k, d_y->as<float>(),
                            nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = to_host<float>(*d_y, k);
  for (int32_t j = 0; j < k; ++j)
    EXPECT_EQ(got[j], fp8e4m3_to_f32(row[j])) << "byte 0x" << std::hex << static_cast<int>(row[j]);
}

TEST_P(GemvTest, Fp8ChannelScalesMatchTheDequantizedReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (GetParam().k % 16 != 0) GTEST_SKIP() << "fp8 rows need k % 16 == 0";
  fp8_case(GetParam(), ScaleKind::kChannel);
}

TEST_P(GemvTest, Fp8TensorScaleMatchesTheDequantizedReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (GetParam().k % 16 != 0) GTEST_SKIP() << "fp8 rows need k % 16 == 0";
  fp8_case(GetParam(), ScaleKind::kTensor);
}

TEST_P(GemvTest, Fp8Block128ScalesMatchTheDequantizedReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (GetParam().k % 16 != 0) GTEST_SKIP() << "fp8 rows need k % 16 == 0";
  fp8_case(GetParam(), ScaleKind::kBlock128);
}

// The gate_up GEMV with SiLU-mul in its epilogue (gemv_bf16_silu, gemv_fp8_silu) against the plain GEMV of
// the [2 x intermediate, k] weight followed by silu_mul, bit for bit: bf16 weights, and e4m3 weights with
// per-row and 128x128 block scales at every load depth (intermediate = n / 2 of each shape, odd ones too).
TEST_P(GemvTest, SiluEpilogueMatchesTheGemvAndSiluMulBitForBit) {
  PAGODA_SKIP_WITHOUT_GPU();
  const GemvCase c = GetParam();
  const int32_t inter = c.n / 2;
  if (inter == 0) GTEST_SKIP() << "no gate and up rows";
  const size_t rows = 2 * static_cast<size_t>(inter), acts = static_cast<size_t>(c.m) * inter;
  const std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -2, 2, 71);
  DeviceBuffer d_x = to_device(to_bf16_bits(x));
  auto d_gate_up = DeviceBuffer::allocate(static_cast<size_t>(c.m) * rows * 2);
  auto d_want = DeviceBuffer::allocate(acts * 2), d_got = DeviceBuffer::allocate(acts * 2);
  ASSERT_TRUE(d_gate_up.ok() && d_want.ok() && d_got.ok());
  const auto* xb = d_x.as<__nv_bfloat16>();
  auto compare = [&](const std::string& what) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    const std::vector<uint16_t> want = to_host<uint16_t>(*d_want, acts), got = to_host<uint16_t>(*d_got, acts);
    double max_act = 0.0;
    for (float v : from_bf16_bits(want)) max_act = std::max(max_act, static_cast<double>(std::fabs(v)));
    EXPECT_GT(max_act, 0.01) << what;  // not trivially zero
    EXPECT_EQ(got, want) << what;
  };
  {
    const std::vector<float> w = random_bf16_values(rows * c.k, -0.1f, 0.1f, 72);
    DeviceBuffer d_w = to_device(to_bf16_bits(w));
    const auto* wb = d_w.as<__nv_bfloat16>();
    ASSERT_EQ(gemv_bf16(xb, c.m, wb, static_cast<int32_t>(rows), c.k, d_gate_up->data(), false, nullptr), cudaSuccess);
    ASSERT_EQ(silu_mul(d_gate_up->as<__nv_bfloat16>(), d_want->as<__nv_bfloat16>(), c.m, inter, nullptr), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_got->data(), 0xff, d_got->bytes()), cudaSuccess);
    ASSERT_EQ(gemv_bf16_silu(xb, c.m, wb, inter, c.k, d_got->as<__nv_bfloat16>(), nullptr), cudaSuccess);
    compare("bf16");
  }
  if (c.k % 16 != 0) return;
  // e4m3 bytes but the NaNs, and scales of either layout.
  std::vector<uint8_t> q(rows * c.k);
  for (size_t i = 0; i < q.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>((i * 2654435761u) >> 13);
    q[i] = (b & 0x7f) == 0x7f ? 0 : b;
  }
  const int32_t stride = fp8_block_weight_scale_stride(c.k);
  const size_t block_scales = (rows + 127) / 128 * static_cast<size_t>(stride);
  std::vector<float> scales(std::max(rows, block_scales));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.002f * static_cast<float>(1 + i % 7);
  DeviceBuffer d_q = to_device(q), d_s = to_device(scales);
  for (const int32_t block_stride : {0, stride}) {
    for (const int32_t depth : kGemvFp8Depths) {
      const std::string what = "fp8 block_stride " + std::to_string(block_stride) + " depth " + std::to_string(depth);
      ASSERT_EQ(gemv_fp8(xb, c.m, d_q.as<uint8_t>(), d_s.as<float>(), block_stride, static_cast<int32_t>(rows), c.k,
                         d_gate_up->as<__nv_bfloat16>(), nullptr, depth),
                cudaSuccess)
          << what;
      ASSERT_EQ(silu_mul(d_gate_up->as<__nv_bfloat16>(), d_want->as<__nv_bfloat16>(), c.m, inter, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(d_got->data(), 0xff, d_got->bytes()), cudaSuccess);
      ASSERT_EQ(gemv_fp8_silu(xb, c.m, d_q.as<uint8_t>(), d_s.as<float>(), block_stride, inter, c.k,
                              d_got->as<__nv_bfloat16>(), nullptr, depth),
                cudaSuccess)
          << what;
      compare(what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvTest,
                         ::testing::Values(GemvCase{1, 6144, 4096}, GemvCase{2, 4096, 4096}, GemvCase{3, 512, 14336},
                                           GemvCase{4, 28672, 512}, GemvCase{5, 37, 8}, GemvCase{6, 130, 400},
                                           GemvCase{7, 301, 2064}, GemvCase{8, 4096, 1024}, GemvCase{1, 1, 16},
                                           GemvCase{8, 259, 14336}),
                         [](const ::testing::TestParamInfo<GemvCase>& info) {
                           return "m" + std::to_string(info.param.m) + "_n" + std::to_string(info.param.n) + "_k" +
                                  std::to_string(info.param.k);
                         });

TEST(GemvContractTest, UnsupportedShapesAreRefused) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto x = DeviceBuffer::allocate(16 * 1024);
  auto w = DeviceBuffer::allocate(16 * 1024);
  auto y = DeviceBuffer::allocate(16 * 1024);
  auto s = DeviceBuffer::allocate(1024);
  ASSERT_TRUE(x.ok() && w.ok() && y.ok() && s.ok());
  const auto* xb = x->as<__nv_bfloat16>();
  EXPECT_FALSE(gemv_supported(0, 64, false, xb, w->data()));
  EXPECT_FALSE(gemv_supported(kGemvMaxRows + 1, 64, false, xb, w->data()));
  EXPECT_FALSE(gemv_supported(1, 12, false, xb, w->data()));   // k % 8
  EXPECT_FALSE(gemv_supported(1, 24, true, xb, w->data()));    // k % 16 for fp8
  EXPECT_FALSE(gemv_supported(1, 64, false, xb + 1, w->data()));  // misaligned
  EXPECT_TRUE(gemv_supported(kGemvMaxRows, 24, false, xb, w->data()));
  EXPECT_EQ(gemv_bf16(xb, 9, w->as<__nv_bfloat16>(), 16, 64, y->data(), false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(gemv_bf16(xb, 1, w->as<__nv_bfloat16>(), 0, 64, y->data(), false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(gemv_fp8(xb, 1, w->as<uint8_t>(), nullptr, 0, 16, 64, y->as<__nv_bfloat16>(), nullptr),
            cudaErrorInvalidValue);
  // A block stride shorter than the k-blocks of a row.
  EXPECT_EQ(gemv_fp8(xb, 1, w->as<uint8_t>(), s->as<float>(), 1, 16, 256, y->as<__nv_bfloat16>(), nullptr),
            cudaErrorInvalidValue);
  for (int32_t depth : {0, 3, 8})  // only the depths of kGemvFp8Depths
    EXPECT_EQ(gemv_fp8(xb, 1, w->as<uint8_t>(), s->as<float>(), 0, 16, 64, y->as<__nv_bfloat16>(), nullptr, depth),
              cudaErrorInvalidValue);
  // The SiLU forms: no columns, no scales, too many rows, a bad depth.
  auto* yb = y->as<__nv_bfloat16>();
  EXPECT_EQ(gemv_bf16_silu(xb, 1, w->as<__nv_bfloat16>(), 0, 64, yb, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(gemv_bf16_silu(xb, 9, w->as<__nv_bfloat16>(), 8, 64, yb, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(gemv_fp8_silu(xb, 1, w->as<uint8_t>(), nullptr, 0, 8, 64, y->as<__nv_bfloat16>(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(gemv_fp8_silu(xb, 1, w->as<uint8_t>(), s->as<float>(), 0, 8, 64, y->as<__nv_bfloat16>(), nullptr, 3),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Weight-read bandwidth (GB/s = weight bytes / time) of the GEMV and of cuBLASLt at the Llama-3-8B shapes.
// Each call reads a different copy of the weights (>= 256 MiB in all), so no call finds them in L2.
TEST(GemvSpeed, Llama3_8BShapes) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto bf16 = Gemm::create();
  auto fp8 = Fp8Gemm::create();
  ASSERT_TRUE(bf16.ok());
  const bool have_fp8 = fp8.ok();
  struct Shape { int32_t n, k; const char* name; };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o"}, {28672, 4096, "gate_up"}, {4096, 14336, "down"},
                          {128256, 4096, "lm_head"}};
  constexpr int32_t kMaxM = kGemvMaxRows;
  constexpr size_t kSpan = size_t{256} << 20;
  std::printf("gemv-speed (GB/s of weight reads; us per call) fp8 GEMM mode %s\n",
              have_fp8 ? fp8_scale_mode_name((*fp8)->mode()) : "none");
  for (const Shape& s : shapes) {
    const size_t bytes16 = static_cast<size_t>(s.n) * s.k * 2, bytes8 = bytes16 / 2;
    const int copies16 = static_cast<int>(std::max<size_t>(1, (kSpan + bytes16 - 1) / bytes16));
    const int copies8 = static_cast<int>(std::max<size_t>(1, (kSpan + bytes8 - 1) / bytes8));
    auto w16 = DeviceBuffer::allocate(bytes16 * copies16);
    auto w8 = DeviceBuffer::allocate(bytes8 * copies8);
    auto ws = DeviceBuffer::allocate(static_cast<size_t>(s.n) * 4);
    auto x16 = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.k * 2);
    auto x8 = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.k);
    auto xs = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * 4);
    auto y = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.n * 4);
    ASSERT_TRUE(w16.ok() && w8.ok() && ws.ok() && x16.ok() && x8.ok() && xs.ok() && y.ok());
    cudaMemset(w16->data(), 0x3c, w16->bytes());
    cudaMemset(w8->data(), 0x30, w8->bytes());
    cudaMemset(x16->data(), 0x3c, x16->bytes());
    const std::vector<float> scales(static_cast<size_t>(s.n), 1.0f / 448.0f);
    cudaMemcpy(ws->data(), scales.data(), ws->bytes(), cudaMemcpyHostToDevice);
    const bool head = s.n == 128256;
    for (int32_t m : {1, 2, 4, 8}) {
      int i16 = 0, i8 = 0;
      auto w16_next = [&] { return w16->as<__nv_bfloat16>() + static_cast<size_t>(i16++ % copies16) * (bytes16 / 2); };
      auto w8_next = [&] { return w8->as<uint8_t>() + static_cast<size_t>(i8++ % copies8) * bytes8; };
      Status status = ok_status();
      const double gemv16 = testing::time_us_per_call([&] {
        gemv_bf16(x16->as<__nv_bfloat16>(), m, w16_next(), s.n, s.k, y->data(), head, nullptr);
      }, 40);
      const double cublas16 = testing::time_us_per_call([&] {
        status = (*bf16)->linear(x16->as<__nv_bfloat16>(), m, w16_next(), s.n, s.k, y->data(),
                                 head ? GemmOutput::kF32 : GemmOutput::kBF16, nullptr);
      }, 40);
      ASSERT_TRUE(status.ok()) << status.to_string();
      double gemv8 = 0.0, cublas8 = 0.0, quantize = 0.0, deep8[2] = {0.0, 0.0};
      if (have_fp8 && !head) {
        gemv8 = testing::time_us_per_call([&] {
          gemv_fp8(x16->as<__nv_bfloat16>(), m, w8_next(), ws->as<float>(), 0, s.n, s.k, y->as<__nv_bfloat16>(), nullptr);
        }, 40);
        for (int d = 0; d < 2; ++d)
          deep8[d] = testing::time_us_per_call([&] {
            gemv_fp8(x16->as<__nv_bfloat16>(), m, w8_next(), ws->as<float>(), 0, s.n, s.k, y->as<__nv_bfloat16>(),
                     nullptr, d == 0 ? 2 : 4);
          }, 40);
        quantize = testing::time_us_per_call([&] {
          quantize_fp8_per_token(x16->as<__nv_bfloat16>(), m, s.k, x8->as<uint8_t>(), xs->as<float>(), nullptr);
        }, 40);
        cublas8 = testing::time_us_per_call([&] {
          status = (*fp8)->linear(x8->as<uint8_t>(), xs->as<float>(), m, w8_next(), ws->as<float>(), s.n, s.k,
                                  y->as<__nv_bfloat16>(), nullptr);
        }, 40);
        ASSERT_TRUE(status.ok()) << status.to_string();
      } else if (have_fp8) {  // the e4m3 lm_head (f32 logits)
        gemv8 = testing::time_us_per_call([&] {
          gemv_fp8_logits(x16->as<__nv_bfloat16>(), m, w8_next(), ws->as<float>(), 0, s.n, s.k, y->as<float>(),
                          nullptr);
        }, 40);
      }
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      auto gbs = [](size_t b, double us) { return us > 0 ? static_cast<double>(b) / (us * 1e3) : 0.0; };
      std::printf("gemv-speed %-8s m=%d n=%6d k=%5d | bf16: gemv %7.1f us %6.0f GB/s, cublas %7.1f us %6.0f GB/s "
                  "(%.2fx) | fp8: gemv %7.1f us %6.0f GB/s, cublas %7.1f us %6.0f GB/s (+quantize %.1f us) (%.2fx)\n",
                  s.name, m, s.n, s.k, gemv16, gbs(bytes16, gemv16), cublas16, gbs(bytes16, cublas16),
                  cublas16 / gemv16, gemv8, gbs(bytes8, gemv8), cublas8, gbs(bytes8, cublas8), quantize,
                  gemv8 > 0 ? (cublas8 + quantize) / gemv8 : 0.0);
      if (have_fp8 && !head)
        std::printf("gemv-speed %-8s m=%d n=%6d k=%5d | fp8 depth: 1 %7.1f us %6.0f GB/s, 2 %7.1f us %6.0f GB/s, "
                    "4 %7.1f us %6.0f GB/s\n",
                    s.name, m, s.n, s.k, gemv8, gbs(bytes8, gemv8), deep8[0], gbs(bytes8, deep8[0]), deep8[1],
                    gbs(bytes8, deep8[1]));
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
