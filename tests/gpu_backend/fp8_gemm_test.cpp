// FP8 GEMMs on the GPU (backend/cuda/fp8_gemm.h) against the CPU reference of
// the same arithmetic (model/fp8_matrix.h): the per-token activation
// quantization byte for byte, and the scaled e4m3 GEMM against kernels::linear
// on per-channel fp8 weights with dynamic per-token activations (dequantized
// weights, fp8-rounded activations, f32 sums), in both scale modes (outer
// vector where the device has it, and the unit-scale + epilogue fallback); the
// 128x128 block mode against kernels::linear on block-scaled weights with
// per-token-group activations. Bound: f32 summation order plus one bf16
// rounding of the output. Then the scale-mode probe (which cuBLASLt modes the
// device accepts; the chosen mode must be among them) and a timing of fp8
// against the bf16 GEMM on Llama-3-8B shapes (printed; no bound).

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/model/fp8_matrix.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

int device_compute_capability() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

struct Fp8Case {
  int32_t m, n, k;
};

class Fp8GemmTest : public ::testing::TestWithParam<std::tuple<Fp8Case, Fp8ScaleMode>> {};

TEST_P(Fp8GemmTest, MatchesTheCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  const Fp8Case c = std::get<0>(GetParam());
  const Fp8ScaleMode mode = std::get<1>(GetParam());
  if (mode != Fp8ScaleMode::kEpilogue && device_compute_capability() != 90)
    GTEST_SKIP() << "outer-vector scales are sm_90's";
  std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -2, 2, 31);
  for (int32_t k = 0; k < c.k; ++k) x[k] = 0.0f;  // an all-zero token: scale 0
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(c.n) * c.k, -0.1f, 0.1f, 32);

  // CPU: per-channel fp8 weights (--quantization fp8), per-token fp8 activations in kernels::linear.
  std::vector<uint8_t> w_q(w.size());
  std::vector<float> w_scales(static_cast<size_t>(c.n));
  for (int32_t r = 0; r < c.n; ++r)
    w_scales[r] = quantize_fp8_row(w.data() + static_cast<size_t>(r) * c.k, c.k, w_q.data() + static_cast<size_t>(r) * c.k);
  WeightMatrix wm{DType::kFP8E4M3, w_q.data(), static_cast<size_t>(c.n), static_cast<size_t>(c.k)};
  wm.fp8.layout = Fp8WeightScale::kChannel;
  wm.fp8.scales = w_scales.data();
  wm.fp8.activation = Fp8Activation::kDynamicToken;
  std::vector<float> want(static_cast<size_t>(c.m) * c.n);
  kernels::linear(x.data(), c.m, wm, nullptr, want.data());

  // The activation bytes the CPU reference would store.
  std::vector<uint8_t> x_q_want(x.size());
  std::vector<float> x_scales_want(static_cast<size_t>(c.m));
  for (int32_t r = 0; r < c.m; ++r) {
    float amax = 0.0f;
    for (int32_t k = 0; k < c.k; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(r) * c.k + k]));
    x_scales_want[r] = amax / kFp8E4M3Max;
    for (int32_t k = 0; k < c.k; ++k) {
      const float v = x[static_cast<size_t>(r) * c.k + k];
      x_q_want[static_cast<size_t>(r) * c.k + k] = x_scales_want[r] > 0 ? f32_to_fp8e4m3(v / x_scales_want[r]) : 0;
    }
  }

  auto gemm = Fp8Gemm::create(mode);
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  ASSERT_EQ((*gemm)->mode(), mode);
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_w = to_device(w_q), d_ws = to_device(w_scales);
  auto d_xq = DeviceBuffer::allocate(x.size());
  auto d_xs = DeviceBuffer::allocate(static_cast<size_t>(c.m) * sizeof(float));
  auto d_y = DeviceBuffer::allocate(want.size() * 2);
  ASSERT_TRUE(d_xq.ok() && d_xs.ok() && d_y.ok());
  for (int round = 0; round < 2; ++round) {  // the second call reuses the cached plan
    ASSERT_EQ(quantize_fp8_per_token(d_x.as<__nv_bfloat16>(), c.m, c.k, d_xq->as<uint8_t>(), d_xs->as<float>(),
                                     nullptr), cudaSuccess);
    const Status s = (*gemm)->linear(d_xq->as<uint8_t>(), d_xs->as<float>(), c.m, d_w.as<uint8_t>(),
                                     d_ws.as<float>(), c.n, c.k, d_y->as<__nv_bfloat16>(), nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(to_host<uint8_t>(*d_xq, x.size()), x_q_want);
    EXPECT_EQ(to_host<float>(*d_xs, static_cast<size_t>(c.m)), x_scales_want);
    const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(*d_y, want.size()));
    EXPECT_LE(worst_error_ratio(got, want, 1e-4 * std::sqrt(static_cast<double>(c.k)), 1.0 / 128), 1.0)
        << "m=" << c.m << " n=" << c.n << " k=" << c.k << " round " << round;
  }
  // f32 output (the lm_head's logits): the same sums without the bf16 rounding, so within the f32
  // accumulation's bound alone; the epilogue mode (no outer-vector scales) refuses it as unimplemented.
  auto d_y32 = DeviceBuffer::allocate(want.size() * sizeof(float));
  ASSERT_TRUE(d_y32.ok());
  const Status f32 = (*gemm)->linear_f32(d_xq->as<uint8_t>(), d_xs->as<float>(), c.m, d_w.as<uint8_t>(),
                                         d_ws.as<float>(), c.n, c.k, d_y32->as<float>(), nullptr);
  if (mode == Fp8ScaleMode::kEpilogue) {
    EXPECT_EQ(f32.code(), StatusCode::kUnimplemented) << f32.to_string();
  } else {
    ASSERT_TRUE(f32.ok()) << f32.to_string();
    const std::vector<float> got = to_host<float>(*d_y32, want.size());
    EXPECT_LE(worst_error_ratio(got, want, 1e-4 * std::sqrt(static_cast<double>(c.k)), 1e-5), 1.0)
        << "f32 output, m=" << c.m << " n=" << c.n << " k=" << c.k;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8GemmTest,
                         ::testing::Combine(::testing::Values(Fp8Case{1, 4096, 4096}, Fp8Case{7, 1024, 4096},
                                                              Fp8Case{64, 256, 64}, Fp8Case{300, 512, 1024},
                                                              Fp8Case{33, 6144, 512}),
                                            ::testing::Values(Fp8ScaleMode::kOuterVector, Fp8ScaleMode::kEpilogue,
                                                              Fp8ScaleMode::kMixed)));

