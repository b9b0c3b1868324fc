#pragma once
// The two inner loops of a decode attention tile (one new token; its GQA
// group's G query rows against up to kDecodeTileKeys keys of one KV head),
// reading K and V in place from an f32, f16 or bf16 pool: no dequantize
// buffer, the 16-bit elements widened in registers (AVX2 + F16C, 8 lanes; a
// 16-lane AVX-512 version measured slower on the dev box's Zen 4 and was
// dropped). paged_attention_tiled.cpp's decode unit runs its online softmax
// between them.
//
//   decode_tile_scores: s[g * kDecodeTileKeys + j] = scale * q[g] . K[j] for the
//     keys with keys[j] != nullptr, -inf for the others (masked, holes).
//   decode_tile_accumulate: acc[g * head_dim + d] += sum_j p[g * kDecodeTileKeys + j] * V[j][d]
//     over the keys with values[j] != nullptr; V is read once per two rows of the group.
//
// They need AVX2, FMA and F16C and head_dim % 32 == 0: decode_tile_supported()
// says whether they run here for (dtypes, head_dim), else the caller keeps its
// own path. Results equal a sequential loop up to f32 summation order.
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

inline constexpr size_t kDecodeTileKeys = 64;

bool decode_tile_supported(DType key_dtype, DType value_dtype, size_t head_dim);

void decode_tile_scores(const float* const* q, size_t G, const void* const* keys, DType key_dtype, size_t head_dim,
                        float scale, float* s);

void decode_tile_accumulate(const float* p, size_t G, const void* const* values, DType value_dtype, size_t head_dim,
                            float* acc);

}  // namespace pagoda::kernels
