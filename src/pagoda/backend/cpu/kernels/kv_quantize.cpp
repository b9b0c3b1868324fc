#include "pagoda/backend/cpu/kernels/kv_quantize.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>

#include "pagoda/backend/cpu/kernels/vector_dot.h"

namespace pagoda::kernels {

namespace {

// The scale and zero of one group, as stored (rounded to f16) and as used.
struct IntGroupParams {
  KvScaleZero record;
  float scale;
  float zero;
  float inverse_scale;
};

// kv_quant.h's integer arithmetic: zero = f16(min), scale = f16((max - zero) / levels),
// 1 when that rounds to 0; quantization uses the rounded values.
IntGroupParams int_group_params(const float* x, int32_t n, int32_t levels) {
  float lo = x[0], hi = x[0];
  for (int32_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  IntGroupParams p;
  p.record.zero_f16 = f32_to_f16(lo);
  p.zero = f16_to_f32(p.record.zero_f16);
  p.record.scale_f16 = f32_to_f16((hi - p.zero) / static_cast<float>(levels));
  if ((p.record.scale_f16 & 0x7fffu) == 0) p.record.scale_f16 = f32_to_f16(1.0f);
  p.scale = f16_to_f32(p.record.scale_f16);
  p.inverse_scale = 1.0f / p.scale;
  return p;
}

inline uint8_t int_code(float x, const IntGroupParams& p, int32_t levels) {
  const float q = std::nearbyint((x - p.zero) * p.inverse_scale);  // ties to even (default mode)
  return static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(levels)));
}

void quantize_fp8_with_scale(const float* x, int32_t n, float scale, uint8_t* codes, void* scales) {
  const float inverse = 1.0f / scale;
  for (int32_t i = 0; i < n; ++i) codes[i] = f32_to_fp8e4m3(x[i] * inverse);  // saturates at +-448
  std::memcpy(scales, &scale, sizeof scale);
}

void quantize_fp8(const float* x, int32_t n, uint8_t* codes, void* scales) {
  float amax = 0.0f;
  for (int32_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  quantize_fp8_with_scale(x, n, amax > 0.0f ? amax / kKvFp8Max : 1.0f, codes, scales);
}

void quantize_int8(const float* x, int32_t n, uint8_t* codes, void* scales) {
  const IntGroupParams p = int_group_params(x, n, 255);
  for (int32_t i = 0; i < n; ++i) codes[i] = int_code(x[i], p, 255);
  std::memcpy(scales, &p.record, sizeof p.record);
}

void quantize_int4(const float* x, int32_t n, uint8_t* packed, void* scales) {
  auto* records = static_cast<std::byte*>(scales);
  std::memset(packed, 0, static_cast<size_t>(n + 1) / 2);
  for (int32_t begin = 0, g = 0; begin < n; begin += kKvInt4GroupSize, ++g) {
    const int32_t end = std::min(n, begin + kKvInt4GroupSize);
    const IntGroupParams p = int_group_params(x + begin, end - begin, 15);
    for (int32_t i = begin; i < end; ++i)
      packed[i / 2] |= static_cast<uint8_t>(int_code(x[i], p, 15) << ((i & 1) * 4));
    std::memcpy(records + g * sizeof(KvScaleZero), &p.record, sizeof p.record);
  }
}

KvScaleZero load_record(const void* scales, int32_t group) {
  KvScaleZero r;
  std::memcpy(&r, static_cast<const std::byte*>(scales) + group * sizeof(KvScaleZero), sizeof r);
  return r;
}

}  // namespace

const float* fp8e4m3_decode_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = fp8e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

void quantize_kv_vector(const float* x, int32_t head_dim, DType dtype, void* data, void* scales) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(data, x, static_cast<size_t>(head_dim) * sizeof(float));
      return;
    case DType::kBF16: {
      auto* out = static_cast<uint16_t*>(data);
      for (int32_t i = 0; i < head_dim; ++i) out[i] = f32_to_bf16(x[i]);
      return;
    }
    case DType::kF16: {
      auto* out = static_cast<uint16_t*>(data);
      for (int32_t i = 0; i < head_dim; ++i) out[i] = f32_to_f16(x[i]);
      return;
    }
    case DType::kFP8E4M3: quantize_fp8(x, head_dim, static_cast<uint8_t*>(data), scales); return;
    case DType::kInt8: quantize_int8(x, head_dim, static_cast<uint8_t*>(data), scales); return;
    case DType::kInt4: quantize_int4(x, head_dim, static_cast<uint8_t*>(data), scales); return;
  }
  assert(false && "unknown KV dtype");
}

void quantize_kv_vector_fp8_fixed_scale(const float* x, int32_t head_dim, float scale, void* data, void* scales) {
  assert(scale > 0.0f);
  quantize_fp8_with_scale(x, head_dim, scale, static_cast<uint8_t*>(data), scales);
}

void dequantize_kv_vector(const void* data, const void* scales, int32_t head_dim, DType dtype,
                          float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, data, static_cast<size_t>(head_dim) * sizeof(float));
      return;
    case DType::kBF16:
    case DType::kF16:
      // Exact widening, 16 or 8 at a time (vector_dot.h): attention reads every cached vector this way.
      widen_to_f32(data, dtype, out, static_cast<size_t>(head_dim));
      return;
    case DType::kFP8E4M3: {
      const float* table = fp8e4m3_decode_table();
      const auto* codes = static_cast<const uint8_t*>(data);
      float scale;
      std::memcpy(&scale, scales, sizeof scale);
      for (int32_t i = 0; i < head_dim; ++i) out[i] = table[codes[i]] * scale;
      return;
    }
    case DType::kInt8: {
      const auto* codes = static_cast<const uint8_t*>(data);
      const KvScaleZero r = load_record(scales, 0);
      const float scale = f16_to_f32(r.scale_f16), zero = f16_to_f32(r.zero_f16);
      for (int32_t i = 0; i < head_dim; ++i) out[i] = static_cast<float>(codes[i]) * scale + zero;
      return;
    }
    case DType::kInt4: {
      const auto* packed = static_cast<const uint8_t*>(data);
      for (int32_t begin = 0, g = 0; begin < head_dim; begin += kKvInt4GroupSize, ++g) {
        const int32_t end = std::min(head_dim, begin + kKvInt4GroupSize);
        const KvScaleZero r = load_record(scales, g);
        const float scale = f16_to_f32(r.scale_f16), zero = f16_to_f32(r.zero_f16);
        // Groups start at even elements: whole bytes, low nibble first.
        const uint8_t* bytes = packed + begin / 2;
        const int32_t pairs = (end - begin) / 2;
        float* o = out + begin;
        for (int32_t j = 0; j < pairs; ++j) {
          o[2 * j] = static_cast<float>(bytes[j] & 0xf) * scale + zero;
          o[2 * j + 1] = static_cast<float>(bytes[j] >> 4) * scale + zero;
        }
        if ((end - begin) & 1) o[2 * pairs] = static_cast<float>(bytes[pairs] & 0xf) * scale + zero;
      }
      return;
    }
  }
  assert(false && "unknown KV dtype");
}

}  // namespace pagoda::kernels