TEST(Fp8ScaleModeTest, DefaultFollowsTheComputeCapability) {
  EXPECT_EQ(default_fp8_scale_mode(90), Fp8ScaleMode::kMixed);
  EXPECT_EQ(default_fp8_scale_mode(89), Fp8ScaleMode::kEpilogue);
  EXPECT_EQ(default_fp8_scale_mode(100), Fp8ScaleMode::kEpilogue);
  EXPECT_EQ(default_fp8_scale_mode(120), Fp8ScaleMode::kEpilogue);
  EXPECT_EQ(fp8_block_groups(4096), 32);
  EXPECT_EQ(fp8_block_groups(4100), 33);
  EXPECT_EQ(fp8_block_padded_rows(1), 4);
  EXPECT_EQ(fp8_block_padded_rows(8), 8);
  EXPECT_EQ(fp8_block_weight_scale_stride(14336), 112);
  EXPECT_EQ(fp8_block_weight_scale_stride(4096 + 128), 36);
}

// 128x128 weight blocks x 128-column activation groups (block fp8 checkpoints) against kernels::linear.
TEST_P(Fp8GemmTest, Block128MatchesTheCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  const Fp8Case c = std::get<0>(GetParam());
  if (std::get<1>(GetParam()) != Fp8ScaleMode::kEpilogue) GTEST_SKIP() << "one run per shape";
  auto gemm = Fp8Gemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  if (!(*gemm)->block128_supported()) GTEST_SKIP() << "128x128 block scales are sm_90's";
  const int32_t groups = fp8_block_groups(c.k), row_blocks = (c.n + 127) / 128;
  const int32_t stride = fp8_block_weight_scale_stride(c.k), rows = fp8_block_padded_rows(c.m);
  std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -2, 2, 41);
  for (int32_t k = 0; k < std::min(c.k, 128); ++k) x[k] = 0.0f;  // an all-zero group: scale 0
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(c.n) * c.k, -0.1f, 0.1f, 42);
  // Block-quantized weights, scales row-major [row_blocks][groups] (the checkpoint's) and padded for the GPU.
  std::vector<uint8_t> w_q(w.size());
  std::vector<float> scales(static_cast<size_t>(row_blocks) * groups), gpu_scales(static_cast<size_t>(row_blocks) * stride, 0.0f);
  for (int32_t rb = 0; rb < row_blocks; ++rb) {
    for (int32_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (int32_t r = rb * 128; r < std::min(c.n, rb * 128 + 128); ++r)
        for (int32_t k = g * 128; k < std::min(c.k, g * 128 + 128); ++k)
          amax = std::max(amax, std::fabs(w[static_cast<size_t>(r) * c.k + k]));
      const float s = amax / kFp8E4M3Max;
      scales[static_cast<size_t>(rb) * groups + g] = s;
      gpu_scales[static_cast<size_t>(rb) * stride + g] = s;
      for (int32_t r = rb * 128; r < std::min(c.n, rb * 128 + 128); ++r)
        for (int32_t k = g * 128; k < std::min(c.k, g * 128 + 128); ++k)
          w_q[static_cast<size_t>(r) * c.k + k] = s > 0 ? f32_to_fp8e4m3(w[static_cast<size_t>(r) * c.k + k] / s) : 0;
    }
  }
  WeightMatrix wm{DType::kFP8E4M3, w_q.data(), static_cast<size_t>(c.n), static_cast<size_t>(c.k)};
  wm.fp8.layout = Fp8WeightScale::kBlock;
  wm.fp8.scales = scales.data();
  wm.fp8.block_rows = wm.fp8.block_cols = 128;
  wm.fp8.activation = Fp8Activation::kDynamicGroup;
  wm.fp8.activation_group = 128;
  std::vector<float> want(static_cast<size_t>(c.m) * c.n);
  kernels::linear(x.data(), c.m, wm, nullptr, want.data());

  std::vector<float> x_padded = x;
  x_padded.resize(static_cast<size_t>(rows) * c.k, 0.0f);
  DeviceBuffer d_x = to_device(to_bf16_bits(x_padded)), d_w = to_device(w_q), d_ws = to_device(gpu_scales);
  auto d_xq = DeviceBuffer::allocate(static_cast<size_t>(rows) * c.k);
  auto d_xs = DeviceBuffer::allocate(static_cast<size_t>(rows) * groups * sizeof(float));
  auto d_y = DeviceBuffer::allocate(static_cast<size_t>(rows) * c.n * 2);
  ASSERT_TRUE(d_xq.ok() && d_xs.ok() && d_y.ok());
  ASSERT_EQ(quantize_fp8_per_token_group128(d_x.as<__nv_bfloat16>(), c.m, rows, c.k, d_xq->as<uint8_t>(),
                                            d_xs->as<float>(), rows, nullptr), cudaSuccess);
  const Status s = (*gemm)->linear_block128(d_xq->as<uint8_t>(), d_xs->as<float>(), c.m, d_w.as<uint8_t>(),
                                            d_ws.as<float>(), c.n, c.k, d_y->as<__nv_bfloat16>(), nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::vector<float> got = from_bf16_bits(to_host<uint16_t>(*d_y, static_cast<size_t>(rows) * c.n));
  got.resize(want.size());
  EXPECT_LE(worst_error_ratio(got, want, 1e-4 * std::sqrt(static_cast<double>(c.k)), 1.0 / 128), 1.0)
      << "m=" << c.m << " n=" << c.n << " k=" << c.k;
}

