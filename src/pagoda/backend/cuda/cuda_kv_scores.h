#pragma once
// Token eviction's scores on the CUDA runner (docs/KV_CACHE.md "Token
// eviction"): the per-sequence state on the device (attention mass per
// (layer, KV head, cache index) and each head's entropy sum over its
// observation window), the step's list of scoring queries (for an eager
// step or a decode graph's fixed slots), and the compaction (streaming's
// too, without scores): choose each (layer, KV head)'s kept tokens on the device with
// the CPU's rule (kv_select.h = runtime::select_kept_tokens on the same
// scores), gather their vectors (kv_compact.h), carry h2o's mass over, all
// without a host round trip.
//
// Per-head budgets (pyramidkv, entropy) are compacted here too, in the CPU's
// layout (runtime/kv_compression.h: head (l, h) keeps its kept[l][h] tokens at
// the front of the compacted region, holes after them), and the state
// remembers each head's kept count (head_layout); prepare_holes hands a
// step's holes to the attention (the builtin kernel and the fast attention's
// CUDA-core decode skip them) and the scoring pass skips them too.
// CudaModelRunner runs those policies unless
// CudaRunnerOptions::kv_head_budgets is off (on by default).
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
  //
  // graph_slots > 0: the step replays (or records) a decode graph of that many
  // token slots. Then the list goes, padded to graph_slots items (padding and
  // non-scoring slots carry sequence -1 and are skipped by the kernel), into a
  // buffer allocated once for graph_capacity slots that never moves, so a
  // graph's recorded scoring launches (fixed grid, fixed addresses) read each
  // step's list: no host sync, nothing in the graph changes. Errors:
  // kInternal for more scoring queries than slots or slots above the capacity.
  Status prepare(const ForwardBatch& batch, int64_t table_stride, cudaStream_t stream, int32_t graph_slots = 0,
                 int32_t graph_capacity = 0);
  bool active() const { return num_items_ > 0; }
  // The step's per-head holes for the attention (AttentionDescriptor::
  // hole_begin / hole_end): true when some sequence of `batch` has a per-head
  // layout (head_layout), and then hole_begin(l) ([sequence][kv_head] of layer
  // l, one row per batch sequence, 0 for sequences without) and hole_end()
  // ([sequence]) point to device arrays uploaded on `stream`, valid until the
  // next call. Call before prepare() (a slice with kv_state_reset counts as
  // having none). The attention kernels that skip holes: the builtin
  // paged_attention (any step) and the fast attention's CUDA-core decode.
  StatusOr<bool> prepare_holes(const ForwardBatch& batch, cudaStream_t stream);
  const int32_t* hole_begin(int32_t layer) const {
    return holes_.as<int32_t>() + static_cast<int64_t>(layer) * holes_sequences_ * num_kv_heads_;
  }
  const int32_t* hole_end() const {
    return holes_.as<int32_t>() + static_cast<int64_t>(num_layers_) * holes_sequences_ * num_kv_heads_;
  }
  // Layer l's scores of the prepared step (q: the layer's rows after RoPE).
  // In a graph step its launch covers all graph_slots items.
  Status score_layer(int32_t layer, const bf16* q, int64_t q_row_stride, float scale, const DevicePagedKvLayer& kv,
                     const int32_t* block_tables, cudaStream_t stream) const;
  // Layer l's mass and entropy from the decode kernel's score rows instead of
  // score_layer (kv_attention_mass.h: rows [row][num_q_heads][score_stride],
  // written by this layer's decode attention, which must have run before on
  // `stream`). Same items and sequences as score_layer; capturable.
  Status mass_layer(int32_t layer, const float* scores, int64_t score_stride, cudaStream_t stream) const;
  // ModelRunner::compact_kv for every policy (streaming: no score part and
  // no state; h2o, snapkv from the state's scores; pyramidkv, entropy per
  // head, below): returns once the work is queued on `stream` (a fault in it
  // shows at the stream's next synchronization). Errors: check_kv_compaction's;
  // kInvalidArgument for fewer tokens than a per-head state's compacted region.
  //
  // Per-head budgets: runtime::kv_head_budgets on the host (entropy: from the
  // state's entropy sums, downloaded, the one wait on the device here), each
  // (layer, KV head)'s candidates are its kept tokens and the tokens after
  // the holes (the CPU's rule), chosen on the device (kv_select_kept_heads),
  // gathered with per-head counts; holes are not written.
  Status compact(const runtime::KvCompaction& compaction, CudaKvPool& pool, DeviceBuffer& moves_buffer,
                 cudaStream_t stream);
  // A per-head state's layout after its last compaction: kept count per
  // (layer, KV head) at [0, head_kept[lh]) of [0, compacted_length); empty
  // when the sequence has no per-head compaction.
  struct HeadLayout {
    std::vector<int32_t> head_kept;
    int32_t compacted_length = 0;
  };
  HeadLayout head_layout(int64_t kv_state) const;
  // Sets a state's layout (made if missing) as a per-head compaction would
  // (tests: the scoring pass over holes). Errors: kInvalidArgument for a
  // layout of the wrong size or a kept count outside [0, compacted_length].
  Status set_head_layout(int64_t kv_state, const HeadLayout& layout, cudaStream_t stream);
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
  // The reverse (tests): a state (made if missing) gets these scores for
  // indices [0, length), mass laid out as download's; waits for the copies.
  Status upload(int64_t kv_state, const HostScores& scores, int32_t length, cudaStream_t stream);

 private:
  struct State {
    DeviceBuffer mass;     // [layers][kv_heads][capacity] f32
    DeviceBuffer entropy;  // [layers][kv_heads] f64
    int64_t capacity = 0;
    int64_t entropy_count = 0;  // query heads summed into each entropy entry
    std::vector<int32_t> head_kept;  // per-head compactions: kept per (layer, KV head); else empty
    int32_t compacted_length = 0;
    DeviceBuffer head_kept_device;   // its device copy, which the scoring pass reads
  };
  Status store_head_layout(State& st, std::vector<int32_t> head_kept, int32_t compacted_length, cudaStream_t stream);
  Status compact_heads(const runtime::KvCompaction& compaction, CudaKvPool& pool, DeviceBuffer& moves_buffer,
                       cudaStream_t stream);
  Status reset(State& st, cudaStream_t stream);
  Status grow(State& st, int64_t length, cudaStream_t stream);
  Status upload_for_graph(int32_t slots, int32_t capacity, cudaStream_t stream);

  int32_t num_layers_;
  int32_t num_kv_heads_;
  int32_t num_q_heads_;
  std::unordered_map<int64_t, State> states_;
  std::vector<KvScoreItem> items_;
  std::vector<KvScoreSequence> sequences_;
  DeviceBuffer step_buffer_;   // items then sequences, for an eager step
  DeviceBuffer graph_buffer_;  // [graph_capacity_] items then as many sequences; never reallocated
  int32_t graph_capacity_ = 0;
  int32_t launch_items_ = 0;                // the kernel's grid: num_items_, or the graph's slots
  const void* launch_buffer_ = nullptr;     // step_buffer_ or graph_buffer_
  int32_t launch_sequences_offset_ = 0;     // items in launch_buffer_ before its sequences
  int32_t launch_splits_ = 1;               // kv_attention_scores_splits of the launch
  void* launch_scratch_ = nullptr;          // step_scratch_ or graph_scratch_
  DeviceBuffer step_scratch_;               // the split statistics of an eager step
  DeviceBuffer graph_scratch_;              // those of any graph's launch; never reallocated
  // Compaction scratch, reused: the radix select's keys, the kept indices, the carried mass, the block tables.
  DeviceBuffer select_scratch_;
  DeviceBuffer kept_;
  DeviceBuffer new_mass_;
  DeviceBuffer tables_;
  DeviceBuffer holes_;          // prepare_holes: [layers][sequences][kv_heads] hole begins, then [sequences] ends
  std::vector<int32_t> holes_host_;
  int64_t holes_sequences_ = 0;
  DeviceBuffer head_rows_;  // per-head compactions: the heads' KvSelectHead rows, then their kept counts
  int32_t num_items_ = 0;
};

}  // namespace pagoda::cuda
