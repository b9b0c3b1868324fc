#include "pagoda/backend/cpu/kernels/vector_dot.h"

// GCC 12 warns that the AVX-512 intrinsics' internal _mm512_undefined_*() operands are (or "may be") used
// uninitialized once inlined here: a false positive of the header, not of this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <atomic>

#include "pagoda/backend/cpu/kernels/cpu_features.h"

namespace pagoda::kernels {

namespace {

// ---- generic ----
float dot_f32_generic(const float* a, const float* b, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
float dot_weights_generic(const float* x, const void* w, DType dtype, size_t n) {
  if (dtype == DType::kF32) return dot_f32_generic(x, static_cast<const float*>(w), n);
  const auto* h = static_cast<const uint16_t*>(w);
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += x[i] * (dtype == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]));
  return s;
}
void axpy_generic(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void widen_generic(const void* w, DType dtype, float* out, size_t n) { convert_to_f32(dtype, w, out, n); }

// ---- AVX2 + FMA + F16C ----
#define PAGODA_AVX2 __attribute__((target("avx2,fma,f16c")))

PAGODA_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

PAGODA_AVX2 inline __m256 load_bf16(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
PAGODA_AVX2 inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int kKind>  // 0 f32, 1 bf16, 2 f16
PAGODA_AVX2 float dot_avx2(const float* x, const void* w, size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  auto load = [w](size_t i) PAGODA_AVX2 {
    if constexpr (kKind == 0) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    else if constexpr (kKind == 1) return load_bf16(static_cast<const uint16_t*>(w) + i);
    else return load_f16(static_cast<const uint16_t*>(w) + i);
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load(i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load(i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load(i), acc0);
  float s = horizontal_sum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) {
    if constexpr (kKind == 0) s += x[i] * static_cast<const float*>(w)[i];
    else if constexpr (kKind == 1) s += x[i] * bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    else s += x[i] * f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
  return s;
}

PAGODA_AVX2 float dot_f32_avx2(const float* a, const float* b, size_t n) { return dot_avx2<0>(a, b, n); }
PAGODA_AVX2 float dot_weights_avx2(const float* x, const void* w, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kBF16: return dot_avx2<1>(x, w, n);
    case DType::kF16: return dot_avx2<2>(x, w, n);
    default: return dot_avx2<0>(x, w, n);
  }
}
PAGODA_AVX2 void axpy_avx2(float alpha, const float* x, float* y, size_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

PAGODA_AVX2 void widen_avx2(const void* w, DType dtype, float* out, size_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  size_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_bf16(h + i));
    for (; i < n; ++i) out[i] = bf16_to_f32(h[i]);
  } else if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_f16(h + i));
    for (; i < n; ++i) out[i] = f16_to_f32(h[i]);
  } else {
    convert_to_f32(dtype, w, out, n);
  }
}

// ---- AVX-512 (F, BW, VL) ----
// Decode GEMVs stream a weight row once per step; with two 8-lane accumulators the loop was bound by
// the FMA latency (two chains), not by memory. Here four 16-lane accumulators (64 elements per
// iteration) keep four chains in flight, the 16-bit weights widen in registers, and the tail is one
// masked load, so no scalar loop.
#define PAGODA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

template <int kKind>  // 0 f32, 1 bf16, 2 f16
PAGODA_AVX512 inline __m512 load16_avx512(const void* w, size_t i) {
  if constexpr (kKind == 0) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (kKind == 1) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    else return _mm512_cvtph_ps(raw);
  }
}

// The first `count` (< 16) elements from i, zeros after.
template <int kKind>
PAGODA_AVX512 inline __m512 load16_masked_avx512(const void* w, size_t i, __mmask16 mask) {
  if constexpr (kKind == 0) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + i);
  } else {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + i);
    if constexpr (kKind == 1) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    else return _mm512_cvtph_ps(raw);
  }
}

