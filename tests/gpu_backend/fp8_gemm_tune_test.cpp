// Large-m autotuning of the fp8 GEMM (fp8_gemm.h, LtLargeRowTuner in
// cublaslt_plan.h): one tuning per (n, k, power-of-two row bucket), reused for
// every m of the bucket.
//
//   Fp8GemmLargeM.TunedMatchesHeuristicAndReference: the tuned GEMM (incl. a plan
//     that reuses its bucket's algorithm at another m) equals the first-heuristic
//     GEMM within the fp8 GEMM bound (f32 summation order + one bf16 rounding),
//     and sampled rows of both equal a CPU double-precision sum of the same fp8
//     operands; the tuner's counts say a bucket was tuned and a plan reused it.
//   Fp8GemmLargeMSpeed.Llama3_8BShapes: the micro-benchmark, first heuristic vs
//     tuned at the Llama-3-8B projection shapes, m = 1K / 4K / 8K / 16K and two
//     mixed-step-like m that reuse a bucket's tuning: median of per-call CUDA-event
//     times after warm-up, TFLOP/s (printed; no bound), and the tuning's cost.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/random_fill.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::to_host;
using testing::worst_error_ratio;

bool is_sm90() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor == 90;
}

// fp8 operands as the model makes them: random bf16 quantized per row (per-token activations, per-channel weights).
struct Operands {
  DeviceBuffer x, x_scales, w, w_scales;
};