// Which cuBLASLt scale modes this device's library accepts for e4m3 x e4m3 -> bf16 (printed: the table in
// docs/CPU_QUANT.md), and the mode create() chooses must be one of them at every Llama-3-8B shape.
TEST(Fp8ScaleModeTest, ProbeAndChosenModeAccepted) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto gemm = Fp8Gemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  struct ModePair { int32_t weight, activation; const char* name; };
  const ModePair pairs[] = {
      {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, "scalar x scalar"},
      {CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, "outer x outer"},
      {CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, "outer x scalar"},
      {CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, "blk128x128 x vec128"},
      {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, "vec128 x vec128"},
      {CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, "blk x blk"},
  };
  const int32_t ms[] = {1, 3, 4, 16, 64, 256, 2048};
  std::printf("fp8-probe compute capability %d, chosen mode %s\n", device_compute_capability(),
              fp8_scale_mode_name((*gemm)->mode()));
  for (const ModePair& p : pairs) {
    std::printf("fp8-probe %-22s", p.name);
    for (int32_t m : ms) {
      const Fp8Gemm::Acceptance a = (*gemm)->probe(p.weight, p.activation, m, 4096, 4096);
      std::printf(" m=%d:%s", m, a.accepted ? "yes" : ("no(" + std::to_string(a.status) + ")").c_str());
    }
    std::printf("\n");
  }
  // kMixed runs unit (scalar) scales up to kEpilogueMaxRows rows and outer vectors above; kEpilogue scalar only.
  const Fp8ScaleMode mode = (*gemm)->mode();
  for (const auto& [n, k] : {std::pair{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}) {
    for (int32_t m : ms) {
      const bool outer = mode == Fp8ScaleMode::kOuterVector ||
                         (mode == Fp8ScaleMode::kMixed && m > Fp8Gemm::kEpilogueMaxRows);
      const int32_t chosen = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      EXPECT_TRUE((*gemm)->probe(chosen, chosen, m, n, k).accepted) << "m=" << m << " n=" << n << " k=" << k;
    }
  }
}

// Time of n GEMMs (after warm-up), in microseconds per GEMM.
template <typename F>
double time_us(F&& call, int reps) {
  for (int i = 0; i < 3; ++i) call();
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) call();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}

