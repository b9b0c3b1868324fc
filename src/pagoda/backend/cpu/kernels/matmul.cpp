#include "pagoda/backend/cpu/kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <mutex>
#include <vector>

#include "pagoda/core/thread_pool.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"
#include "pagoda/backend/cpu/kernels/quant_dot.h"
#include "pagoda/backend/cpu/kernels/quant_panels.h"
#include "pagoda/backend/cpu/kernels/vector_dot.h"
#include "pagoda/model/fp8_matrix.h"

namespace pagoda::kernels {

namespace {

void pin_openblas_to_one_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// y[:, n0:n1] = x · W[n0:n1, :]^T for f32 rows w_rows (already offset to n0).
void sgemm_rows(const float* x, size_t m, const float* w_rows, size_t n_rows, size_t k,
                float* y, size_t ldy) {
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n_rows), static_cast<int>(k), 1.0f,
                w_rows, static_cast<int>(k), x, 1, 0.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
              static_cast<int>(n_rows), static_cast<int>(k), 1.0f, x, static_cast<int>(k), w_rows,
              static_cast<int>(k), 0.0f, y, static_cast<int>(ldy));
}

// Up to this many input rows, per-row dot products (vector_dot.h) beat sgemm:
// each weight row is read once for all inputs and f16/bf16 need no tile copy.
constexpr size_t kMaxRowsForDotPath = 4;

// Waking the pool costs microseconds; below ~256K multiply-adds per task (a
// decode-step projection of a small model) one thread finishes sooner.
size_t rows_per_task(size_t m, size_t k) {
  constexpr size_t kMinMacsPerTask = size_t{1} << 18;
  return std::max<size_t>(16, kMinMacsPerTask / std::max<size_t>(1, m * k));
}

// Decode GEMVs split their rows into this many chunks per thread, claimed as threads get to them, so a
// thread that starts late (waking, preempted) leaves its share to the others. Prefill GEMMs keep one
// slice per thread: sgemm repacks the activations on every call.
constexpr size_t kDecodeChunksPerThread = 4;

// Bytes of f32 per converted tile of f16/bf16/quantized rows for sgemm. Each
// sgemm call repacks the whole activation matrix, so the tile is large (at
// k = 2048, 512 rows): with 256 KB tiles, prefill spent more time repacking
// activations than multiplying (docs/BENCHMARKS.md, CPU prefill).
constexpr size_t kTileBytes = size_t{4} << 20;

// Rows [r0, r1) of w (f16, bf16, int8 or int4) into f32.
void rows_to_f32(const WeightMatrix& w, size_t r0, size_t r1, float* out) {
  if (w.dtype == DType::kFP8E4M3) return dequantize_fp8_rows(w, r0, r1, out);
  if (is_quantized_weight(w.dtype) && w.quant_panels)
    return dequantize_panel_rows(w.dtype, static_cast<const uint8_t*>(w.data), w.rows, w.cols, r0, r1, out);
  if (is_quantized_weight(w.dtype)) {
    const size_t row_bytes = quantized_row_bytes(w.dtype, w.cols);
    dequantize_weight_rows(w.dtype, static_cast<const uint8_t*>(w.data) + r0 * row_bytes, r1 - r0, w.cols, out);
    return;
  }
  const size_t elem_bytes = static_cast<size_t>(dtype_bits(w.dtype) / 8);
  widen_to_f32(static_cast<const char*>(w.data) + r0 * w.cols * elem_bytes, w.dtype, out, (r1 - r0) * w.cols);
}

// Decode on quantized weights: the m input rows are quantized per block once,
// then every weight row is read once for all of them by integer dot products
// (four rows at a time where the matrix is in panel layout).
void linear_quantized_dot(const float* x, size_t m, const WeightMatrix& w, const float* bias, float* y) {
  const size_t n = w.rows, k = w.cols, blocks = quant_blocks(k);
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xscale, scale4, offset4;
  thread_local std::vector<int32_t> xsum;
  xq.resize(m * blocks * kQuantBlock);
  xscale.resize(m * blocks);
  xsum.resize(m * blocks);
  for (size_t r = 0; r < m; ++r)
    quantize_activation(x + r * k, k, xq.data() + r * blocks * kQuantBlock, xscale.data() + r * blocks,
                        xsum.data() + r * blocks);
  const int8_t* q = xq.data();
  const float* scale = xscale.data();
  const int32_t* sum = xsum.data();
  const size_t row_bytes = quantized_row_bytes(w.dtype, k);
  const uint8_t* data = static_cast<const uint8_t*>(w.data);
  auto row_dot = [&](size_t j) {
    const uint8_t* row = data + j * row_bytes;
    for (size_t r = 0; r < m; ++r) {
      const QuantizedActivation a{q + r * blocks * kQuantBlock, scale + r * blocks, sum + r * blocks};
      y[r * n + j] = dot_quantized(w.dtype, row, a, blocks) + (bias != nullptr ? bias[j] : 0.0f);
    }
  };
  if (!w.quant_panels) {
    ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
      for (size_t j = begin; j < end; ++j) row_dot(j);
    }, rows_per_task(m, k), kDecodeChunksPerThread);
    return;
  }
  scale4.resize(m * blocks * kQuantPanelRows);
  offset4.resize(m * blocks * kQuantPanelRows);
  for (size_t r = 0; r < m; ++r)
    prepare_panel_activation(QuantizedActivation{q + r * blocks * kQuantBlock, scale + r * blocks, sum + r * blocks},
                             blocks, scale4.data() + r * blocks * kQuantPanelRows,
                             offset4.data() + r * blocks * kQuantPanelRows);
  const float* s4 = scale4.data();  // thread_local: the workers must see the caller's buffers
  const float* o4 = offset4.data();
  // Work units: the whole panels, then the trailing rows (per-row layout) one each.
  const size_t panels = n / kQuantPanelRows, units = panels + n % kQuantPanelRows;
  const size_t grain = std::max<size_t>(1, rows_per_task(m, k) / kQuantPanelRows);
  ThreadPool::global().parallel_for(units, [&](size_t begin, size_t end) {
    for (size_t u = begin; u < end; ++u) {
      if (u >= panels) {
        row_dot(panels * kQuantPanelRows + (u - panels));
        continue;
      }
      const uint8_t* panel = data + u * kQuantPanelRows * row_bytes;
      for (size_t r = 0; r < m; ++r) {
        const size_t a = r * blocks;
        float out[kQuantPanelRows];
        dot_quant_panel(w.dtype, panel,
                        PanelActivation{q + a * kQuantBlock, s4 + a * kQuantPanelRows, o4 + a * kQuantPanelRows},
                        blocks, out);
        for (size_t i = 0; i < kQuantPanelRows; ++i) {
          const size_t j = u * kQuantPanelRows + i;
          y[r * n + j] = out[i] + (bias != nullptr ? bias[j] : 0.0f);
        }
      }
    }
  }, grain, kDecodeChunksPerThread);
}

