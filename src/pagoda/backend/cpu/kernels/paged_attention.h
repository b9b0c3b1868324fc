#pragma once
// Causal attention for a batch of sequences (prefill chunks and decodes mixed),
// reading every K and V through the block tables of the paged pool: there is no
// contiguous-KV path, so what is tested here is what the scheduler relies on.
//
// Shapes: q and out [num_tokens, num_q_heads, head_dim] f32 (rows ordered as in
// the batch). num_q_heads must be a multiple of layer.num_kv_heads (MHA, GQA,
// MQA); query head h reads KV head h / (num_q_heads / num_kv_heads). Softmax is
// exact (max-subtracted) in f32 with scale applied to q·k. The K/V of the new
// tokens must already be in the pool (kv_write). K and V pools in f16 / bf16 /
// fp8 / int8 / int4 are read one (position, head) vector at a time, dequantized
// into a thread-local f32 buffer (backend/cpu/kernels/kv_quantize.h) and then used
// exactly as an f32 vector would be: the result equals attention over an f32
// pool holding the dequantized values. f32 pools are read in place.
// Token eviction (PagedSequence::eviction, paged_kv.h): a sequence's per-head
// holes are neither read nor attended, and scoring queries add their
// attention distribution to the sequence's mass and entropy sums (each
// scoring (token, head) fills a private row; the rows are summed after, per
// (sequence, head), so no two threads write the same memory). With the
// defaults nothing of this runs but a null check.
// Cross-layer sharing (PagedKvLayer::share_norms): each stored K / V vector is
// read as this layer's norm x the stored direction (the score is scaled, the
// value weight is scaled), one f32 load per vector more.
// Two implementations: paged_attention_tiled (paged_attention_tiled.h: tiles of
// queries x keys, online softmax) runs every call without eviction scoring
// or cross-layer sharing;
// paged_attention_reference (one dot / axpy per position, parallel over
// (token, KV head)) runs calls with scoring or sharing and is what the tiled one is tested
// against. They agree up to f32 summation order.
// Parallel on ThreadPool::global(); call from one thread at a time.

#include <cstddef>
#include <cstdint>
#include <span>

#include "pagoda/backend/cpu/kernels/paged_kv.h"

namespace pagoda::kernels {

struct PagedAttentionParams {
  int32_t num_q_heads = 0;
  float scale = 1.0f;          // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;  // 0: full causal; w > 0: attend to the last w indices only
};

void paged_attention(const float* q, const PagedKvLayer& layer,
                     std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                     float* out);

// The per-position implementation (also the only one that scores for eviction).
void paged_attention_reference(const float* q, const PagedKvLayer& layer,
                               std::span<const PagedSequence> sequences, const PagedAttentionParams& params,
                               float* out);

}  // namespace pagoda::kernels
