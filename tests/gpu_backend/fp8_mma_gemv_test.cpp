// The tensor-core fp8 GEMV (backend/cuda/fp8_mma_gemv.h) against a CPU reference in double of the same
// quantized operands (e4m3 activations with per-row scales, e4m3 weights with per-channel scales) and against
// cuBLASLt's fp8 GEMM on the same bytes, at every row count 1-8, the Llama-3-8B shapes and odd ones (n not a
// multiple of 16, k of one 64-byte step, k not a multiple of the warps' rounds); both outputs (bf16, f32);
// run to run bit for bit; every output written; the launch contract (cuBLASLt's distance from the reference is
// printed beside this kernel's, not bounded). Then weight-read bandwidth against the
// weight-only GEMV and cuBLASLt (GemvSpeed.*, printed, no bound).
// Bound: f32 summation order plus one bf16 rounding of the output (f32 output: summation order only).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/fp8_mma_gemv.h"
#include "pagoda/backend/cuda/fp8_ops.h"
#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/core/dtype.h"
#include "pagoda/model/fp8_matrix.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

struct MmaGemvCase {
  int32_t m, n, k;
};

// Row-wise e4m3 quantization (amax / 448 per row) and the dequantized values.
struct QuantizedRows {
  std::vector<uint8_t> q;
  std::vector<float> scales, deq;
};

QuantizedRows quantize_rows(const std::vector<float>& v, int32_t rows, int32_t cols) {
  QuantizedRows out;
  out.q.resize(v.size());
  out.deq.resize(v.size());
  out.scales.resize(static_cast<size_t>(rows));
  for (int32_t r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r) * cols;
    out.scales[r] = quantize_fp8_row(v.data() + o, static_cast<size_t>(cols), out.q.data() + o);
    for (int32_t c = 0; c < cols; ++c) out.deq[o + c] = fp8e4m3_to_f32(out.q[o + c]) * out.scales[r];
  }
  return out;
}

class Fp8MmaGemvTest : public ::testing::TestWithParam<MmaGemvCase> {};

