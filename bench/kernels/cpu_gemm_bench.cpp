// GFLOP/s of the CPU prefill GEMM, kernels::linear(), for one weight dtype and
// shape per line (issue 27: which GEMM path f32/f16/bf16 prefill takes).
//
//   pagoda_cpu_gemm_bench DTYPE M K N [REPS]     DTYPE: f32 | f16 | bf16
//   env: PAGODA_THREADS (pool size), PAGODA_CPU_BF16_GEMM=0 (f16/bf16 through the
//        widen-to-f32 + OpenBLAS sgemm path instead of the AVX512-BF16 kernel)
//
// Prints the best and the median of REPS timed calls (after one warm-up call), the
// work per CPU-second of the process (less sensitive to other load than wall time),
// and the 1-minute load average before and after, as one line.

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pagoda/backend/cpu/kernels/bf16_gemm.h"
#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/weight_matrix.h"

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double load_average() {
  double l = 0.0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0.0;
    std::fclose(f);
  }
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pagoda;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s f32|f16|bf16 M K N [REPS]\n", argv[0]);
    return 2;
  }
  const std::string dt = argv[1];
  const size_t m = std::strtoull(argv[2], nullptr, 10), k = std::strtoull(argv[3], nullptr, 10),
               n = std::strtoull(argv[4], nullptr, 10);
  const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
  DType dtype = DType::kF32;
  if (dt == "f16") dtype = DType::kF16;
  else if (dt == "bf16") dtype = DType::kBF16;
  else if (dt != "f32") {
    std::fprintf(stderr, "DTYPE must be f32, f16 or bf16, got '%s'\n", dt.c_str());
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n);
  for (float& v : x) v = dist(rng);
  std::vector<float> wf;
  std::vector<uint16_t> wh;
  WeightMatrix w{dtype, nullptr, n, k};
  if (dtype == DType::kF32) {
    wf.resize(n * k);
    for (float& v : wf) v = 0.02f * dist(rng);
    w.data = wf.data();
  } else {
    wh.resize(n * k);
    for (uint16_t& v : wh) v = dtype == DType::kBF16 ? f32_to_bf16(0.02f * dist(rng)) : f32_to_f16(0.02f * dist(rng));
    w.data = wh.data();
  }
  const double l0 = load_average();
  kernels::linear(x.data(), m, w, nullptr, y.data());
  std::vector<double> secs;
  const double cpu0 = process_cpu_seconds();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::linear(x.data(), m, w, nullptr, y.data());
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double cpu_per_call = (process_cpu_seconds() - cpu0) / reps;
  std::sort(secs.begin(), secs.end());
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const bool native = dtype != DType::kF32 && kernels::bf16_gemm_enabled();
  std::printf("%s m=%zu k=%zu n=%zu threads=%zu path=%s best %.1f GFLOP/s median %.1f GFLOP/s, %.1f GFLOP per CPU-second (load %.2f -> %.2f)\n",
              dt.c_str(), m, k, n, ThreadPool::global().size(), native ? "avx512bf16" : "sgemm",
              flop / secs.front() * 1e-9, flop / secs[secs.size() / 2] * 1e-9, flop / cpu_per_call * 1e-9, l0, load_average());
  return 0;
}
