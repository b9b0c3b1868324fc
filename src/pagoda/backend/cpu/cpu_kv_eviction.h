#pragma once
// Token eviction on the CPU backend (runtime/kv_compression.h): the state the
// runner keeps per compressed sequence (attention mass per cache index, the
// observation window's entropy, per-head kept lengths after a compaction),
// the per-layer views the attention kernel reads and updates
// (kernels::PagedSequenceEviction), and compaction: choosing each (layer,
// KV head)'s kept tokens and copying their K/V vectors (codes and scale
// records, bytes as they are) into the fresh blocks.
//
// Thread safety: one thread (the runner's).

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/kernels/paged_kv.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda {

// One sequence's eviction state.
struct CpuSequenceEviction {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  // Before the first compaction head_kept is empty (no holes).
  int32_t compacted_length = 0;
  std::vector<int32_t> head_kept;  // [layers * kv_heads]
  int64_t capacity = 0;            // indices mass holds per (layer, head)
  std::vector<float> mass;         // [layers][kv_heads][capacity]
  std::vector<double> entropy_sum;     // [layers * kv_heads]
  std::vector<int64_t> entropy_count;  // [layers * kv_heads]

  // Grows mass to hold `length` indices per head (keeps what it held).
  void reserve(int64_t length);
  // The kernel's view of layer l for a slice scoring from `score_from_index`.
  kernels::PagedSequenceEviction layer_view(int32_t layer, int32_t score_from_index);
};

class CpuKvEviction {
 public:
  CpuKvEviction(int32_t num_layers, int32_t num_kv_heads) : num_layers_(num_layers), num_kv_heads_(num_kv_heads) {}

  // The state of each slice of `batch` (null where kv_state is 0), created or
  // reset (kv_state_reset) as the slices say and sized for their lengths.
  std::vector<CpuSequenceEviction*> prepare(const ForwardBatch& batch);
  // ModelRunner::compact_kv on `pool`. Errors name the bad id or length;
  // nothing is read outside the pool.
  Status compact(const runtime::KvCompaction& compaction, CpuKvPool& pool);
  void release(int64_t kv_state) { states_.erase(kv_state); }
  size_t num_states() const { return states_.size(); }
  const CpuSequenceEviction* find(int64_t kv_state) const;

 private:
  int32_t num_layers_;
  int32_t num_kv_heads_;
  std::unordered_map<int64_t, CpuSequenceEviction> states_;
};

}  // namespace pagoda
