#pragma once
// Token eviction's scores on the CUDA runner (docs/KV_CACHE.md "Token
// eviction"): the per-sequence state on the device (attention mass per
// (layer, KV head, cache index) and each head's entropy sum over its
// observation window), the step's list of scoring queries, and the scored
// compaction: choose each (layer, KV head)'s kept tokens on the device with
// the CPU's rule (kv_select.h = runtime::select_kept_tokens on the same
// scores), gather their vectors (kv_compact.h), carry h2o's mass over, all
// without a host round trip.
//
// Only policies whose heads all keep the same count run here (h2o, snapkv:
// the compacted region has no holes); pyramidkv and entropy give heads their
// own budgets, which the CUDA attention kernels cannot skip yet: refused.
//
// Thread safety: the runner's thread only.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/kv_attention_scores.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::cuda {

class CudaKvScores {
 public:
  CudaKvScores(int32_t num_layers, int32_t num_kv_heads, int32_t num_q_heads)
      : num_layers_(num_layers), num_kv_heads_(num_kv_heads), num_q_heads_(num_q_heads) {}

  // Creates, resets (kv_state_reset) and grows the states of `batch`'s slices
  // and lists its scoring queries (cache index >= score_from_index) for the
  // forward; sequence i's block table is at i * table_stride of the model's
  // step tables. active() says whether any query scores this step.
  Status prepare(const ForwardBatch& batch, int64_t table_stride, cudaStream_t stream);
  bool active() const { return num_items_ > 0; }
  // Layer l's scores of the prepared step (q: the layer's rows after RoPE).
  Status score_layer(int32_t layer, const bf16* q, int64_t q_row_stride, float scale, const DevicePagedKvLayer& kv,
                     const int32_t* block_tables, cudaStream_t stream) const;
  // ModelRunner::compact_kv for a scored policy (h2o, snapkv): returns once
  // the work is queued on `stream` (a fault in it shows at the stream's next
  // synchronization). Errors: kUnimplemented for per-head budgets (pyramidkv,
  // entropy), check_kv_compaction's.
  Status compact(const runtime::KvCompaction& compaction, CudaKvPool& pool, DeviceBuffer& moves_buffer,
                 cudaStream_t stream);
  void release(int64_t kv_state) { states_.erase(kv_state); }
  size_t num_states() const { return states_.size(); }

  // A state's scores, copied to the host: mass [layers][kv_heads][length], the
  // entropy sums [layers][kv_heads] and how many query heads each sum holds (tests).
  struct HostScores {
    std::vector<float> mass;
    std::vector<double> entropy_sum;
    int64_t entropy_count = 0;
  };
  StatusOr<HostScores> download(int64_t kv_state, int32_t length, cudaStream_t stream) const;

 private:
  struct State {
    DeviceBuffer mass;     // [layers][kv_heads][capacity] f32
    DeviceBuffer entropy;  // [layers][kv_heads] f64
    int64_t capacity = 0;
    int64_t entropy_count = 0;  // query heads summed into each entropy entry
  };
  Status reset(State& st, cudaStream_t stream);
  Status grow(State& st, int64_t length, cudaStream_t stream);

  int32_t num_layers_;
  int32_t num_kv_heads_;
  int32_t num_q_heads_;
  std::unordered_map<int64_t, State> states_;
  std::vector<KvScoreItem> items_;
  std::vector<KvScoreSequence> sequences_;
  DeviceBuffer step_buffer_;  // items then sequences, for the step
  // Compaction scratch, reused: the radix select's keys, the kept indices, the carried mass, the block tables.
  DeviceBuffer select_scratch_;
  DeviceBuffer kept_;
  DeviceBuffer new_mass_;
  DeviceBuffer tables_;
  int32_t num_items_ = 0;
};

}  // namespace pagoda::cuda
