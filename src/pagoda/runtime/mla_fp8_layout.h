#pragma once
// FlashMLA's fp8 layout of one cached MLA vector (DeepSeek's kv_lora_rank 512 +
// qk_rope_head_dim 64): 656 bytes per token and layer, self-contained (no
// separate scale records), 16-byte aligned pieces:
//
//   bytes [0, 512)    the 512 latent values as fp8 e4m3 codes
//   bytes [512, 528)  4 f32 scales, scale g for latent values [128 g, 128 g + 128)
//   bytes [528, 656)  the 64 rope values in bf16 (round to nearest even)
//
// Quantization of a group (the arithmetic of runtime/kv_quant.h's fp8, per
// group of 128 instead of per vector): amax = max |x|; scale = amax > 0 ?
// amax / 448 : 1; code = fp8_e4m3_satfinite(x * (1 / scale)); read back as
// fp8(code) * scale. The rope key stays bf16 because its 64 values carry the
// position and are a small part of the bytes (128 of 656).
//
// Header-only, host code: the reference the CUDA decode kernel
// (backend/cuda/attention/mla_decode.cu, which does the same arithmetic on the
// device) is checked against.
//
// Thread safety: pure functions.

#include <cstdint>
#include <cstring>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

inline constexpr int32_t kMlaFp8LatentValues = 512;
inline constexpr int32_t kMlaFp8RopeValues = 64;
inline constexpr int32_t kMlaFp8GroupSize = 128;
inline constexpr int32_t kMlaFp8Groups = kMlaFp8LatentValues / kMlaFp8GroupSize;  // 4
inline constexpr int32_t kMlaFp8ScalesAt = kMlaFp8LatentValues;                    // 512
inline constexpr int32_t kMlaFp8RopeAt = kMlaFp8ScalesAt + 4 * kMlaFp8Groups;      // 528
inline constexpr int32_t kMlaFp8VectorBytes = kMlaFp8RopeAt + 2 * kMlaFp8RopeValues;  // 656
static_assert(kMlaFp8VectorBytes == 656 && kMlaFp8VectorBytes % 16 == 0, "FlashMLA's 656-byte record");

// Writes the 656-byte record of v[0, 576) (the latent, then the rope key).
inline void mla_fp8_quantize(const float* v, uint8_t* out) {
  for (int32_t g = 0; g < kMlaFp8Groups; ++g) {
    const float* x = v + g * kMlaFp8GroupSize;
    float amax = 0.0f;
    for (int32_t i = 0; i < kMlaFp8GroupSize; ++i) {
      const float a = x[i] < 0.0f ? -x[i] : x[i];
      if (a > amax) amax = a;
    }
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const float inverse = 1.0f / scale;
    for (int32_t i = 0; i < kMlaFp8GroupSize; ++i) out[g * kMlaFp8GroupSize + i] = f32_to_fp8e4m3(x[i] * inverse);
    std::memcpy(out + kMlaFp8ScalesAt + 4 * g, &scale, 4);
  }
  for (int32_t i = 0; i < kMlaFp8RopeValues; ++i) {
    const uint16_t b = f32_to_bf16(v[kMlaFp8LatentValues + i]);
    std::memcpy(out + kMlaFp8RopeAt + 2 * i, &b, 2);
  }
}

// The scale of group g of a record.
inline float mla_fp8_scale(const uint8_t* record, int32_t g) {
  float s;
  std::memcpy(&s, record + kMlaFp8ScalesAt + 4 * g, 4);
  return s;
}

// Value i in [0, 576) of a record, as it is read: fp8(code) * scale, or the bf16 rope value.
inline float mla_fp8_value(const uint8_t* record, int32_t i) {
  if (i < kMlaFp8LatentValues) return fp8e4m3_to_f32(record[i]) * mla_fp8_scale(record, i / kMlaFp8GroupSize);
  uint16_t b;
  std::memcpy(&b, record + kMlaFp8RopeAt + 2 * (i - kMlaFp8LatentValues), 2);
  return bf16_to_f32(b);
}

}  // namespace pagoda::kernels
