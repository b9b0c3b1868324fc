// cuBLASLt bf16 GEMMs (f32 accumulate) against the CPU linear layer on the same
// bf16 inputs. Bound: f32 summation order (tiny) plus one bf16 rounding of the
// output for bf16 results; f32 results only differ by summation order.

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cpu/kernels/matmul.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

struct GemmCase {
  int32_t m, n, k;
  GemmOutput output;
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesCpuLinear) {
  PAGODA_SKIP_WITHOUT_GPU();
  const GemmCase c = GetParam();
  const std::vector<float> x = random_bf16_values(static_cast<size_t>(c.m) * c.k, -1, 1, 21);
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(c.n) * c.k, -1, 1, 22);
  const std::vector<uint16_t> w_bits = to_bf16_bits(w);
  std::vector<float> want(static_cast<size_t>(c.m) * c.n);
  kernels::linear(x.data(), c.m, WeightMatrix{DType::kBF16, w_bits.data(), static_cast<size_t>(c.n),
                                                       static_cast<size_t>(c.k)}, nullptr, want.data());

  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_w = to_device(w_bits);
  const size_t out_bytes = want.size() * (c.output == GemmOutput::kF32 ? 4 : 2);
  auto y = DeviceBuffer::allocate(out_bytes);
  // Twice: the second call reuses the cached plan.
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaMemset(y->data(), 0, out_bytes), cudaSuccess);
    const Status s = (*gemm)->linear(d_x.as<__nv_bfloat16>(), c.m, d_w.as<__nv_bfloat16>(), c.n, c.k, y->data(), c.output, nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    const std::vector<float> got = c.output == GemmOutput::kF32
                                       ? to_host<float>(*y, want.size())
                                       : from_bf16_bits(to_host<uint16_t>(*y, want.size()));
    const double rel = c.output == GemmOutput::kF32 ? 1e-4 : 1.0 / 128;
    EXPECT_LE(worst_error_ratio(got, want, 1e-3 * std::sqrt(static_cast<double>(c.k)), rel), 1.0)
        << "m=" << c.m << " n=" << c.n << " k=" << c.k << " round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Values(GemmCase{1, 4096, 4096, GemmOutput::kBF16},
                                           GemmCase{7, 6144, 4096, GemmOutput::kBF16},
                                           GemmCase{64, 256, 64, GemmOutput::kBF16},
                                           GemmCase{300, 512, 1024, GemmOutput::kBF16},
                                           // Above Gemm::kMaxTunedRows: the large-m tuner's algorithm.
                                           GemmCase{1100, 512, 1024, GemmOutput::kBF16},
                                           GemmCase{700, 1024, 512, GemmOutput::kF32},
                                           GemmCase{5, 1000, 512, GemmOutput::kF32},
                                           GemmCase{2, 256, 160, GemmOutput::kF32}));

}  // namespace
}  // namespace pagoda::cuda
