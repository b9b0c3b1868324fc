#pragma once
// Quantize / dequantize one (token, head) K or V vector in the KV formats of
// runtime/kv_quant.h (fp8 e4m3 with a per-vector f32 scale; int8 asymmetric
// per vector; int4 asymmetric per group of 32), plus the plain f32 / f16 / bf16
// storage types. This is the CPU reference of the arithmetic the CUDA KV-write
// kernel performs: both must produce the same codes for the same input.
//
// data holds kv_head_bytes(head_dim, dtype) bytes, scales
// kv_head_scale_bytes(head_dim, dtype) bytes (nothing for unquantized dtypes;
// may be null then). Pure functions, thread-safe.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/backend/cpu/kernels/paged_kv.h"

namespace pagoda::kernels {

// Stores x[0, head_dim) as dtype into data (+ its scale records into scales).
void quantize_kv_vector(const float* x, int32_t head_dim, DType dtype, void* data, void* scales);

// fp8 e4m3 with a given per-tensor scale (> 0): codes fp8_satfinite(x * (1 / scale)),
// and the vector's scale record set to `scale`.
void quantize_kv_vector_fp8_fixed_scale(const float* x, int32_t head_dim, float scale, void* data, void* scales);

// Reads a stored vector back into out[0, head_dim) as f32.
void dequantize_kv_vector(const void* data, const void* scales, int32_t head_dim, DType dtype,
                          float* out);

// The f32 values of every fp8 e4m3 code (NaN for 0x7f / 0xff, which the
// quantizer never writes): dequantization by table lookup.
const float* fp8e4m3_decode_table();

}  // namespace pagoda::kernels
