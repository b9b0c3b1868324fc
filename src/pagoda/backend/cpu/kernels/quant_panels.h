#pragma once
// Four-row panels of block-quantized weights (int8 / int4, quant_dot.h) for the
// decode GEMV: the same numbers as the per-row layout (same blocks, same stored
// values, same f16 scales, same bytes per matrix), regrouped at load so that
// one 512-bit VNNI product covers four rows of one block and the per-block
// float work (scale, convert, multiply-add) is done once per four rows.
//
// A matrix in panel layout (WeightMatrix::quant_panels) holds its rows in groups
// of kQuantPanelRows = 4; group p occupies exactly the bytes that rows 4p..4p+3
// occupy in the per-row layout (4 * quantized_row_bytes), so sizes and row
// offsets of whole groups do not change. The last rows % 4 rows stay in the
// per-row layout. A panel of B blocks is B / 8 groups of 8 blocks (the last
// one B % 8 blocks), each its scales then its values, so that the kernel reads
// the panel front to back as one stream:
//
//   scales: per block, the four rows' f16 scales (8 bytes; 64 per group);
//   kInt8 values: per block, 128 bytes: rows 0..3's elements 0..15 (16 bytes
//          each, stored as q + 128), then rows 0..3's elements 16..31;
//   kInt4 values: per block, 64 bytes: row r's 16 bytes at 16 r, byte j
//          holding element j in its low nibble and element j + 16 in its high.
//
// So one 64-byte load is the unsigned bytes of four rows x 16 elements (int8),
// or after one mask and one shift + mask four rows x 32 elements (int4), each
// multiplied against the same 16 activation bytes broadcast to the four lanes.
//
// The dot products are exact in integers per block, as the per-row kernels'
// (dot_quantized): only the f32 summation order over blocks differs.
//
// Thread safety: pure functions; quant_panels_enabled() reads the environment
// once.

#include <cstddef>
#include <cstdint>

#include "pagoda/backend/cpu/kernels/quant_dot.h"
#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

inline constexpr size_t kQuantPanelRows = 4;

// True when decode should use panels: the CPU has AVX-512 VNNI (the only
// kernel that gains from the layout) and PAGODA_CPU_QUANT_PANELS is not "0"
// (the per-row layout, for A/B measurement).
bool quant_panels_enabled();

// Repacks the whole panels of `rows` per-row quantized rows at data in place
// (rows % 4 trailing rows are left as they are).
void pack_quant_panels(DType dtype, uint8_t* data, size_t rows, size_t cols);

// Rows [r0, r1) of a panel-layout matrix of `rows` rows (data: its first byte)
// as f32, row after row (the prefill tiles).
void dequantize_panel_rows(DType dtype, const uint8_t* data, size_t rows, size_t cols, size_t r0, size_t r1,
                           float* out);

// The activation as the panel kernel reads it: the quantized values (q, 32 per
// block) and per block its scale and scale * sum, each four times (one per row
// lane): scale4 and offset4 hold 4 * blocks floats.
struct PanelActivation {
  const int8_t* q;
  const float* scale4;
  const float* offset4;
};
// Fills scale4 / offset4 (4 * blocks each) from a quantized activation.
void prepare_panel_activation(const QuantizedActivation& x, size_t blocks, float* scale4, float* offset4);

// out[r] = sum_i w[r][i] x[i] for the four rows of one panel of `blocks` blocks.
void dot_quant_panel(DType dtype, const uint8_t* panel, const PanelActivation& x, size_t blocks, float* out);
// The same with plain loops, block after block per row: equal bit for bit to
// dot_quantized_reference on the rows the panel was packed from.
void dot_quant_panel_reference(DType dtype, const uint8_t* panel, const QuantizedActivation& x, size_t blocks,
                               float* out);

}  // namespace pagoda::kernels
