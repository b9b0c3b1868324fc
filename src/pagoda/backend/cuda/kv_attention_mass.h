#pragma once
// Token eviction's attention mass from the decode kernel's own scores
// (docs/KV_CACHE.md "Mass from the decode kernel"): the tensor-core decode
// writes each attended position's score (AttentionDescriptor::scores, log2
// units) while it reads the cache for the attention itself; this light kernel
// turns a layer's score rows into what the separate scoring pass
// (kv_attention_scores.h) adds, without reading the cache again: each index's
// softmax probability, summed over the KV head's query heads, into the
// sequence's mass array, and each query head's normalized entropy
// (H / log n, 0 when n = 1) into its entropy sum. Same items, sequences and
// layout as the pass, so a caller swaps one call for the other.
//
// One CTA per (item, KV head), 1,024 threads: two reads of the group's score
// rows (each query head's maximum, sum and entropy terms in one online pass,
// then the mass with one float atomic add per index). Capturable in a CUDA
// graph (items with sequence < 0 are
// skipped). Not thread safe with respect to the arrays it adds into (the
// stream orders it).
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/backend/cuda/kv_attention_scores.h"

namespace pagoda::cuda {

// Adds layer `layer_index`'s mass and entropy of `num_items` items. scores:
// f32 rows [row][num_q_heads][score_stride] as the decode kernel wrote them
// (item.row is the query row; positions [0, item.query_index], holes of
// KvScoreSequence::head_kept excepted, must have been written).
// Errors: cudaErrorInvalidValue for a group (num_q_heads / num_kv_heads) above
// 8 or not whole, a non-positive score_stride or null scores.
cudaError_t kv_attention_mass_from_scores(const float* scores, int64_t score_stride, int32_t num_q_heads,
                                          int32_t num_kv_heads, int32_t layer_index, const KvScoreItem* items,
                                          int32_t num_items, const KvScoreSequence* sequences, cudaStream_t stream);

}  // namespace pagoda::cuda
