#pragma once
// Flash-style (tiled, online-softmax) causal attention over the paged KV pool:
// the fast path of paged_attention() (paged_attention.h) for everything but
// token-eviction scoring, which needs each query's whole distribution.
//
// One work unit is (sequence, block of up to 16 new tokens, KV head): its query
// rows (the block's tokens x the KV head's query heads under GQA) are kept as
// one tile, and the keys are walked in tiles of 64 positions. Each K/V tile is
// read from the pool (dequantized into f32 for f16 / bf16 / fp8 / int8 / int4,
// by the same routine the reference uses) once per unit and shared by all of
// the unit's rows: scores are a small GEMM (a query row against the tile's
// transposed keys), the softmax is online (running max and sum per row, the
// exponentials 8 lanes at a time by a polynomial within ~2e-7 of expf, the
// accumulator rescaled when the max grows), and P·V is accumulated row by row.
// Causal masking, sliding windows and per-head holes (eviction) are masks on
// the score tile; a fully masked tile of a row is skipped. A unit of one new
// token (decode) skips the tile copy: keys and values are read in place (f32,
// f16 and bf16 pools, decode_attention_tile.h, where the CPU has AVX2 + F16C
// and the head dim is a multiple of 32) or dequantized once per key, and the
// group's query rows are scored against them directly.
//
// Same shapes and semantics as paged_attention(); results equal it up to f32
// summation order. Units are spread over ThreadPool::global() by estimated
// cost (longest first), so causal prefill keeps every thread busy. Call from
// one thread at a time.

#include <span>

#include "pagoda/backend/cpu/kernels/paged_attention.h"

namespace pagoda::kernels {

// Must not be given sequences whose eviction.mass is set (scoring) nor a layer with
// share_norms (cross-layer sharing): paged_attention() sends those to the reference. Holes are fine.
void paged_attention_tiled(const float* q, const PagedKvLayer& layer,
                           std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                           float* out);

// "avx2+fma" or "generic": the implementation of the tile loops picked at run time.
const char* paged_attention_tiled_implementation();

}  // namespace pagoda::kernels
