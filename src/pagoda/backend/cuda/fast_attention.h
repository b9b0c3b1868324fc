#pragma once
// Adapter to the Hopper paged attention kernels of kernels/cuda (split-K
// decode, tensor-core prefill): plans a step with PagedAttentionPlan, keeps the
// plan's int32 arena and split-K workspace on the device, and launches the
// kernel for one layer. Used for eager steps (prefill chunks, mixed steps,
// decodes above the graph bucket limit). The plan's arena puts the block tables
// before the work list, so its device offsets change from step to step and it
// cannot be replayed inside the decode graphs; those use the backend's own
// kernel (paged_attention.cu).
//
// When kernels/cuda is not built, or the shape is outside what it supports
// (e.g. head_dim 32), plan() answers false and the caller uses its own kernel.
//
// Thread safety: one caller at a time (owned by a CudaModel).

#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/status.h"
#include "pagoda/model/forward_batch.h"
#include "pagoda/model/model_config.h"

namespace pagoda::cuda {

class FastAttention {
 public:
  FastAttention();
  ~FastAttention();
  FastAttention(const FastAttention&) = delete;
  FastAttention& operator=(const FastAttention&) = delete;

  // True when kernels/cuda was compiled in.
  static bool compiled_in();

  // Plans `batch` (after the caller validated it). true: run() may be called for
  // every layer of this step; false: not supported here (no error). The arena
  // copy is enqueued on `stream`.
  StatusOr<bool> plan(const ModelConfig& config, const ForwardBatch& batch, int32_t block_size, int32_t num_blocks,
                      cudaStream_t stream);

  // q: [num_tokens, num_q_heads * head_dim] contiguous; out the same shape.
  Status run(const DevicePagedKvLayer& layer, const bf16* q, bf16* out, cudaStream_t stream);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagoda::cuda