// sum_{c in [c0, c1)} table[row[c]] * x[c] with 8 independent sums (a single running sum is one add per
// element on the critical path).
float dot_fp8_span(const float* table, const uint8_t* row, const float* x, size_t c0, size_t c1) {
  float acc[8] = {};
  size_t c = c0;
  for (; c + 8 <= c1; c += 8)
    for (size_t i = 0; i < 8; ++i) acc[i] += table[row[c + i]] * x[c + i];
  for (; c < c1; ++c) acc[0] += table[row[c]] * x[c];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// One fp8 weight row (row j of w) against x: one scale per row, or per block of columns applied to the
// block's sum.
float dot_fp8_row(const float* x, const WeightMatrix& w, size_t j) {
  const float* table = fp8e4m3_table();
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * w.cols;
  const Fp8MatrixScales& s = w.fp8;
  if (s.layout != Fp8WeightScale::kBlock)
    return dot_fp8_span(table, row, x, 0, w.cols) * (s.layout == Fp8WeightScale::kTensor ? s.scales[0] : s.scales[j]);
  const size_t bc = static_cast<size_t>(s.block_cols);
  const float* scales = s.scales + (j / static_cast<size_t>(s.block_rows)) * ((w.cols + bc - 1) / bc);
  float total = 0.0f;
  for (size_t c0 = 0, b = 0; c0 < w.cols; c0 += bc, ++b)
    total += dot_fp8_span(table, row, x, c0, std::min(w.cols, c0 + bc)) * scales[b];
  return total;
}

}  // namespace

void linear(const float* x_in, size_t m, const WeightMatrix& w, const float* bias, float* y) {
  assert(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16 ||
         w.dtype == DType::kFP8E4M3 || is_quantized_weight(w.dtype));
  pin_openblas_to_one_thread();
  const size_t n = w.rows, k = w.cols;
  if (m == 0 || n == 0) return;
  const float* x = x_in;
  if (w.fp8.activation != Fp8Activation::kNone) {
    // The fp8 layer's input as its GEMM sees it: rounded through fp8 with the scheme's scales.
    thread_local std::vector<float> x_fp8;
    x_fp8.assign(x_in, x_in + m * k);
    fake_quantize_fp8_activations(x_fp8.data(), m, k, w.fp8);
    x = x_fp8.data();
  }
  if (is_quantized_weight(w.dtype) && m <= kMaxRowsForDotPath) return linear_quantized_dot(x, m, w, bias, y);
  const bool dot_path = m <= kMaxRowsForDotPath;
  if (!dot_path && (w.dtype == DType::kBF16 || w.dtype == DType::kF16) && bf16_gemm_enabled())
    return gemm_bf16(x, m, w.data, w.dtype, n, k, bias, y);
  const size_t elem_bytes = static_cast<size_t>(dtype_bits(w.dtype) / 8);
  // Rows per converted tile (at least 8).
  const size_t tile_rows = std::max<size_t>(8, (kTileBytes / sizeof(float)) / std::max<size_t>(1, k));

  ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
    if (dot_path) {
      // Decode: one pass over the weight rows in their own dtype, no conversion buffer.
      for (size_t j = begin; j < end; ++j) {
        const void* row = static_cast<const char*>(w.data) + j * k * elem_bytes;
        for (size_t r = 0; r < m; ++r)
          y[r * n + j] = w.dtype == DType::kFP8E4M3 ? dot_fp8_row(x + r * k, w, j) : dot_weights(x + r * k, row, w.dtype, k);
      }
    } else if (w.dtype == DType::kF32) {
      const float* rows = static_cast<const float*>(w.data) + begin * k;
      sgemm_rows(x, m, rows, end - begin, k, y + begin, n);
    } else {
      thread_local std::vector<float> tile;
      for (size_t r0 = begin; r0 < end; r0 += tile_rows) {
        const size_t r1 = std::min(end, r0 + tile_rows);
        tile.resize((r1 - r0) * k);
        rows_to_f32(w, r0, r1, tile.data());
        sgemm_rows(x, m, tile.data(), r1 - r0, k, y + r0, n);
      }
    }
    if (bias != nullptr) {
      for (size_t r = 0; r < m; ++r)
        for (size_t j = begin; j < end; ++j) y[r * n + j] += bias[j];
    }
  }, rows_per_task(m, k), dot_path ? kDecodeChunksPerThread : 1);
}

}  // namespace pagoda::kernels
