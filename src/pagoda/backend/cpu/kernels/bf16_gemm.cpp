#include "pagoda/backend/cpu/kernels/bf16_gemm.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

namespace {

#define PAGODA_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

// Activation rows per packed block: four zmm of 16 rows each.
constexpr size_t kBlockRows = 64;
// Weight rows per micro-kernel call (6 x 4 = 24 accumulators of the 32 zmm).
constexpr size_t kPanelRows = 6;
// Panels per weight tile: the tile is what stays in L2 while every activation block
// passes over it.
constexpr size_t kTilePanels = 8;
// Pairs of k per pass (2048 columns): 64 activation rows of it are 256 KB, so
// with the tile's chunk (96 KB) they stay in Zen 4's 1 MB L2 at any k.
constexpr size_t kChunkPairs = 1024;

bool cpu_has_avx512_bf16() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return false;
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax & (1u << 5)) != 0;  // CPUID.(7,1):EAX[5] = AVX512_BF16
}

// Row r (< kBlockRows) of x, converted to bf16 pairs, into column r of a packed
// block: block[p * kBlockRows + r] = (bf16(x[2p]) | bf16(x[2p + 1]) << 16). A
// missing last element (odd k) is zero.
PAGODA_BF16 void pack_row(const float* x, size_t k, size_t kp, uint16_t* scratch, uint32_t* block, size_t r) {
  size_t c = 0;
  for (; c + 16 <= k; c += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(scratch + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + c)));
  if (c < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - c)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + c));
    _mm256_mask_storeu_epi16(scratch + c, mask, (__m256i)v);
  }
  if (k % 2 != 0) scratch[k] = 0;
  uint32_t* out = block + r;
  for (size_t p = 0; p < kp; ++p) {
    uint32_t pair;
    std::memcpy(&pair, scratch + 2 * p, sizeof(pair));
    out[p * kBlockRows] = pair;
  }
}

// Rows [r0, r1) of f16 or bf16 w (row stride k) into bf16 rows of stride ldw
// (>= k, even; the columns past k and the rows past r1 - r0 up to pad_rows are zero).
PAGODA_BF16 void weights_to_bf16(const void* w, DType dtype, size_t k, size_t r0, size_t r1, size_t pad_rows,
                                 size_t ldw, uint16_t* out) {
  const uint16_t* src = static_cast<const uint16_t*>(w) + r0 * k;
  for (size_t r = 0; r < pad_rows; ++r) {
    uint16_t* dst = out + r * ldw;
    if (r0 + r >= r1) {
      std::memset(dst, 0, ldw * sizeof(uint16_t));
      continue;
    }
    const uint16_t* row = src + r * k;
    if (dtype == DType::kBF16) {
      std::memcpy(dst, row, k * sizeof(uint16_t));
    } else {
      size_t c = 0;
      for (; c + 16 <= k; c += 16) {
        const __m512 f = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), (__m256i)_mm512_cvtneps_pbh(f));
      }
      for (; c < k; ++c) dst[c] = f32_to_bf16(f16_to_f32(row[c]));
    }
    for (size_t c = k; c < ldw; ++c) dst[c] = 0;
  }
}

// out[j][16 * i + l] = sum_p x_pair(p, row 16 i + l) . w_pair(row j, p) for the
// kPanelRows weight rows at w (stride ldw) and the first 16 * MB rows of a packed
// activation block.
template <int MB>
PAGODA_BF16 void micro_kernel(const uint32_t* xp, const uint16_t* w, size_t ldw, size_t kp, float* out) {
  // The loops over j and i are unrolled so that the 24 accumulators live in registers.
  __m512 acc[kPanelRows][MB];
#pragma GCC unroll 8
  for (size_t j = 0; j < kPanelRows; ++j)
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) acc[j][i] = _mm512_setzero_ps();
  const uint32_t* w32[kPanelRows];
#pragma GCC unroll 8
  for (size_t j = 0; j < kPanelRows; ++j) w32[j] = reinterpret_cast<const uint32_t*>(w + j * ldw);
  for (size_t p = 0; p < kp; ++p) {
    __m512i xv[MB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) xv[i] = _mm512_loadu_si512(xp + p * kBlockRows + 16 * i);
#pragma GCC unroll 8
    for (size_t j = 0; j < kPanelRows; ++j) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(w32[j][p]));
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], (__m512bh)xv[i], (__m512bh)b);
    }
  }
#pragma GCC unroll 8
  for (size_t j = 0; j < kPanelRows; ++j)
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + j * kBlockRows + 16 * i, acc[j][i]);
}

using MicroKernel = void (*)(const uint32_t*, const uint16_t*, size_t, size_t, float*);
constexpr MicroKernel kKernels[4] = {micro_kernel<1>, micro_kernel<2>, micro_kernel<3>, micro_kernel<4>};

}  // namespace

namespace {

std::atomic<bool>& bf16_gemm_switch() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("PAGODA_CPU_BF16_GEMM");
    bool unrecognized = false;
    const bool choice = bf16_gemm_starting_choice(bf16_gemm_supported(), env, &unrecognized);
    if (unrecognized)
      std::fprintf(stderr, "pagoda: PAGODA_CPU_BF16_GEMM=%s: expected 0 (exact) or 1 (bf16); using the exact path\n",
                   env);
    return choice;
  }();
  return on;
}

}  // namespace

bool bf16_gemm_supported() {
  static const bool supported = cpu_has_avx512_bf16();
  return supported;
}

