#pragma once
// The ceiling a prefill step's linear layers could reach (pagoda_gpu_engine_bench
// --workload gemm): plain cuBLASLt GEMMs of one Llama layer's shapes (qkv, o,
// gate_up, down) at m tokens, bf16 and fp8 (outer-vector scales; the per-token
// activation quantization timed apart), on random data. Prints us per GEMM and
// TFLOP/s, and the whole stack's time per token (layers x the four GEMMs, plus the
// fp8 quantizations): what prefill would cost if nothing but the GEMMs ran.
//
// Thread safety: single-threaded (one stream); call with no other work on the GPU.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/fp8_ops.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/random_fill.h"

namespace pagoda::bench {

struct GemmShape {
  const char* name;
  int32_t n, k;
};

// Median of 5 timings of `reps` back-to-back launches, in microseconds per launch.
template <typename Launch>
double time_us(Launch&& launch, int reps = 20) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) launch();  // warm-up (and autotuning where it applies)
  std::vector<float> t;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1e3f / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Returns false (and says why) when a buffer or a plan cannot be made.
inline bool gemm_ceiling(const std::vector<int>& ms, int32_t hidden, int32_t intermediate, int32_t q_width,
                         int32_t kv_width, int32_t layers) {
  const std::array<GemmShape, 4> shapes = {{{"qkv", q_width + 2 * kv_width, hidden},
                                            {"o", hidden, q_width},
                                            {"gate_up", 2 * intermediate, hidden},
                                            {"down", hidden, intermediate}}};
  int32_t max_m = 0, max_n = 0, max_k = 0;
  for (int m : ms) max_m = std::max(max_m, m);
  for (const GemmShape& s : shapes) max_n = std::max(max_n, s.n), max_k = std::max(max_k, s.k);
  auto x = cuda::DeviceBuffer::allocate(size_t(max_m) * max_k * 2);
  auto w = cuda::DeviceBuffer::allocate(size_t(max_n) * max_k * 2);
  auto y = cuda::DeviceBuffer::allocate(size_t(max_m) * max_n * 2);
  auto xq = cuda::DeviceBuffer::allocate(size_t(max_m) * max_k);
  auto wq = cuda::DeviceBuffer::allocate(size_t(max_n) * max_k);
  auto xs = cuda::DeviceBuffer::allocate(size_t(max_m) * 4);
  auto ws = cuda::DeviceBuffer::allocate(size_t(max_n) * 4);
  if (!x.ok() || !w.ok() || !y.ok() || !xq.ok() || !wq.ok() || !xs.ok() || !ws.ok()) {
    std::printf("gemm ceiling: buffers do not fit\n");
    return false;
  }
  cuda::fill_random_bf16(x->data(), int64_t(max_m) * max_k, -1.0f, 1.0f, 11, nullptr);
  cuda::fill_random_bf16(w->data(), int64_t(max_n) * max_k, -0.05f, 0.05f, 12, nullptr);
  // fp8 operands: quantized from the bf16 ones (the weights per output channel, as rows).
  cuda::quantize_fp8_per_token(w->as<__nv_bfloat16>(), max_n, max_k, wq->as<uint8_t>(), ws->as<float>(), nullptr);
  cuda::quantize_fp8_per_token(x->as<__nv_bfloat16>(), max_m, max_k, xq->as<uint8_t>(), xs->as<float>(), nullptr);
  cudaDeviceSynchronize();
  auto bf16 = cuda::Gemm::create();
  auto fp8 = cuda::Fp8Gemm::create();
  if (!bf16.ok() || !fp8.ok()) {
    std::printf("gemm ceiling: %s\n", (!bf16.ok() ? bf16.status() : fp8.status()).to_string().c_str());
    return false;
  }
  for (int m : ms) {
    double stack_bf16 = 0, stack_fp8 = 0;
    std::printf("gemm ceiling, m = %d tokens (us per GEMM, TFLOP/s):", m);
    for (const GemmShape& s : shapes) {
      const double flop = 2.0 * m * double(s.n) * s.k;
      const double b = time_us([&] {
        (void)(*bf16)->linear(x->as<__nv_bfloat16>(), m, w->as<__nv_bfloat16>(), s.n, s.k, y->data(),
                              cuda::GemmOutput::kBF16, nullptr);
      });
      const double f = time_us([&] {
        (void)(*fp8)->linear(xq->as<uint8_t>(), xs->as<float>(), m, wq->as<uint8_t>(), ws->as<float>(), s.n, s.k,
                             y->as<__nv_bfloat16>(), nullptr);
      });
      const double q = time_us([&] {
        cuda::quantize_fp8_per_token(x->as<__nv_bfloat16>(), m, s.k, xq->as<uint8_t>(), xs->as<float>(), nullptr);
      });
      stack_bf16 += b;
      stack_fp8 += f + q;
      std::printf(" %s bf16 %.1f (%.0f), fp8 %.1f (%.0f) + quantize %.1f;", s.name, b, flop / b / 1e6, f,
                  flop / f / 1e6, q);
    }
    std::printf("\n  stack of %d layers: bf16 %.2f ms = %.1f us/token (%.0f tok/s); fp8 incl. quantize %.2f ms = "
                "%.1f us/token (%.0f tok/s)\n",
                layers, stack_bf16 * layers / 1e3, stack_bf16 * layers / m, m / (stack_bf16 * layers / 1e6),
                stack_fp8 * layers / 1e3, stack_fp8 * layers / m, m / (stack_fp8 * layers / 1e6));
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) std::printf("gemm ceiling: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace pagoda::bench
