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
// is rewritten before each replay.
//
// Two kernels over (scoring query, KV head, split): each CTA reads every
// `splits`-th chunk of the K vectors the query attends, for the group's query
// heads at once; the first writes each split's online max / sum / entropy
// statistics to a scratch array, the second merges a head's splits (in split
// order) and adds each index's probability, summed over the group, into the
// sequence's mass array with float atomics (one add per index and query, so
// a lone query's mass is the same in every run; several queries' sum order
// varies in the last bits); split 0 adds the heads' normalized entropies.
// Splits spread a decode batch (few queries, long contexts) over the GPU.
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstddef>
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
  // Per-head holes after a per-head compaction (pyramidkv, entropy; null:
  // none): KV head h of layer l neither reads nor scores cache indices
  // [head_kept[l * kv_heads + h], compacted_length), and its entropy is
  // normalized by the log of the indices it does attend (the CPU's rule).
  const int32_t* head_kept = nullptr;  // device, [layers][kv_heads]
  int32_t compacted_length = 0;
  int32_t unused = 0;
};

// The most splits a launch takes.
constexpr int32_t kMaxScoreSplits = 16;

// The splits for a launch over `num_items` items (enough CTAs to fill the GPU,
// 1 to kMaxScoreSplits): a function of the launch's shape only, so a graph's
// fixed launch keeps it.
int32_t kv_attention_scores_splits(int32_t num_items, int32_t num_kv_heads);
// Bytes of device scratch a launch of that shape needs.
size_t kv_attention_scores_scratch_bytes(int32_t num_items, int32_t num_kv_heads, int32_t splits);

// Adds layer `layer`'s scores of `num_items` items (device arrays). q rows are
// [num_q_heads, head_dim] bf16 at row stride q_row_stride (elements), after
// RoPE; `scale` the softmax scale; `scratch` holds
// kv_attention_scores_scratch_bytes(num_items, num_kv_heads, splits).
// Errors: cudaErrorInvalidValue for a group (num_q_heads / num_kv_heads) above
// 8, a head_dim not a multiple of 8, splits outside [1, kMaxScoreSplits] or
// no scratch.
cudaError_t kv_attention_scores(const bf16* q, int64_t q_row_stride, int32_t num_q_heads, float scale,
                                const DevicePagedKvLayer& layer, int32_t layer_index, const int32_t* block_tables,
                                const KvScoreItem* items, int32_t num_items, const KvScoreSequence* sequences,
                                int32_t splits, void* scratch, cudaStream_t stream);

}  // namespace pagoda::cuda
