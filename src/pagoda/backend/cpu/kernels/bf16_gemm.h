#pragma once
// Prefill GEMM on bf16 (and f16) weights with AVX512-BF16 (vdpbf16ps): y = x · W^T
// with the activations rounded to bf16 and f32 accumulation, the weights read in
// their checkpoint layout (no packed copy kept: a pair of adjacent bf16 weights of
// one row is broadcast against 16 activation rows).
//
// Numerics: the weights are used exactly (bf16) or rounded to bf16 (f16, a tile of
// rows at a time); each activation is rounded to bf16 once (relative error <= 2^-9),
// products are exact in f32 and summed in f32. So |y - y_ref| <= 2^-9 * sum_i
// |x_i * w_i| (+ f32 summation error) per output against the f32 product of the same
// weights (f16 weights add at most 2^-9 * sum_i |x_i * w_i| again).
//
// Layout: x [m, k] f32 row-major; w [n, k] row-major bf16 or f16; y [m, n] f32
// row-major; y must not alias x. Work is split over output rows on
// ThreadPool::global(); call gemm_bf16 from one thread at a time (thread_local
// buffers). The switch below is atomic and may be flipped from any thread; it takes
// effect on the next linear() call. Default: on where the CPU has AVX512-BF16;
// PAGODA_CPU_BF16_GEMM=0 switches back to the exact path (docs/CPU_QUANT.md).

#include <cstddef>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

// True when this CPU has AVX512F + AVX512BW + AVX512-BF16 (gemm_bf16 can run).
bool bf16_gemm_supported();
// The process's starting choice, from the CPU and the value of PAGODA_CPU_BF16_GEMM
// (nullptr when unset): on where the CPU can run it (the default: f16/bf16 prefill
// on this GEMM), off with "0" or "exact" (linear() then runs f16/bf16 prefill as the
// f32-exact reference: weights widened to f32, sgemm); "1" or "bf16" is the default
// said explicitly. Never on without AVX512-BF16. Any other value is unrecognized:
// *unrecognized is set (when given) and the exact path is chosen.
bool bf16_gemm_starting_choice(bool cpu_supported, const char* env_value, bool* unrecognized = nullptr);
// True when supported and switched on. Starts as bf16_gemm_starting_choice() with
// this CPU and the environment (an unrecognized value is reported once on stderr).
bool bf16_gemm_enabled();
// Switches the path on or off for the whole process (tests pin the exact path
// with it). On has no effect on a CPU without AVX512-BF16.
void set_bf16_gemm_enabled(bool on);

// Sets the switch for a scope and puts the previous value back at its end (tests
// that expect f32-exact results pin the exact path with ScopedBf16Gemm(false)).
// Process-wide like the switch: not for scopes on several threads at once.
class ScopedBf16Gemm {
 public:
  explicit ScopedBf16Gemm(bool on) : previous_(bf16_gemm_enabled()) { set_bf16_gemm_enabled(on); }
  ~ScopedBf16Gemm() { set_bf16_gemm_enabled(previous_); }
  ScopedBf16Gemm(const ScopedBf16Gemm&) = delete;
  ScopedBf16Gemm& operator=(const ScopedBf16Gemm&) = delete;

 private:
  bool previous_;
};

// y[m, n] = x[m, k] · w[n, k]^T (+ bias[n] when bias != nullptr), w_dtype kBF16 or
// kF16. Requires bf16_gemm_supported() (linear() calls it when enabled).
void gemm_bf16(const float* x, size_t m, const void* w, DType w_dtype, size_t n, size_t k,
               const float* bias, float* y);

}  // namespace pagoda::kernels
