#pragma once
// The fp8 layout of one cached MLA vector (the normalized latent of
// kv_lora_rank values, then the rotated rope key of qk_rope_head_dim values):
// FlashMLA's record, self-contained (no separate scale records). For DeepSeek's
// 512 + 64 it is FlashMLA's 656 bytes per token and layer, 16-byte aligned pieces:
//
//   bytes [0, 512)    the 512 latent values as fp8 e4m3 codes
//   bytes [512, 528)  4 f32 scales, scale g for latent values [128 g, 128 g + 128)
//   bytes [528, 656)  the 64 rope values in bf16 (round to nearest even)
//
// Any other latent L and rope R (the tiny test models) use the same scheme:
// L codes, then ceil(L / 128) f32 scales from byte round_up(L, 4) (the last group
// may be shorter), then R bf16 values, the record padded to a multiple of 16
// bytes (zeros) so that every record of a pool starts 16-byte aligned.
// This is THE fp8 format of an MLA latent pool (KvPoolShape::latent with
// key_dtype fp8): the pool stores one record per token and no scale pool.
//
// Quantization of a group (the arithmetic of runtime/kv_quant.h's fp8, per
// group of 128 instead of per vector): amax = max |x|; scale = amax > 0 ?
// amax / 448 : 1; code = fp8_e4m3_satfinite(x * (1 / scale)); read back as
// fp8(code) * scale. The rope key stays bf16 because its values carry the
// position and are a small part of the bytes (128 of 656).
//
// Header-only. The offsets are host + device; quantize / read are the host
// reference the CUDA kernels (latent write, decode, simple attention, prefill
// gather) are checked against: they do the same f32 arithmetic.
//
// Thread safety: pure functions.

#include <cstdint>
#include <cstring>

#include "pagoda/core/dtype.h"
#include "pagoda/runtime/kv_quant.h"

namespace pagoda::kernels {

inline constexpr int32_t kMlaFp8LatentValues = 512;
inline constexpr int32_t kMlaFp8RopeValues = 64;
inline constexpr int32_t kMlaFp8GroupSize = 128;
inline constexpr int32_t kMlaFp8Groups = kMlaFp8LatentValues / kMlaFp8GroupSize;  // 4
inline constexpr int32_t kMlaFp8ScalesAt = kMlaFp8LatentValues;                    // 512
inline constexpr int32_t kMlaFp8RopeAt = kMlaFp8ScalesAt + 4 * kMlaFp8Groups;      // 528
inline constexpr int32_t kMlaFp8VectorBytes = kMlaFp8RopeAt + 2 * kMlaFp8RopeValues;  // 656
static_assert(kMlaFp8VectorBytes == 656 && kMlaFp8VectorBytes % 16 == 0, "FlashMLA's 656-byte record");

// Where the pieces of a record of `latent` + `rope` values are.
PAGODA_HOST_DEVICE int32_t mla_fp8_groups(int32_t latent) { return (latent + kMlaFp8GroupSize - 1) / kMlaFp8GroupSize; }
PAGODA_HOST_DEVICE int32_t mla_fp8_scales_at(int32_t latent) { return (latent + 3) / 4 * 4; }
PAGODA_HOST_DEVICE int32_t mla_fp8_rope_at(int32_t latent) {
  return mla_fp8_scales_at(latent) + 4 * mla_fp8_groups(latent);
}
PAGODA_HOST_DEVICE int32_t mla_fp8_record_bytes(int32_t latent, int32_t rope) {
  return (mla_fp8_rope_at(latent) + 2 * rope + 15) / 16 * 16;
}

// Writes the record of v[0, latent + rope) (the latent, then the rope key), padding zeroed.
inline void mla_fp8_quantize(const float* v, int32_t latent, int32_t rope, uint8_t* out) {
  const int32_t scales_at = mla_fp8_scales_at(latent), rope_at = mla_fp8_rope_at(latent);
  std::memset(out, 0, static_cast<size_t>(mla_fp8_record_bytes(latent, rope)));
  for (int32_t g = 0; g < mla_fp8_groups(latent); ++g) {
    const int32_t begin = g * kMlaFp8GroupSize;
    const int32_t end = begin + kMlaFp8GroupSize < latent ? begin + kMlaFp8GroupSize : latent;
    float amax = 0.0f;
    for (int32_t i = begin; i < end; ++i) {
      const float a = v[i] < 0.0f ? -v[i] : v[i];
      if (a > amax) amax = a;
    }
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const float inverse = 1.0f / scale;
    for (int32_t i = begin; i < end; ++i) out[i] = f32_to_fp8e4m3(v[i] * inverse);
    std::memcpy(out + scales_at + 4 * g, &scale, 4);
  }
  for (int32_t i = 0; i < rope; ++i) {
    const uint16_t b = f32_to_bf16(v[latent + i]);
    std::memcpy(out + rope_at + 2 * i, &b, 2);
  }
}

// Reads a record back: out[0, latent + rope) = fp8(code) * scale, then the bf16 rope values.
inline void mla_fp8_dequantize(const uint8_t* record, int32_t latent, int32_t rope, float* out) {
  const int32_t scales_at = mla_fp8_scales_at(latent), rope_at = mla_fp8_rope_at(latent);
  for (int32_t g = 0; g < mla_fp8_groups(latent); ++g) {
    float scale;
    std::memcpy(&scale, record + scales_at + 4 * g, 4);
    const int32_t begin = g * kMlaFp8GroupSize;
    const int32_t end = begin + kMlaFp8GroupSize < latent ? begin + kMlaFp8GroupSize : latent;
    for (int32_t i = begin; i < end; ++i) out[i] = fp8e4m3_to_f32(record[i]) * scale;
  }
  for (int32_t i = 0; i < rope; ++i) {
    uint16_t b;
    std::memcpy(&b, record + rope_at + 2 * i, 2);
    out[latent + i] = bf16_to_f32(b);
  }
}

// DeepSeek's 512 + 64: the 656-byte record of v[0, 576).
inline void mla_fp8_quantize(const float* v, uint8_t* out) {
  mla_fp8_quantize(v, kMlaFp8LatentValues, kMlaFp8RopeValues, out);
}

// The scale of group g of a 512 + 64 record.
inline float mla_fp8_scale(const uint8_t* record, int32_t g) {
  float s;
  std::memcpy(&s, record + kMlaFp8ScalesAt + 4 * g, 4);
  return s;
}

// Value i in [0, 576) of a 512 + 64 record, as it is read: fp8(code) * scale, or the bf16 rope value.
inline float mla_fp8_value(const uint8_t* record, int32_t i) {
  if (i < kMlaFp8LatentValues) return fp8e4m3_to_f32(record[i]) * mla_fp8_scale(record, i / kMlaFp8GroupSize);
  uint16_t b;
  std::memcpy(&b, record + kMlaFp8RopeAt + 2 * (i - kMlaFp8LatentValues), 2);
  return bf16_to_f32(b);
}

}  // namespace pagoda::kernels