Operands make_operands(int32_t max_m, int32_t n, int32_t k, uint64_t seed) {
  Operands o;
  auto bf16 = DeviceBuffer::allocate(static_cast<size_t>(std::max(max_m, n)) * k * 2);
  auto x = DeviceBuffer::allocate(static_cast<size_t>(max_m) * k);
  auto xs = DeviceBuffer::allocate(static_cast<size_t>(max_m) * 4);
  auto w = DeviceBuffer::allocate(static_cast<size_t>(n) * k);
  auto ws = DeviceBuffer::allocate(static_cast<size_t>(n) * 4);
  EXPECT_TRUE(bf16.ok() && x.ok() && xs.ok() && w.ok() && ws.ok());
  EXPECT_EQ(fill_random_bf16(bf16->data(), static_cast<int64_t>(max_m) * k, -2.0f, 2.0f, seed, nullptr), cudaSuccess);
  EXPECT_EQ(quantize_fp8_per_token(bf16->as<__nv_bfloat16>(), max_m, k, x->as<uint8_t>(), xs->as<float>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(fill_random_bf16(bf16->data(), static_cast<int64_t>(n) * k, -0.1f, 0.1f, seed + 1, nullptr), cudaSuccess);
  EXPECT_EQ(quantize_fp8_per_token(bf16->as<__nv_bfloat16>(), n, k, w->as<uint8_t>(), ws->as<float>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  o.x = std::move(x).value();
  o.x_scales = std::move(xs).value();
  o.w = std::move(w).value();
  o.w_scales = std::move(ws).value();
  return o;
}

TEST(Fp8GemmLargeM, TunedMatchesHeuristicAndReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto heuristic = Fp8Gemm::create();
  auto tuned = Fp8Gemm::create();
  ASSERT_TRUE(heuristic.ok() && tuned.ok());
  (*heuristic)->set_autotune(true, false);
  (*tuned)->set_autotune(true, true);
  // m = 3000 tunes the (2048, 4096] bucket, 4096 and 2100 reuse it; 1024 tunes its own; 520 just above the
  // small-m tuning. Shapes: qkv and down of the 8B model (k = 4096 and 14336).
  const int32_t ms[] = {3000, 4096, 2100, 1024, 520};
  constexpr int32_t kMaxM = 4096;
  struct Shape { int32_t n, k; };
  for (const Shape s : {Shape{6144, 4096}, Shape{4096, 14336}}) {
    Operands o = make_operands(kMaxM, s.n, s.k, 1234 + s.k);
    auto y0 = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.n * 2);
    auto y1 = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.n * 2);
    ASSERT_TRUE(y0.ok() && y1.ok());
    const std::vector<uint8_t> x_host = to_host<uint8_t>(o.x, static_cast<size_t>(kMaxM) * s.k);
    const std::vector<uint8_t> w_host = to_host<uint8_t>(o.w, static_cast<size_t>(s.n) * s.k);
    const std::vector<float> xs_host = to_host<float>(o.x_scales, kMaxM);
    const std::vector<float> ws_host = to_host<float>(o.w_scales, s.n);
    std::vector<float> w_f(w_host.size()), x_f(x_host.size());
    for (size_t i = 0; i < w_host.size(); ++i) w_f[i] = fp8e4m3_to_f32(w_host[i]);
    for (size_t i = 0; i < x_host.size(); ++i) x_f[i] = fp8e4m3_to_f32(x_host[i]);
    for (int32_t m : ms) {
      for (int round = 0; round < 2; ++round) {  // the second round runs the cached plans
        Status a = (*heuristic)->linear(o.x.as<uint8_t>(), o.x_scales.as<float>(), m, o.w.as<uint8_t>(),
                                        o.w_scales.as<float>(), s.n, s.k, y0->as<__nv_bfloat16>(), nullptr);
        Status b = (*tuned)->linear(o.x.as<uint8_t>(), o.x_scales.as<float>(), m, o.w.as<uint8_t>(),
                                    o.w_scales.as<float>(), s.n, s.k, y1->as<__nv_bfloat16>(), nullptr);
        ASSERT_TRUE(a.ok() && b.ok()) << a.to_string() << " " << b.to_string();
        const size_t count = static_cast<size_t>(m) * s.n;
        const std::vector<float> got0 = from_bf16_bits(to_host<uint16_t>(*y0, count));
        const std::vector<float> got1 = from_bf16_bits(to_host<uint16_t>(*y1, count));
        const double abs_tol = 1e-4 * std::sqrt(static_cast<double>(s.k));
        EXPECT_LE(worst_error_ratio(got1, got0, abs_tol, 1.0 / 128), 1.0)
            << "tuned vs heuristic, m=" << m << " n=" << s.n << " k=" << s.k << " round " << round;
        if (round == 1) continue;
        // Sampled rows (first, last, middle) against the CPU's double sum of the same fp8 operands.
        std::vector<float> want, row0, row1;
        for (int32_t r : {0, 1, m / 2, m - 2, m - 1}) {
          for (int32_t c = 0; c < s.n; ++c) {
            double sum = 0.0;
            const float* xr = x_f.data() + static_cast<size_t>(r) * s.k;
            const float* wr = w_f.data() + static_cast<size_t>(c) * s.k;
            for (int32_t i = 0; i < s.k; ++i) sum += static_cast<double>(xr[i]) * wr[i];
            want.push_back(static_cast<float>(sum * xs_host[r] * ws_host[c]));
            row0.push_back(got0[static_cast<size_t>(r) * s.n + c]);
            row1.push_back(got1[static_cast<size_t>(r) * s.n + c]);
          }
        }
        EXPECT_LE(worst_error_ratio(row0, want, abs_tol, 1.0 / 128), 1.0) << "heuristic vs CPU, m=" << m;
        EXPECT_LE(worst_error_ratio(row1, want, abs_tol, 1.0 / 128), 1.0) << "tuned vs CPU, m=" << m;
      }
    }
  }
  const auto& st = (*tuned)->large_m_tuning();
  std::printf("fp8-gemm-tune: %d buckets tuned (%d changed the algorithm), %d plans reused a bucket's, %d "
              "rejected, %.1f ms tuning\n", st.tuned, st.changed, st.reused, st.rejected, st.tune_ms);
  // Per shape: buckets 4096 (m 3000), 1024 (1024), 1024 (520 -> reuse) ... 520's bucket is 1024: reused.
  EXPECT_EQ(st.tuned, 2 * 2);
  EXPECT_EQ(st.reused + st.rejected, 2 * 3);
  EXPECT_EQ((*heuristic)->large_m_tuning().tuned, 0);
}

// Median of per-call CUDA-event times (us) after warm-up.
template <typename F>
double median_us(F&& call, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) call();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start, nullptr);
    call();
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms * 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

TEST(Fp8GemmLargeMSpeed, Llama3_8BShapes) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!is_sm90()) GTEST_SKIP() << "timed on sm_90 (outer-vector scales)";
  struct Shape { int32_t n, k; const char* name; };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o"}, {28672, 4096, "gate_up"}, {4096, 14336, "down"}};
  // Powers of two tune their buckets; 7,900 and 15,755 (mixed steps' token counts) then reuse them.
  const int32_t ms[] = {1024, 4096, 8192, 16384, 7900, 15755};
  constexpr int32_t kMaxM = 16384;
  double sum_heuristic = 0.0, sum_tuned = 0.0, sum_tflop = 0.0;
  for (const Shape& s : shapes) {
    auto heuristic = Fp8Gemm::create();
    auto tuned = Fp8Gemm::create();
    ASSERT_TRUE(heuristic.ok() && tuned.ok());
    (*heuristic)->set_autotune(true, false);
    (*tuned)->set_autotune(true, true);
    Operands o = make_operands(kMaxM, s.n, s.k, 77 + s.n);
    auto y = DeviceBuffer::allocate(static_cast<size_t>(kMaxM) * s.n * 2);
    ASSERT_TRUE(y.ok());
    for (int32_t m : ms) {
      Status status = ok_status();
      auto call = [&](Fp8Gemm& gemm) {
        return [&, m, g = &gemm] {
          Status st = g->linear(o.x.as<uint8_t>(), o.x_scales.as<float>(), m, o.w.as<uint8_t>(),
                               o.w_scales.as<float>(), s.n, s.k, y->as<__nv_bfloat16>(), nullptr);
          if (!st.ok()) status = st;
        };
      };
      const double tune_before = (*tuned)->large_m_tuning().tune_ms;
      const double us_h = median_us(call(**heuristic), 3, 21);
      const double us_t = median_us(call(**tuned), 3, 21);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const double tflop = 2.0 * m * s.n * s.k * 1e-12;
      if ((m & (m - 1)) == 0 && m >= 4096) {  // the engine's step sizes: summed per layer below
        sum_heuristic += us_h;
        sum_tuned += us_t;
        sum_tflop += tflop;
      }
      std::printf("fp8-gemm-large %-8s m=%5d n=%5d k=%5d: heuristic %8.1f us %6.0f TFLOP/s | tuned %8.1f us %6.0f "
                  "TFLOP/s (%.3fx) | tuning %.0f ms\n",
                  s.name, m, s.n, s.k, us_h, tflop / us_h * 1e6, us_t, tflop / us_t * 1e6, us_h / us_t,
                  (*tuned)->large_m_tuning().tune_ms - tune_before);
    }
    const auto& st = (*tuned)->large_m_tuning();
    std::printf("fp8-gemm-large %-8s tuner: %d buckets tuned (%d changed the algorithm), %d reused, %d rejected, "
                "%.0f ms tuning\n", s.name, st.tuned, st.changed, st.reused, st.rejected, st.tune_ms);
    EXPECT_GE(st.tuned, 4);
  }
  std::printf("fp8-gemm-large all four shapes at m = 4K/8K/16K: heuristic %.0f us %.0f TFLOP/s | tuned %.0f us %.0f "
              "TFLOP/s (%.3fx)\n", sum_heuristic, sum_tflop / sum_heuristic * 1e6, sum_tuned,
              sum_tflop / sum_tuned * 1e6, sum_heuristic / sum_tuned);
}

}  // namespace
}  // namespace pagoda::cuda
