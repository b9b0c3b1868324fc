// FP8 GEMMs on the GPU (backend/cuda/fp8_gemm.h) against the CPU reference of
// the same arithmetic (model/fp8_matrix.h): the per-token activation
// quantization byte for byte, and the scaled e4m3 GEMM against kernels::linear
// on per-channel fp8 weights with dynamic per-token activations (dequantized
// weights, fp8-rounded activations, f32 sums). Bound: f32 summation order plus
// one bf16 rounding of the output. Then a timing of fp8 against the bf16 GEMM
// on Llama-3-8B shapes (printed; no bound).

#include <chrono>
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

struct Fp8Case {
  int32_t m, n, k;
};

class Fp8GemmTest : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8GemmTest, MatchesTheCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  const Fp8Case c = GetParam();
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

  auto gemm = Fp8Gemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
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
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8GemmTest,
                         ::testing::Values(Fp8Case{1, 4096, 4096}, Fp8Case{7, 1024, 4096}, Fp8Case{64, 256, 64},
                                           Fp8Case{300, 512, 1024}, Fp8Case{33, 6144, 512}));

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
  auto fp8 = Fp8Gemm::create();
  auto bf16 = Gemm::create();
  ASSERT_TRUE(fp8.ok() && bf16.ok());
  struct Shape { int32_t n, k; const char* name; };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o"}, {28672, 4096, "gate_up"}, {4096, 14336, "down"}};
  const int32_t ms[] = {1, 64, 256, 1024, 4096};
  for (const Shape& s : shapes) {
    auto w8 = DeviceBuffer::allocate(static_cast<size_t>(s.n) * s.k);
    auto w16 = DeviceBuffer::allocate(static_cast<size_t>(s.n) * s.k * 2);
    auto ws = DeviceBuffer::allocate(static_cast<size_t>(s.n) * 4);
    auto x8 = DeviceBuffer::allocate(static_cast<size_t>(4096) * s.k);
    auto x16 = DeviceBuffer::allocate(static_cast<size_t>(4096) * s.k * 2);
    auto xs = DeviceBuffer::allocate(4096 * 4);
    auto y = DeviceBuffer::allocate(static_cast<size_t>(4096) * s.n * 2);
    ASSERT_TRUE(w8.ok() && w16.ok() && ws.ok() && x8.ok() && x16.ok() && xs.ok() && y.ok());
    cudaMemset(w8->data(), 0x30, w8->bytes());
    cudaMemset(w16->data(), 0x3c, w16->bytes());
    cudaMemset(x16->data(), 0x3c, x16->bytes());
    const std::vector<float> ones(4096, 1.0f / 448.0f);
    cudaMemcpy(ws->data(), ones.data(), static_cast<size_t>(s.n) * 4, cudaMemcpyHostToDevice);
    for (int32_t m : ms) {
      Status status = ok_status();
      const double us8 = time_us([&] {
        quantize_fp8_per_token(x16->as<__nv_bfloat16>(), m, s.k, x8->as<uint8_t>(), xs->as<float>(), nullptr);
        status = (*fp8)->linear(x8->as<uint8_t>(), xs->as<float>(), m, w8->as<uint8_t>(), ws->as<float>(), s.n, s.k,
                                y->as<__nv_bfloat16>(), nullptr);
      }, 20);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const double us16 = time_us([&] {
        status = (*bf16)->linear(x16->as<__nv_bfloat16>(), m, w16->as<__nv_bfloat16>(), s.n, s.k, y->data(),
                                 GemmOutput::kBF16, nullptr);
      }, 20);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const double flops = 2.0 * m * s.n * s.k;
      std::printf("fp8-gemm %-8s m=%5d n=%5d k=%5d: fp8 (quantize + gemm) %9.1f us %7.1f TFLOP/s | bf16 %9.1f us "
                  "%7.1f TFLOP/s | bf16/fp8 %.2fx\n", s.name, m, s.n, s.k, us8, flops / us8 * 1e-6, us16,
                  flops / us16 * 1e-6, us16 / us8);
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
