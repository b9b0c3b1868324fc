#pragma once
// A host reference of runtime/kv_quant.h written straight from the header's
// formulas (independently of the CPU backend's quantizer), for the GPU tests:
// quantize one (token, head) vector to codes + 4-byte scale records, and read
// them back as floats. Tests compare the GPU's codes to these bit for bit and
// the GPU's attention to float64 attention over the dequantized values.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/runtime/kv_quant.h"

namespace pagoda::kernels::testing {

struct QuantizedVector {
  std::vector<uint8_t> codes;     // kv_head_data_bytes(head_dim, format)
  std::vector<uint32_t> records;  // kv_scale_groups(head_dim, format)
};

inline uint32_t int_record(uint16_t scale, uint16_t zero) { return uint32_t{scale} | (uint32_t{zero} << 16); }

// fp8_tensor_scale > 0: fp8 codes x / that scale, saturated at +-448 (a
// checkpoint's per-tensor scale, kv_write's fixed scale); the record holds it.
inline QuantizedVector quantize_reference(const float* x, int32_t head_dim, KvQuant format,
                                          float fp8_tensor_scale = 0.0f) {
  QuantizedVector out;
  out.codes.assign(static_cast<size_t>(kv_head_data_bytes(head_dim, format)), 0);
  out.records.assign(static_cast<size_t>(kv_scale_groups(head_dim, format)), 0);
  if (format == KvQuant::kFP8E4M3) {
    float amax = 0.0f;
    for (int32_t i = 0; i < head_dim; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = fp8_tensor_scale > 0.0f ? fp8_tensor_scale : amax > 0.0f ? amax / kKvFp8Max : 1.0f;
    const float inverse = 1.0f / scale;
    for (int32_t i = 0; i < head_dim; ++i)
      out.codes[i] = f32_to_fp8e4m3(std::clamp(x[i] * inverse, -kKvFp8Max, kKvFp8Max));
    std::memcpy(&out.records[0], &scale, 4);
    return out;
  }
  const int32_t levels = kv_quant_levels(format);
  const int32_t group_size = kv_scale_group_size(head_dim, format);
  for (int32_t begin = 0, g = 0; begin < head_dim; begin += group_size, ++g) {
    const int32_t end = std::min(head_dim, begin + group_size);
    const float lo = *std::min_element(x + begin, x + end);
    const float hi = *std::max_element(x + begin, x + end);
    const uint16_t zero_bits = f32_to_f16(lo);
    const float zero = f16_to_f32(zero_bits);
    uint16_t scale_bits = f32_to_f16((hi - zero) / static_cast<float>(levels));
    if ((scale_bits & 0x7fffu) == 0) scale_bits = f32_to_f16(1.0f);
    const float inverse = 1.0f / f16_to_f32(scale_bits);
    for (int32_t i = begin; i < end; ++i) {
      const float q = std::nearbyint((x[i] - zero) * inverse);
      const auto code = static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(levels)));
      if (format == KvQuant::kInt4) out.codes[i / 2] |= static_cast<uint8_t>(code << ((i & 1) * 4));
      else out.codes[i] = code;
    }
    out.records[g] = int_record(scale_bits, zero_bits);
  }
  return out;
}

// Element i of a stored vector as a float: code * scale + zero.
inline float dequantize_reference(const uint8_t* codes, const uint32_t* records, int32_t head_dim, KvQuant format,
                                  int32_t i) {
  const uint32_t record = records[i / kv_scale_group_size(head_dim, format)];
  if (format == KvQuant::kFP8E4M3) {
    float scale;
    std::memcpy(&scale, &record, 4);
    return fp8e4m3_to_f32(codes[i]) * scale;
  }
  const float scale = f16_to_f32(static_cast<uint16_t>(record & 0xffffu));
  const float zero = f16_to_f32(static_cast<uint16_t>(record >> 16));
  const int code = format == KvQuant::kInt4 ? (codes[i / 2] >> ((i & 1) * 4)) & 0xf : codes[i];
  return static_cast<float>(code) * scale + zero;
}

// A whole pool of vectors [num_vectors, head_dim] quantized vector by vector:
// codes and records laid out as the GPU pool (kv_quant.h), plus the values they
// stand for.
struct QuantizedPool {
  KvQuant format = KvQuant::kNone;
  std::vector<uint8_t> codes;
  std::vector<uint32_t> records;
  std::vector<float> values;  // dequantized, [num_vectors, head_dim]
};

// x: [num_blocks, block_size, num_kv_heads, head_dim]; records laid out as kv_scale_vector says.
inline QuantizedPool quantize_pool(const std::vector<float>& x, int32_t head_dim, KvQuant format, int32_t block_size,
                                   int32_t num_kv_heads, float fp8_tensor_scale = 0.0f) {
  QuantizedPool pool;
  pool.format = format;
  const size_t vectors = x.size() / static_cast<size_t>(head_dim);
  const size_t bytes = static_cast<size_t>(kv_head_data_bytes(head_dim, format));
  const size_t groups = static_cast<size_t>(kv_scale_groups(head_dim, format));
  pool.codes.resize(vectors * bytes);
  pool.records.resize(vectors * groups);
  pool.values.resize(x.size());
  for (size_t v = 0; v < vectors; ++v) {
    const QuantizedVector q = quantize_reference(&x[v * head_dim], head_dim, format, fp8_tensor_scale);
    std::copy(q.codes.begin(), q.codes.end(), pool.codes.begin() + v * bytes);
    const size_t record_at =
        static_cast<size_t>(kv_scale_vector(static_cast<int64_t>(v / size_t(num_kv_heads)),
                                            static_cast<int32_t>(v % size_t(num_kv_heads)), block_size, num_kv_heads)) *
        groups;
    std::copy(q.records.begin(), q.records.end(), pool.records.begin() + record_at);
    for (int32_t i = 0; i < head_dim; ++i)
      pool.values[v * head_dim + i] = dequantize_reference(&pool.codes[v * bytes], &pool.records[record_at],
                                                           head_dim, format, i);
  }
  return pool;
}

}  // namespace pagoda::kernels::testing