template <int kKind>
PAGODA_AVX512 float dot_avx512(const float* x, const void* w, size_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
         acc3 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load16_avx512<kKind>(w, i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), load16_avx512<kKind>(w, i + 16), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), load16_avx512<kKind>(w, i + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), load16_avx512<kKind>(w, i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load16_avx512<kKind>(w, i), acc0);
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i), load16_masked_avx512<kKind>(w, i, mask), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

PAGODA_AVX512 float dot_f32_avx512(const float* a, const float* b, size_t n) { return dot_avx512<0>(a, b, n); }
PAGODA_AVX512 float dot_weights_avx512(const float* x, const void* w, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kBF16: return dot_avx512<1>(x, w, n);
    // f16 stays on the 8-lane kernel: on the dev box's Zen 4 the 16-lane vcvtph2ps made decode slower (one
    // thread, 1.5 GB of f16 rows per step: 102-118 ms against 89-95), where bf16 and f32 gained.
    case DType::kF16: return dot_avx2<2>(x, w, n);
    default: return dot_avx512<0>(x, w, n);
  }
}

PAGODA_AVX512 void widen_avx512(const void* w, DType dtype, float* out, size_t n) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return convert_to_f32(dtype, w, out, n);
  size_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, load16_avx512<1>(w, i));
  } else {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, load16_avx512<2>(w, i));
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = dtype == DType::kBF16 ? load16_masked_avx512<1>(w, i, mask) : load16_masked_avx512<2>(w, i, mask);
    _mm512_mask_storeu_ps(out + i, mask, v);
  }
}

bool cpu_has_avx512_f_bw_vl() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

struct Dispatch {
  float (*dot_f32)(const float*, const float*, size_t);
  float (*dot_weights)(const float*, const void*, DType, size_t);
  void (*axpy)(float, const float*, float*, size_t);
  void (*widen)(const void*, DType, float*, size_t);
  const char* name;
};

const Dispatch kGeneric{dot_f32_generic, dot_weights_generic, axpy_generic, widen_generic, "generic"};
const Dispatch kAvx2{dot_f32_avx2, dot_weights_avx2, axpy_avx2, widen_avx2, "avx2+fma+f16c"};
const Dispatch kAvx512{dot_f32_avx512, dot_weights_avx512, axpy_avx2, widen_avx512, "avx512"};

bool avx2_usable() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

std::atomic<const Dispatch*>& dispatch_slot() {
  static std::atomic<const Dispatch*> slot = [] {
    __builtin_cpu_init();
    if (avx2_usable() && cpu_has_avx512_f_bw_vl()) return &kAvx512;
    if (avx2_usable()) return &kAvx2;
    return &kGeneric;
  }();
  return slot;
}

const Dispatch& dispatch() { return *dispatch_slot().load(std::memory_order_relaxed); }

}  // namespace

float dot_f32(const float* a, const float* b, size_t n) { return dispatch().dot_f32(a, b, n); }
float dot_weights(const float* x, const void* w, DType w_dtype, size_t n) {
  return dispatch().dot_weights(x, w, w_dtype, n);
}
void axpy(float alpha, const float* x, float* y, size_t n) { dispatch().axpy(alpha, x, y, n); }
void widen_to_f32(const void* w, DType w_dtype, float* out, size_t n) { dispatch().widen(w, w_dtype, out, n); }
const char* vector_dot_implementation() { return dispatch().name; }

bool select_vector_dot_implementation(std::string_view name) {
  __builtin_cpu_init();
  const Dispatch* pick = nullptr;
  if (name == "generic") pick = &kGeneric;
  else if (name == "avx2+fma+f16c" && avx2_usable()) pick = &kAvx2;
  else if (name == "avx512" && avx2_usable() && cpu_has_avx512_f_bw_vl()) pick = &kAvx512;
  if (pick == nullptr) return false;
  dispatch_slot().store(pick, std::memory_order_relaxed);
  return true;
}

}  // namespace pagoda::kernels