bool bf16_gemm_starting_choice(bool cpu_supported, const char* env_value, bool* unrecognized) {
  if (unrecognized != nullptr) *unrecognized = false;
  if (env_value == nullptr || *env_value == '\0') return cpu_supported;
  if (std::strcmp(env_value, "1") == 0 || std::strcmp(env_value, "bf16") == 0) return cpu_supported;
  if (std::strcmp(env_value, "0") == 0 || std::strcmp(env_value, "exact") == 0) return false;
  if (unrecognized != nullptr) *unrecognized = true;
  return false;
}

// The switch is read first so that its start (and the report of an unrecognized value) happens on every CPU.
bool bf16_gemm_enabled() { return bf16_gemm_switch().load(std::memory_order_relaxed) && bf16_gemm_supported(); }

void set_bf16_gemm_enabled(bool on) { bf16_gemm_switch().store(on, std::memory_order_relaxed); }

void gemm_bf16(const float* x, size_t m, const void* w, DType w_dtype, size_t n, size_t k, const float* bias,
               float* y) {
  if (m == 0 || n == 0) return;
  const size_t kp = (k + 1) / 2;
  const size_t blocks = (m + kBlockRows - 1) / kBlockRows;
  ThreadPool& pool = ThreadPool::global();

  // The activations, once per call: bf16 pairs, a block of 64 rows per kp x 64 slab.
  thread_local std::vector<uint32_t> packed;
  packed.resize(blocks * kp * kBlockRows);
  uint32_t* xp = packed.data();
  if (m % kBlockRows != 0) {  // the last block's rows past m are zero (pack_row writes the others)
    uint32_t* last = xp + (blocks - 1) * kp * kBlockRows;
    for (size_t p = 0; p < kp; ++p)
      std::fill(last + p * kBlockRows + m % kBlockRows, last + (p + 1) * kBlockRows, 0u);
  }
  pool.parallel_for(m, [&](size_t begin, size_t end) {
    thread_local std::vector<uint16_t> scratch;
    scratch.resize(2 * kp);
    for (size_t r = begin; r < end; ++r)
      pack_row(x + r * k, k, kp, scratch.data(), xp + (r / kBlockRows) * kp * kBlockRows, r % kBlockRows);
  }, std::max<size_t>(1, (size_t{1} << 16) / std::max<size_t>(1, k)));

  const size_t panels = (n + kPanelRows - 1) / kPanelRows;
  const size_t chunks = (kp + kChunkPairs - 1) / kChunkPairs;
  const size_t chunk_pairs = (kp + chunks - 1) / chunks;  // equal chunks
  const size_t ldw_pad = 2 * kp;
  // Bf16 rows with an even k are read in place; f16 rows, an odd k and the last
  // partial panel go through a zero-padded bf16 copy of the tile.
  const bool in_place = w_dtype == DType::kBF16 && k % 2 == 0;
  const size_t macs_per_panel = m * k * kPanelRows;
  const size_t min_panels = std::max<size_t>(1, (size_t{1} << 20) / std::max<size_t>(1, macs_per_panel));
  pool.parallel_for(panels, [&](size_t p_begin, size_t p_end) {
    thread_local std::vector<uint16_t> tile_buf;
    alignas(64) float out[kPanelRows * kBlockRows];
    for (size_t t0 = p_begin; t0 < p_end; t0 += kTilePanels) {
      const size_t t1 = std::min(p_end, t0 + kTilePanels);
      const size_t r0 = t0 * kPanelRows, r1 = std::min(n, t1 * kPanelRows);
      const uint16_t* tile;
      size_t ldw;
      if (in_place && r1 - r0 == (t1 - t0) * kPanelRows) {
        tile = static_cast<const uint16_t*>(w) + r0 * k;
        ldw = k;
      } else {
        tile_buf.resize((t1 - t0) * kPanelRows * ldw_pad);
        weights_to_bf16(w, w_dtype, k, r0, r1, (t1 - t0) * kPanelRows, ldw_pad, tile_buf.data());
        tile = tile_buf.data();
        ldw = ldw_pad;
      }
      // k in chunks of at most kChunkPairs pairs: the tile's chunk and one block's chunk of
      // activations stay in L2 together; later chunks add into y.
      for (size_t c0 = 0; c0 < kp; c0 += chunk_pairs) {
        const size_t c1 = std::min(kp, c0 + chunk_pairs);
        for (size_t b = 0; b < blocks; ++b) {
          const size_t m0 = b * kBlockRows, rows = std::min(kBlockRows, m - m0);
          const MicroKernel kernel = kKernels[(rows + 15) / 16 - 1];
          const uint32_t* block = xp + b * kp * kBlockRows + c0 * kBlockRows;
          for (size_t t = t0; t < t1; ++t) {
            kernel(block, tile + (t - t0) * kPanelRows * ldw + 2 * c0, ldw, c1 - c0, out);
            const size_t n0 = t * kPanelRows, cols = std::min(kPanelRows, n - n0);
            // Row by row: each output row gets `cols` adjacent floats (one cache line or two).
            if (c0 == 0) {
              float add[kPanelRows] = {};
              if (bias != nullptr)
                for (size_t j = 0; j < cols; ++j) add[j] = bias[n0 + j];
              for (size_t r = 0; r < rows; ++r) {
                float* dst = y + (m0 + r) * n + n0;
                for (size_t j = 0; j < cols; ++j) dst[j] = out[j * kBlockRows + r] + add[j];
              }
            } else {
              for (size_t r = 0; r < rows; ++r) {
                float* dst = y + (m0 + r) * n + n0;
                for (size_t j = 0; j < cols; ++j) dst[j] += out[j * kBlockRows + r];
              }
            }
          }
        }
      }
    }
  }, min_panels);
}

}  // namespace pagoda::kernels
