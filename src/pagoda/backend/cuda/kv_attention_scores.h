#pragma once
// Token eviction's attention scores on the GPU (docs/KV_CACHE.md "Token
// eviction"): for the scoring queries of a step, each attended cache index's
// softmax probability, summed over the KV head's query heads, is added into
// the sequence's mass array, and each query head's normalized attention
// entropy (H / log n, 0 when n = 1) into the sequence's entropy sum: the
// CPU attention kernel's definition (backend/cpu/kernels/paged_attention.cpp).
//
// A separate pass, launched per layer only when a step has scoring queries
// (the attention kernels are unchanged, so eviction off costs nothing). It is
// capturable in a CUDA graph: a decode graph launches it over a fixed number
// of items whose padding carries sequence -1 (skipped), read from memory that
// is rewritten before each replay. One
// CTA per (scoring query, KV head) reads each K vector once for the group's
// query heads, twice: an online max / sum / entropy pass, then the
// probabilities, added with float atomics (so the sum order, and the last
// bits, vary from run to run). The compacted region has no holes here: the
// cuda device runs only policies whose heads keep equal counts.
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

// One scoring query: its row in q, its sequence (an index into the
// KvScoreSequence array; negative: no query, the CTA returns) and its cache
// index (it attends [0, query_index]).
struct KvScoreItem {
  int32_t row = 0;
  int32_t sequence = 0;
  int32_t query_index = 0;
  int32_t unused = 0;
};

// Where one sequence's scores go: mass [layers][kv_heads][capacity] f32,
// entropy [layers][kv_heads] f64; its block table starts at block_tables +
// table_offset.
struct KvScoreSequence {
  float* mass = nullptr;
  double* entropy = nullptr;
  int64_t capacity = 0;
  int64_t table_offset = 0;
};

// Adds layer `layer`'s scores of `num_items` items (device arrays). q rows are
// [num_q_heads, head_dim] bf16 at row stride q_row_stride (elements), after
// RoPE; `scale` the softmax scale. Errors: cudaErrorInvalidValue for a group
// (num_q_heads / num_kv_heads) above 8 or a head_dim not a multiple of 8.
cudaError_t kv_attention_scores(const bf16* q, int64_t q_row_stride, int32_t num_q_heads, float scale,
                                const DevicePagedKvLayer& layer, int32_t layer_index, const int32_t* block_tables,
                                const KvScoreItem* items, int32_t num_items, const KvScoreSequence* sequences,
                                cudaStream_t stream);

}  // namespace pagoda::cuda
