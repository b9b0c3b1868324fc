// add_rmsnorm_fp8 and silu_mul_fp8 (fp8_ops.h): byte for byte what the unfused pair (add_rmsnorm / rmsnorm /
// silu_mul into bf16, then quantize_fp8_per_token) writes, at decode and prefill row counts and at even, odd
// and non-multiple-of-the-block widths; and that quantization against the CPU's (quantize_fp8_row of the bf16
// rows: the same bytes) and against the f32 CPU reference (dequantized, within one e4m3 rounding).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cpu/kernels/rmsnorm.h"
#include "pagoda/backend/cpu/kernels/silu_mul.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/fp8_ops.h"
#include "pagoda/core/dtype.h"
#include "pagoda/model/fp8_matrix.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;

struct Quantized {
  std::vector<uint8_t> q;
  std::vector<float> scales;
};

Quantized read_quantized(const DeviceBuffer& q, const DeviceBuffer& s, int32_t rows, int32_t k) {
  return {to_host<uint8_t>(q, static_cast<size_t>(rows) * k), to_host<float>(s, static_cast<size_t>(rows))};
}

// Rows checked against the CPU: all of them up to 512, else the first and last 32.
std::vector<int32_t> checked_rows(int32_t rows) {
  std::vector<int32_t> out;
  for (int32_t r = 0; r < rows; ++r)
    if (rows <= 512 || r < 32 || r >= rows - 32) out.push_back(r);
  return out;
}

// bf16_rows [rows, k] (the unfused kernel's output) quantized by the CPU equals got, byte for byte; got
// dequantized is within one e4m3 rounding (plus the bf16 one and reduction order) of want_f32 [rows, k].
void expect_matches_cpu(const Quantized& got, const std::vector<float>& bf16_rows, const std::vector<float>& want_f32,
                        int32_t rows, int32_t k, const char* what) {
  std::vector<uint8_t> cpu_q(static_cast<size_t>(k));
  const float* table = fp8e4m3_table();
  for (int32_t r : checked_rows(rows)) {
    const size_t base = static_cast<size_t>(r) * k;
    const float cpu_scale = quantize_fp8_row(bf16_rows.data() + base, static_cast<size_t>(k), cpu_q.data());
    ASSERT_EQ(cpu_scale, got.scales[r]) << what << " row " << r;
    ASSERT_EQ(std::memcmp(cpu_q.data(), got.q.data() + base, static_cast<size_t>(k)), 0) << what << " row " << r;
    const double scale = got.scales[r];
    for (int32_t c = 0; c < k; ++c) {
      const double deq = table[got.q[base + c]] * scale;
      const double want = want_f32[base + c];
      ASSERT_LE(std::abs(deq - want), scale * 0x1p-9 + 0.07 * std::abs(want) + 1e-6)
          << what << " row " << r << " col " << c;
    }
  }
}

void expect_same_bytes(const Quantized& fused, const Quantized& unfused, const char* what) {
  ASSERT_EQ(fused.scales.size(), unfused.scales.size());
  ASSERT_EQ(std::memcmp(fused.scales.data(), unfused.scales.data(), fused.scales.size() * sizeof(float)), 0)
      << what << ": scales differ";
  ASSERT_EQ(fused.q.size(), unfused.q.size());
  if (std::memcmp(fused.q.data(), unfused.q.data(), fused.q.size()) == 0) return;
  for (size_t i = 0; i < fused.q.size(); ++i)  // name the first byte that differs
    ASSERT_EQ(fused.q[i], unfused.q[i])
        << what << ": byte " << i << " (row " << i / (fused.q.size() / fused.scales.size()) << ")";
}

struct Shape {
  int32_t rows, k;
};

