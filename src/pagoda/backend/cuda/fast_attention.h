#pragma once
// Adapter to the Hopper paged attention kernels of backend/cuda/attention (split-K
// decode, tensor-core prefill): plans a step with PagedAttentionPlan, keeps the
// plan's int32 arena and split-K workspace on the device, and launches the
// kernel for one layer.
//
// Two kinds of plan, one per step:
//  - plan(): any step (prefill chunks, mixed steps, eager decodes). Arena and
//    workspace grow as needed, so launches are only valid for this step.
//  - plan_graph(): a pure decode step padded to a CUDA-graph bucket. backend/cuda/attention's
//    graph mode gives a descriptor that is the same for every step of the
//    bucket (fixed sequence count, fixed work-item capacity, block tables last
//    with the model's stride), and the arena and workspace live in buffers
//    sized once for the largest bucket and never moved, so launches captured
//    in a graph replay correctly after each step's plan_graph().
//
// When backend/cuda/attention is not built, or the shape is outside what it supports
// (head_dim not 64/128/256, sliding window, prefill with head_dim 256 or more
// than 128 query heads per KV head), the plan calls answer false and the
// caller uses its own kernel (paged_attention.cu).
//
// Thread safety: one caller at a time (owned by a CudaModel).

#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/model/model_config.h"

namespace pagoda::cuda {

// The start-up check of the attention kernels at one model's attention shape
// (check_attention_kernels below): backend/cuda/attention's attention and the backend's
// own kernel each run on the same random bf16 inputs and each are compared with
// a float64 CPU reference, relative L2 over all outputs, for a prefill step
// (prompts of 200 and 77 tokens), a mixed step (two decodes, then a prompt and
// a chunk after a cached prefix; the "prefill" figures are the worse of the
// two) and a decode step (cached 1,000 / 77 / 300, scattered block tables).
//
// Why not the two kernels' logits through the whole model against each other:
// with bf16 activations every layer rounds, and on a deep random-weight model
// the roundings compound (the fast prefill also rounds P to bf16, as
// FlashAttention does), so two correct kernels differ by a few percent of the
// logit range after 32 layers (docs/KERNELS.md, "Fast attention in the model").
// Against a reference, per op, a wrong kernel stands out at once.
struct AttentionCheck {
  bool fast_available = false;  // backend/cuda/attention built and supporting this shape
  // Relative L2 error vs float64 (0 when not run).
  double fast_prefill = 0, builtin_prefill = 0;
  double fast_decode = 0, builtin_decode = 0;
  // The kernels' test bound (tests/gpu, tests/gpu_backend): bf16 output + f32 sums.
  static constexpr double kBound = 1e-2;
  bool fast_ok() const { return fast_available && fast_prefill <= kBound && fast_decode <= kBound; }
  bool builtin_ok() const { return builtin_prefill <= kBound && builtin_decode <= kBound; }
};

class FastAttention {
 public:
  FastAttention();
  ~FastAttention();
  FastAttention(const FastAttention&) = delete;
  FastAttention& operator=(const FastAttention&) = delete;

  // True when backend/cuda/attention was compiled in.
  static bool compiled_in();

  // The pool's element types (bf16 unless set). Quantized pools (fp8 / int8 /
  // int4; head_dim 64 / 128) decode in registers; their prompt chunks run on
  // the bf16 prefill kernel over a scratch copy of the blocks they read,
  // dequantized per layer (see plan()).
  void set_kv_dtypes(DType key, DType value);

  // Plans `batch` (after the caller validated it). true: run() may be called for
  // every layer of this step; false: not supported here (no error). The arena
  // copy is enqueued on `stream`.
  //
  // A step is one launch (all decodes: split-K decode; all prompt chunks over a
  // bf16 pool: prefill) or two: the leading one-token sequences (the scheduler
  // puts decodes first) on the decode kernel, the rest on the prefill kernel
  // from their first query row on. Over a quantized pool the prefill launch
  // reads a bf16 scratch pool: the blocks of the chunks' tables, each pool block
  // once, dequantized by kv_dequantize_blocks before each layer's launch (the
  // new tokens' codes are already in the pool, so every query sees the same
  // dequantized values as the decode kernel and the CPU would). A step whose
  // scratch would pass 1 GiB, or cannot be allocated, answers false.
  StatusOr<bool> plan(const ModelConfig& config, const ForwardBatch& batch, int32_t block_size, int32_t num_blocks,
                      cudaStream_t stream);

  // Graph mode: plans a pure decode step of batch.sequences.size() <= bucket
  // sequences (every one 1 new token; query row i = sequence i, rows up to
  // `bucket` are padding and get zeros). max_bucket (the largest bucket this
  // model will ever ask for) sizes the fixed device buffers on the first call;
  // block_table_stride bounds every block table. run() launches then take the
  // same arguments for every step of the bucket, so they may be captured once
  // and replayed after each later plan_graph() of that bucket. false: the shape
  // is not supported (no error). The arena copy is enqueued on `stream`.
  // device_block_tables: the runner's own device copy of this step's block
  // tables, row i (sequence i) at i x block_table_stride, at a fixed address
  // (the launches read them there: attention_plan.h's graph_block_tables, so
  // the arena copied each step holds no tables); null: the arena carries them.
  StatusOr<bool> plan_graph(const ModelConfig& config, const ForwardBatch& batch, int32_t bucket,
                            int32_t max_bucket, int32_t block_table_stride, int32_t block_size, int32_t num_blocks,
                            cudaStream_t stream, const int32_t* device_block_tables = nullptr);

  // q: [num_tokens, num_q_heads * head_dim] contiguous; out the same shape
  // (graph mode: `bucket` rows). fixed_scales: the ones kv_write used for this
  // layer; an fp8 pool written with both > 0 decodes without reading its scale
  // records. hole_begin / hole_end (token eviction's per-head holes of this
  // layer, CudaKvScores::prepare_holes: rows per batch sequence; null: none) go
  // to the step's decode launch (the leading one-token sequences, batch order),
  // whose kernels then skip them (the CUDA-core decode); errors if the step
  // has no decode launch. Enqueue only: capturable.
  //
  // scores / score_stride (token eviction's mass from the decode kernel,
  // AttentionDescriptor::scores; null: off): the step's decode launch writes
  // each attended position's score there, rows in batch order. Only when
  // writes_scores() holds; errors otherwise.
  Status run(const DevicePagedKvLayer& layer, const bf16* q, bf16* out, cudaStream_t stream,
             KvWriteFixedScales fixed_scales = {}, const int32_t* hole_begin = nullptr,
             const int32_t* hole_end = nullptr, float* scores = nullptr, int64_t score_stride = 0);
  // True when the planned step is one decode launch (every sequence one new
  // token, rows from 0), whose kernels can write per-position scores.
  bool writes_scores() const;

  // The check described above AttentionCheck, for config's heads and head_dim
  // (bf16 KV). Allocates and synchronizes: call at start-up, not while serving.
  // Errors: CUDA failures.
  static StatusOr<AttentionCheck> check_attention_kernels(const ModelConfig& config, int32_t block_size);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagoda::cuda