TEST_P(Fp8MmaGemvTest, MatchesTheReferenceAndTheFp8Gemm) {
  PAGODA_SKIP_WITHOUT_GPU();
  const MmaGemvCase c = GetParam();
  std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -2, 2, 71);
  std::vector<float> w = random_bf16_values(static_cast<size_t>(c.n) * c.k, -0.1f, 0.1f, 72);
  // Uneven magnitudes per row so the scales matter.
  for (int32_t r = 0; r < c.n; ++r)
    for (int32_t i = 0; i < c.k; ++i) w[static_cast<size_t>(r) * c.k + i] *= 1.0f + static_cast<float>(r % 5);
  for (int32_t r = 0; r < c.m; ++r)
    for (int32_t i = 0; i < c.k; ++i) x[static_cast<size_t>(r) * c.k + i] *= 1.0f + 3.0f * static_cast<float>(r % 3);
  const QuantizedRows qx = quantize_rows(x, c.m, c.k), qw = quantize_rows(w, c.n, c.k);
  std::vector<float> want(static_cast<size_t>(c.m) * c.n);
  double max_want = 0.0;
  for (int32_t r = 0; r < c.m; ++r)
    for (int32_t col = 0; col < c.n; ++col) {
      double sum = 0.0;
      for (int32_t i = 0; i < c.k; ++i)
        sum += static_cast<double>(qx.deq[static_cast<size_t>(r) * c.k + i]) * qw.deq[static_cast<size_t>(col) * c.k + i];
      want[static_cast<size_t>(r) * c.n + col] = static_cast<float>(sum);
      max_want = std::max(max_want, std::fabs(sum));
    }
  EXPECT_GT(max_want, 0.1);  // not trivially zero
  DeviceBuffer d_x = to_device(qx.q), d_xs = to_device(qx.scales), d_w = to_device(qw.q), d_ws = to_device(qw.scales);
  auto d_y = DeviceBuffer::allocate(want.size() * 2);
  auto d_y32 = DeviceBuffer::allocate(want.size() * 4);
  ASSERT_TRUE(d_y.ok() && d_y32.ok());
  ASSERT_TRUE(fp8_mma_gemv_supported(c.m, c.k, d_x.data(), d_w.data()));
  const double bound_abs = 1e-4 * std::sqrt(static_cast<double>(c.k));
  std::vector<uint16_t> first;  // the automatic shape's
  for (int32_t shape = static_cast<int32_t>(std::size(kFp8MmaGemvShapes)) - 1; shape >= kFp8MmaGemvAutoShape;
       --shape) {
    std::vector<uint16_t> shape_first;
    for (int run = 0; run < 2; ++run) {
      ASSERT_EQ(cudaMemset(d_y->data(), 0xff, d_y->bytes()), cudaSuccess);  // NaNs where nothing is written
      ASSERT_EQ(fp8_mma_gemv(d_x.as<uint8_t>(), d_xs.as<float>(), c.m, d_w.as<uint8_t>(), d_ws.as<float>(), c.n, c.k,
                             d_y->data(), false, nullptr, shape),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> bits = to_host<uint16_t>(*d_y, want.size());
      if (run == 0) {
        shape_first = bits;
        const std::vector<float> got = from_bf16_bits(bits);
        for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "an output was not written, shape " << shape;
        EXPECT_LE(worst_error_ratio(got, want, bound_abs, 1.0 / 128), 1.0) << "shape " << shape;
      } else {
        EXPECT_EQ(bits, shape_first) << "results differ between runs, shape " << shape;
      }
    }
    if (shape == kFp8MmaGemvAutoShape) first = shape_first;
  }
  ASSERT_EQ(fp8_mma_gemv(d_x.as<uint8_t>(), d_xs.as<float>(), c.m, d_w.as<uint8_t>(), d_ws.as<float>(), c.n, c.k,
                         d_y32->data(), true, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got32 = to_host<float>(*d_y32, want.size());
  EXPECT_LE(worst_error_ratio(got32, want, bound_abs, 1e-5), 1.0);
  EXPECT_EQ(testing::to_bf16_bits(got32), first) << "f32 output rounded to bf16 differs from the bf16 output";
  // cuBLASLt's fp8 GEMM on the same bytes (its shapes: n and k multiples of 16): two bf16 roundings apart.
  auto gemm = Fp8Gemm::create();
  if (gemm.ok() && c.n % 16 == 0) {
    auto d_g = DeviceBuffer::allocate(want.size() * 2);
    ASSERT_TRUE(d_g.ok());
    const Status s = (*gemm)->linear(d_x.as<uint8_t>(), d_xs.as<float>(), c.m, d_w.as<uint8_t>(), d_ws.as<float>(), c.n,
                                     c.k, d_g->as<__nv_bfloat16>(), nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Printed, not bounded: at m = 8, k = 1,024 cuBLASLt's result was ~2x the bound away from this kernel's,
    // while this kernel stays inside the reference's bound at every case (above).
    const std::vector<float> cublas = from_bf16_bits(to_host<uint16_t>(*d_g, want.size()));
    std::printf("[ figure ] m=%d n=%d k=%d: tensor-core GEMV vs reference %.3f, cuBLASLt vs reference %.3f (of the "
                "bound)\n",
                c.m, c.n, c.k, worst_error_ratio(from_bf16_bits(first), want, bound_abs, 1.0 / 128),
                worst_error_ratio(cublas, want, bound_abs, 1.0 / 128));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8MmaGemvTest,
                         ::testing::Values(MmaGemvCase{1, 6144, 4096}, MmaGemvCase{2, 4096, 4096},
                                           MmaGemvCase{3, 512, 14336}, MmaGemvCase{4, 2048, 512},
                                           MmaGemvCase{5, 37, 64}, MmaGemvCase{6, 130, 448},
                                           MmaGemvCase{7, 301, 2112}, MmaGemvCase{8, 4096, 1024},
                                           MmaGemvCase{1, 1, 64}, MmaGemvCase{8, 259, 14336},
                                           MmaGemvCase{2, 1000, 4096}),
                         [](const ::testing::TestParamInfo<MmaGemvCase>& info) {
                           return "m" + std::to_string(info.param.m) + "_n" + std::to_string(info.param.n) + "_k" +
                                  std::to_string(info.param.k);
                         });

TEST(Fp8MmaGemvContract, UnsupportedShapesAreRefused) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto x = DeviceBuffer::allocate(16 * 1024);
  auto w = DeviceBuffer::allocate(16 * 1024);
  auto s = DeviceBuffer::allocate(1024);
  auto y = DeviceBuffer::allocate(16 * 1024);
  ASSERT_TRUE(x.ok() && w.ok() && s.ok() && y.ok());
  const uint8_t* xq = x->as<uint8_t>();
  const uint8_t* wq = w->as<uint8_t>();
  EXPECT_FALSE(fp8_mma_gemv_supported(0, 64, xq, wq));
  EXPECT_FALSE(fp8_mma_gemv_supported(kFp8MmaGemvMaxRows + 1, 64, xq, wq));
  EXPECT_FALSE(fp8_mma_gemv_supported(1, 48, xq, wq));       // k % 64
  EXPECT_FALSE(fp8_mma_gemv_supported(1, 64, xq + 8, wq));   // misaligned
  EXPECT_TRUE(fp8_mma_gemv_supported(kFp8MmaGemvMaxRows, 128, xq, wq));
  EXPECT_EQ(fp8_mma_gemv(xq, s->as<float>(), 1, wq, s->as<float>(), 16, 48, y->data(), false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(fp8_mma_gemv(xq, s->as<float>(), 1, wq, s->as<float>(), 0, 64, y->data(), false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(fp8_mma_gemv(xq, nullptr, 1, wq, s->as<float>(), 16, 64, y->data(), false, nullptr), cudaErrorInvalidValue);
  for (int32_t shape : {-2, static_cast<int32_t>(std::size(kFp8MmaGemvShapes))})
    EXPECT_EQ(fp8_mma_gemv(xq, s->as<float>(), 1, wq, s->as<float>(), 16, 64, y->data(), false, nullptr, shape),
              cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Weight-read bandwidth (GB/s = weight bytes / time; each call on a fresh copy of the weights, >= 256 MiB in
// all, so none finds them in L2) of the tensor-core GEMV, the weight-only GEMV (bf16 activations) and
// cuBLASLt's fp8 GEMM (+ the activations' quantization, which the decode step fuses into the norms) at the
// Llama-3-8B shapes, m = 1, 2, 4, 8, two rounds.
TEST(GemvSpeed, Fp8MmaGemv) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto fp8 = Fp8Gemm::create();
  struct Shape { int32_t n, k; const char* name; };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o"}, {28672, 4096, "gate_up"}, {4096, 14336, "down"},
                          {128256, 4096, "lm_head"}};
  constexpr size_t kSpan = size_t{256} << 20;
  for (const Shape& s : shapes) {
    const size_t bytes = static_cast<size_t>(s.n) * s.k;
    const int copies = static_cast<int>(std::max<size_t>(1, (kSpan + bytes - 1) / bytes));
    auto w = DeviceBuffer::allocate(bytes * copies);
    auto ws = DeviceBuffer::allocate(static_cast<size_t>(s.n) * 4);
    auto x16 = DeviceBuffer::allocate(static_cast<size_t>(kFp8MmaGemvMaxRows) * s.k * 2);
    auto x8 = DeviceBuffer::allocate(static_cast<size_t>(kFp8MmaGemvMaxRows) * s.k);
    auto xs = DeviceBuffer::allocate(static_cast<size_t>(kFp8MmaGemvMaxRows) * 4);
    auto y = DeviceBuffer::allocate(static_cast<size_t>(kFp8MmaGemvMaxRows) * s.n * 4);
    ASSERT_TRUE(w.ok() && ws.ok() && x16.ok() && x8.ok() && xs.ok() && y.ok());
    cudaMemset(w->data(), 0x30, w->bytes());
    cudaMemset(x16->data(), 0x3c, x16->bytes());
    cudaMemset(x8->data(), 0x30, x8->bytes());
    const std::vector<float> scales(static_cast<size_t>(std::max(s.n, kFp8MmaGemvMaxRows)), 1.0f / 448.0f);
    cudaMemcpy(ws->data(), scales.data(), ws->bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(xs->data(), scales.data(), xs->bytes(), cudaMemcpyHostToDevice);
    const bool head = s.n == 128256;
    for (int32_t m : {1, 2, 4, 8}) {
      for (int round = 1; round <= 2; ++round) {
        int i = 0;
        auto w_next = [&] { return w->as<uint8_t>() + static_cast<size_t>(i++ % copies) * bytes; };
        double shapes_us[std::size(kFp8MmaGemvShapes)];
        for (size_t shape = 0; shape < std::size(kFp8MmaGemvShapes); ++shape)
          shapes_us[shape] = testing::time_us_per_call([&] {
            fp8_mma_gemv(x8->as<uint8_t>(), xs->as<float>(), m, w_next(), ws->as<float>(), s.n, s.k, y->data(), head,
                         nullptr, static_cast<int32_t>(shape));
          }, 40);
        const double mma = testing::time_us_per_call([&] {
          fp8_mma_gemv(x8->as<uint8_t>(), xs->as<float>(), m, w_next(), ws->as<float>(), s.n, s.k, y->data(), head,
                       nullptr);
        }, 40);
        const double weight_only = testing::time_us_per_call([&] {
          if (head) {
            gemv_fp8_logits(x16->as<__nv_bfloat16>(), m, w_next(), ws->as<float>(), 0, s.n, s.k, y->as<float>(),
                            nullptr);
          } else {
            gemv_fp8(x16->as<__nv_bfloat16>(), m, w_next(), ws->as<float>(), 0, s.n, s.k, y->as<__nv_bfloat16>(),
                     nullptr);
          }
        }, 40);
        double gemm = 0.0, quantize = 0.0;
        if (fp8.ok()) {
          Status status = ok_status();
          gemm = testing::time_us_per_call([&] {
            status = head ? (*fp8)->linear_f32(x8->as<uint8_t>(), xs->as<float>(), m, w_next(), ws->as<float>(), s.n,
                                               s.k, y->as<float>(), nullptr)
                          : (*fp8)->linear(x8->as<uint8_t>(), xs->as<float>(), m, w_next(), ws->as<float>(), s.n, s.k,
                                           y->as<__nv_bfloat16>(), nullptr);
          }, 40);
          if (!status.ok()) gemm = 0.0;
          quantize = testing::time_us_per_call([&] {
            quantize_fp8_per_token(x16->as<__nv_bfloat16>(), m, s.k, x8->as<uint8_t>(), xs->as<float>(), nullptr);
          }, 40);
        }
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        auto gbs = [&](double us) { return us > 0 ? static_cast<double>(bytes) / (us * 1e3) : 0.0; };
        std::printf("gemv-mma %-8s m=%d round %d | tensor-core (auto) %7.2f us %6.0f GB/s | weight-only %7.2f us %6.0f GB/s "
                    "| cublaslt %7.2f us %6.0f GB/s (+quantize %.1f us) | %.2fx weight-only, %.2fx cublaslt\n",
                    s.name, m, round, mma, gbs(mma), weight_only, gbs(weight_only), gemm, gbs(gemm), quantize,
                    weight_only / mma, gemm > 0 ? gemm / mma : 0.0);
        std::printf("gemv-mma-shapes %-8s m=%d round %d |", s.name, m, round);
        for (size_t shape = 0; shape < std::size(kFp8MmaGemvShapes); ++shape)
          std::printf(" %dx%d %7.2f us %6.0f GB/s |", kFp8MmaGemvShapes[shape].warps, kFp8MmaGemvShapes[shape].unroll,
                      shapes_us[shape], gbs(shapes_us[shape]));
        std::printf("\n");
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
