#pragma once
// The DeepSeek forward's adapter to the paged MLA decode kernel
// (backend/cuda/attention/mla_decode.h): plans a step's decode rows, keeps the
// plan's arena and split workspace on the device, and launches per layer.
//
// A step's decode rows are its leading sequences with one new token each (the
// scheduler puts decodes first); they run on the fast kernel, the rest of the
// step (prompt chunks) on mla_attention_simple. Two kinds of plan:
//  - eager (bucket 0): exactly those rows; buffers grow as needed, so launches
//    are valid for this step only.
//  - graph (bucket > 0): a pure decode step padded to a CUDA-graph bucket, as a
//    fixed plan (mla_decode.h, MlaDecodeOptions::fixed_rows) in buffers sized
//    once for the largest bucket and never moved, so a launch captured for the
//    bucket replays correctly after every later plan of that bucket. Padding
//    rows get zeros, as the simple kernel gives them.
// The kernel covers kv_lora_rank 512 + qk_rope_head_dim 64 over bf16 latent
// pools and fp8 pools (runtime/mla_fp8_layout.h's 656-byte records) at any
// head count on Hopper; other shapes and dtypes plan 0 rows (no error: those
// rows run on the simple kernel, which reads every format), and without
// backend/cuda/attention compiled in every plan is 0 rows.
//
// Thread safety: one caller at a time (owned by a CudaDeepseekForward).

#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda::cuda {

class CudaMlaDecode {
 public:
  // config.mla set; softmax scale from it (yarn's mscale included).
  explicit CudaMlaDecode(const ModelConfig& config);
  ~CudaMlaDecode();
  CudaMlaDecode(const CudaMlaDecode&) = delete;
  CudaMlaDecode& operator=(const CudaMlaDecode&) = delete;

  // True when the kernel is compiled in and covers the model's latent shape.
  bool supported() const;

  // Plans this step (see above; the caller validated the batch). Returns the
  // rows the fast kernel covers, 0..num_tokens (graph mode: bucket or 0). The
  // arena copy is enqueued on `stream`. device_block_tables (graph mode): the
  // step's tables on the device, row i = batch sequence i at i x
  // block_table_stride, at a fixed address (mla_decode.h's fixed_block_tables:
  // the arena then holds no tables); null: the arena carries them.
  StatusOr<int32_t> plan(const ForwardBatch& batch, const KvPoolShape& pool, int32_t bucket, int32_t max_bucket,
                         int32_t block_table_stride, cudaStream_t stream,
                         const int32_t* device_block_tables = nullptr);

  // The planned rows of one layer: q [rows, heads, 576] bf16 (the absorbed
  // query), out [rows, heads, 512] bf16. Enqueue only (capturable).
  Status run(const DevicePagedKvLayer& layer, const bf16* q, bf16* out, cudaStream_t stream);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagoda::cuda
