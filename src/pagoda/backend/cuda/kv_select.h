#pragma once
// Token eviction's kept-token choice on the GPU (docs/KV_CACHE.md "Token
// eviction"): per (layer, KV head) of one sequence, the indices that
// runtime::select_kept_tokens returns for the same scores, computed on the
// device so that a scored compaction (h2o, snapkv) needs no host round trip.
//
// Per head: the first `sinks` indices, the last `recent`, and from the middle
// [sinks, num_valid - recent) the `take` with the highest score (for snapkv
// the score averaged over a 7-wide neighbourhood, summed in index order as the
// CPU does, then carried forward over the span with the CPU's float products,
// so bit for bit the same), ties to the higher index (the CPU's
// comparator). One CTA per head: a radix select (four 8-bit digit passes over
// order-preserving keys) finds the take-th highest score, then a block scan
// writes the chosen middle indices in ascending order. Then kv_build_moves
// turns the kept indices into the gather's moves (kv_compact.h) and the
// carried-over mass.
//
// Every launch is asynchronous and reads nothing from the host mid-way, so a
// compaction is launch-only (capturable, though no graph includes it yet).
// Scores must not be NaN (attention mass never is).
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/backend/cuda/kv_compact.h"

namespace pagoda::cuda {

struct KvSelectShape {
  int32_t num_heads = 0;   // (layer, KV head) rows of scores
  int32_t num_valid = 0;   // candidate indices per head
  int32_t sinks = 0;       // first indices always kept
  int32_t recent = 0;      // last indices always kept
  int32_t take = 0;        // kept from the middle by score (<= its length)
  int32_t kept = 0;        // sinks + take + recent (the row length of `kept`)
  bool pooled = false;     // average each score over its 7-wide neighbourhood first
  int32_t span = 0;        // then carry it forward this far (runtime::kv_span_scores; pooled only)
};

// The shape runtime::select_kept_tokens uses for `budget` of `num_valid`
// (config fields passed apart to keep this header free of std types).
KvSelectShape kv_select_shape(int32_t num_heads, int32_t num_valid, int32_t budget, int32_t sink_tokens,
                              int32_t window, bool streaming, bool pooled, int32_t span);

// Bytes of device scratch kv_select_kept needs for `shape`.
size_t kv_select_scratch_bytes(const KvSelectShape& shape);

// kept[h * shape.kept + k] = the k-th kept index (ascending) of head h, whose
// scores are scores[h * score_stride + i], i < num_valid. Errors:
// cudaErrorInvalidValue for an inconsistent shape.
cudaError_t kv_select_kept(const float* scores, int64_t score_stride, const KvSelectShape& shape, void* scratch,
                           int32_t* kept, cudaStream_t stream);

// For each (head h = layer * num_kv_heads + kv_head, k < kept_per_head):
// moves[h * kept_per_head + k] = {old slot of kept index, new slot of k,
// kv_head}, and new_mass[same] = carry ? mass[h * mass_stride + index] : 0.
// Tables are device arrays of block ids; slots are block * block_size + offset.
cudaError_t kv_build_moves(const int32_t* kept, int32_t num_heads, int32_t kept_per_head, int32_t num_kv_heads,
                           const int32_t* old_table, const int32_t* new_table, int32_t block_size, const float* mass,
                           int64_t mass_stride, bool carry, KvVectorMove* moves, float* new_mass,
                           cudaStream_t stream);

// Per-head budgets (pyramidkv, entropy; docs/KV_CACHE.md "Per-head lengths"):
// each (layer, KV head) has its own shape, and after an earlier per-head
// compaction its candidates are not one run of cache indices: candidate i is
// cache index i below gap_at (the head's kept tokens of the compacted region)
// and i + gap_len from there on (the tokens after the region's holes), as the
// CPU's `valid` list (CpuKvEviction::compact). Scores are indexed by cache
// index; pooling averages over neighbouring candidates, as the CPU does.
struct KvSelectHead {
  KvSelectShape shape;   // kv_select_shape(1, the head's candidates, its budget, ...)
  int32_t gap_at = 0;    // candidates below this are cache indices as they are
  int32_t gap_len = 0;   // the rest sit this much further (0: one run)
};

// Device scratch for kv_select_kept_heads: max_middle = the largest
// num_valid - sinks - recent over the heads.
size_t kv_select_heads_scratch_bytes(int32_t num_heads, int32_t max_middle);

// kept[h * row_stride + k] = the k-th kept cache index (ascending) of head h,
// k < heads[h].shape.kept <= row_stride (the rest of the row is not written);
// heads is a device array. Scores of head h at scores[h * score_stride + index].
// Shapes are checked on the host by the caller (kv_select_shape makes them).
cudaError_t kv_select_kept_heads(const float* scores, int64_t score_stride, const KvSelectHead* heads,
                                 int32_t num_heads, int32_t max_middle, int32_t row_stride, void* scratch,
                                 int32_t* kept, cudaStream_t stream);

// The gather's moves for rows of different lengths: moves[h * row_stride + k]
// for k < head_kept[h] (a device array) as kv_build_moves makes them, the rest
// of each row a skipped move (head -1: that slot of the new blocks stays a hole).
cudaError_t kv_build_moves_ragged(const int32_t* kept, int32_t num_heads, int32_t row_stride, const int32_t* head_kept,
                                  int32_t num_kv_heads, const int32_t* old_table, const int32_t* new_table,
                                  int32_t block_size, KvVectorMove* moves, cudaStream_t stream);

}  // namespace pagoda::cuda