TEST(Fp8GemmSpeed, Llama3_8BShapes) {
  PAGODA_SKIP_WITHOUT_GPU();
  // "fp8": outer-vector scales where the device has them; "epilogue": unit scales + the scaling kernel.
  auto fp8 = device_compute_capability() == 90 ? Fp8Gemm::create(Fp8ScaleMode::kOuterVector) : Fp8Gemm::create();
  auto fp8_epilogue = Fp8Gemm::create(Fp8ScaleMode::kEpilogue);
  auto bf16 = Gemm::create();
  ASSERT_TRUE(fp8.ok() && fp8_epilogue.ok() && bf16.ok());
  const bool block = (*fp8)->block128_supported();
  std::printf("fp8-gemm mode %s (us per GEMM; TFLOP/s of the GEMM alone)\n", fp8_scale_mode_name((*fp8)->mode()));
  struct Shape { int32_t n, k; const char* name; };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o"}, {28672, 4096, "gate_up"}, {4096, 14336, "down"}};
  const int32_t ms[] = {1, 16, 64, 256, 2048};
  constexpr int32_t kMaxM = 2048;
  for (const Shape& s : shapes) {
    auto w8 = DeviceBuffer::allocate(static_cast<size_t>(s.n) * s.k);
    auto w16 = DeviceBuffer::allocate(static_cast<size_t>(s.n) * s.k * 2);
    auto ws = DeviceBuffer::allocate(size_t{1} << 20);
    auto x8 = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.k);
    auto x16 = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.k * 2);
    auto xs = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * fp8_block_groups(s.k) * 4);
    auto y = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.n * 2);
    ASSERT_TRUE(w8.ok() && w16.ok() && ws.ok() && x8.ok() && x16.ok() && xs.ok() && y.ok());
    cudaMemset(w8->data(), 0x30, w8->bytes());
    cudaMemset(w16->data(), 0x3c, w16->bytes());
    cudaMemset(x16->data(), 0x3c, x16->bytes());
    const std::vector<float> scales((size_t{1} << 20) / 4, 1.0f / 448.0f);
    cudaMemcpy(ws->data(), scales.data(), ws->bytes(), cudaMemcpyHostToDevice);
    for (int32_t m : ms) {
      Status status = ok_status();
      auto check = [&status] { return status.ok(); };
      const double quantize = time_us([&] {
        quantize_fp8_per_token(x16->as<__nv_bfloat16>(), m, s.k, x8->as<uint8_t>(), xs->as<float>(), nullptr);
      }, 50);
      const double us8 = time_us([&] {
        status = (*fp8)->linear(x8->as<uint8_t>(), xs->as<float>(), m, w8->as<uint8_t>(), ws->as<float>(), s.n, s.k,
                                y->as<__nv_bfloat16>(), nullptr);
      }, 50);
      ASSERT_TRUE(check()) << status.to_string();
      const double us8e = time_us([&] {
        status = (*fp8_epilogue)->linear(x8->as<uint8_t>(), xs->as<float>(), m, w8->as<uint8_t>(), ws->as<float>(),
                                         s.n, s.k, y->as<__nv_bfloat16>(), nullptr);
      }, 50);
      ASSERT_TRUE(check()) << status.to_string();
      double us8b = 0.0;
      if (block) {
        const int32_t rows = fp8_block_padded_rows(m);
        quantize_fp8_per_token_group128(x16->as<__nv_bfloat16>(), m, rows, s.k, x8->as<uint8_t>(), xs->as<float>(),
                                        rows, nullptr);
        us8b = time_us([&] {
          status = (*fp8)->linear_block128(x8->as<uint8_t>(), xs->as<float>(), m, w8->as<uint8_t>(), ws->as<float>(),
                                           s.n, s.k, y->as<__nv_bfloat16>(), nullptr);
        }, 50);
        ASSERT_TRUE(check()) << status.to_string();
      }
      const double us16 = time_us([&] {
        status = (*bf16)->linear(x16->as<__nv_bfloat16>(), m, w16->as<__nv_bfloat16>(), s.n, s.k, y->data(),
                                 GemmOutput::kBF16, nullptr);
      }, 50);
      ASSERT_TRUE(check()) << status.to_string();
      const double tflop = 2.0 * m * s.n * s.k * 1e-6;
      std::printf("fp8-gemm %-8s m=%5d n=%5d k=%5d: bf16 %8.1f us %6.1f | fp8 %8.1f us %6.1f (%.2fx) | "
                  "epilogue %8.1f us %6.1f | block128 %8.1f us %6.1f | quantize %6.1f us\n",
                  s.name, m, s.n, s.k, us16, tflop / us16, us8, tflop / us8, us16 / us8, us8e, tflop / us8e, us8b,
                  us8b > 0 ? tflop / us8b : 0.0, quantize);
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