TEST(FusedFp8Quant, AddRmsNormFp8EqualsNormThenQuantize) {
  PAGODA_SKIP_WITHOUT_GPU();
  const float eps = 1e-5f;
  for (const Shape s : {Shape{1, 4096}, Shape{7, 4096}, Shape{512, 4096}, Shape{8192, 4096}, Shape{1, 14336},
                        Shape{7, 14336}, Shape{512, 14336}, Shape{7, 1001}, Shape{512, 77}, Shape{3, 5120}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " dim " << s.k);
    const size_t n = static_cast<size_t>(s.rows) * s.k;
    std::vector<float> residual = random_bf16_values(n, -2, 2, 20 + s.k);
    std::vector<float> delta = random_bf16_values(n, -1, 1, 21 + s.k);
    if (s.rows >= 7) {  // an all-zero row (scale 0, zero bytes) and one with an outlier column
      for (int32_t c = 0; c < s.k; ++c) residual[c] = delta[c] = 0.0f;
      residual[static_cast<size_t>(s.k) + 3] = 40.0f;
    }
    const std::vector<float> w = random_bf16_values(s.k, 0.5f, 1.5f, 22);
    DeviceBuffer d_delta = to_device(to_bf16_bits(delta)), d_w = to_device(w);
    auto bf16_out = DeviceBuffer::allocate(n * 2);
    auto q1 = DeviceBuffer::allocate(n), q2 = DeviceBuffer::allocate(n);
    auto s1 = DeviceBuffer::allocate(s.rows * 4), s2 = DeviceBuffer::allocate(s.rows * 4);

    for (bool with_delta : {true, false}) {  // add_rmsnorm, and rmsnorm (layer 0: delta null)
      SCOPED_TRACE(with_delta ? "with delta" : "delta null");
      DeviceBuffer d_res1 = to_device(residual), d_res2 = to_device(residual);
      const bf16* dd = with_delta ? d_delta.as<bf16>() : nullptr;
      if (with_delta) {
        ASSERT_EQ(add_rmsnorm(d_res1.as<float>(), dd, d_w.as<float>(), bf16_out->as<bf16>(), s.rows, s.k, eps, nullptr),
                  cudaSuccess);
      } else {
        ASSERT_EQ(
            rmsnorm(d_res1.as<float>(), nullptr, d_w.as<float>(), bf16_out->as<bf16>(), s.rows, s.k, eps, nullptr),
            cudaSuccess);
      }
      ASSERT_EQ(quantize_fp8_per_token(bf16_out->as<bf16>(), s.rows, s.k, q1->as<uint8_t>(), s1->as<float>(), nullptr),
                cudaSuccess);
      ASSERT_EQ(add_rmsnorm_fp8(d_res2.as<float>(), dd, d_w.as<float>(), s.rows, s.k, eps, q2->as<uint8_t>(),
                                s2->as<float>(), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Quantized unfused = read_quantized(*q1, *s1, s.rows, s.k), fused = read_quantized(*q2, *s2, s.rows, s.k);
      expect_same_bytes(fused, unfused, "add_rmsnorm_fp8");
      const std::vector<float> res1 = to_host<float>(d_res1, n), res2 = to_host<float>(d_res2, n);
      ASSERT_EQ(std::memcmp(res1.data(), res2.data(), n * 4), 0) << "the residual update differs";

      std::vector<float> sum(residual);
      if (with_delta)
        for (size_t i = 0; i < n; ++i) sum[i] += delta[i];
      std::vector<float> want(n);
      kernels::rmsnorm(sum.data(), w.data(), want.data(), s.rows, s.k, eps);
      expect_matches_cpu(fused, from_bf16_bits(to_host<uint16_t>(*bf16_out, n)), want, s.rows, s.k, "add_rmsnorm_fp8");
      if (s.rows >= 7) {
        EXPECT_EQ(fused.scales[0], 0.0f);
      }
    }
  }
}

TEST(FusedFp8Quant, SiluMulFp8EqualsSiluThenQuantize) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (const Shape s : {Shape{1, 14336}, Shape{7, 14336}, Shape{512, 14336}, Shape{8192, 14336}, Shape{7, 4096},
                        Shape{512, 1001}, Shape{7, 1000}, Shape{3, 7}, Shape{1, 11},
                        // wider than the register path (8 pairs a thread at 1,024 threads): recomputed values,
                        // e.g. Llama-3-70B's 28,672 on one GPU; and an odd width past it.
                        Shape{7, 28672}, Shape{2, 20001}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " intermediate " << s.k);
    const size_t n = static_cast<size_t>(s.rows) * s.k;
    std::vector<float> gate_up = random_bf16_values(2 * n, -6, 6, 30 + s.k);
    if (s.rows >= 7) {  // an all-zero row and an outlier
      for (int32_t c = 0; c < 2 * s.k; ++c) gate_up[c] = 0.0f;
      gate_up[2 * static_cast<size_t>(s.k) + 1] = 30.0f;
    }
    DeviceBuffer d_in = to_device(to_bf16_bits(gate_up));
    auto bf16_out = DeviceBuffer::allocate(n * 2);
    auto q1 = DeviceBuffer::allocate(n), q2 = DeviceBuffer::allocate(n);
    auto s1 = DeviceBuffer::allocate(s.rows * 4), s2 = DeviceBuffer::allocate(s.rows * 4);
    ASSERT_EQ(silu_mul(d_in.as<bf16>(), bf16_out->as<bf16>(), s.rows, s.k, nullptr), cudaSuccess);
    ASSERT_EQ(quantize_fp8_per_token(bf16_out->as<bf16>(), s.rows, s.k, q1->as<uint8_t>(), s1->as<float>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(silu_mul_fp8(d_in.as<bf16>(), s.rows, s.k, q2->as<uint8_t>(), s2->as<float>(), nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Quantized unfused = read_quantized(*q1, *s1, s.rows, s.k), fused = read_quantized(*q2, *s2, s.rows, s.k);
    expect_same_bytes(fused, unfused, "silu_mul_fp8");

    std::vector<float> gate, up;
    for (int32_t r : checked_rows(s.rows)) {
      const float* row = gate_up.data() + static_cast<size_t>(r) * 2 * s.k;
      gate.insert(gate.end(), row, row + s.k);
      up.insert(up.end(), row + s.k, row + 2 * s.k);
    }
    std::vector<float> want_checked(gate.size()), want(n, 0.0f);
    kernels::silu_mul(gate.data(), up.data(), want_checked.data(), gate.size());
    size_t i = 0;
    for (int32_t r : checked_rows(s.rows)) {
      std::copy(want_checked.begin() + i, want_checked.begin() + i + s.k, want.begin() + static_cast<size_t>(r) * s.k);
      i += s.k;
    }
    expect_matches_cpu(fused, from_bf16_bits(to_host<uint16_t>(*bf16_out, n)), want, s.rows, s.k, "silu_mul_fp8");
    if (s.rows >= 7) {
      EXPECT_EQ(fused.scales[0], 0.0f);
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
