#pragma once
// rope_qk and kv_write in one launch: the decode step's fusion of the rotary embedding and the paged KV
// write (the CUDA model uses it for steps of at most kGemvMaxRows tokens when PAGODA_FUSE_ROPE_KV=1).
//
// qkv rows [q heads | k heads | v heads] (layer.num_kv_heads k and v heads of layer.head_dim, row stride
// row_stride): the q and k heads are rotated in place, and q also into q_out [num_tokens, num_q_heads *
// head_dim] when q_out is not null, exactly as rope_qk (cuda_ops.h); then each token's rotated k and its v
// are written to the pool exactly as kv_write with fixed_scales (every format kv_write takes; slots[t] < 0:
// rotated, not written). One warp per (token, head), the quantized KV write's arithmetic (kv_write.cu).
// Errors: cudaErrorInvalidValue for head_dim % 8 != 0 or > 256, row_stride % 8 != 0, no kv heads, a bad
// fixed scale, or a quantized format without its scale pool; otherwise cudaGetLastError(). No
// synchronization, no allocation: CUDA-graph capturable; launched with programmatic dependent launch
// (pdl.cuh). Thread safety: a plain launch on the caller's stream.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

cudaError_t rope_qk_kv_write(bf16* qkv, int64_t row_stride, const int32_t* positions, const int64_t* slots,
                             int32_t num_tokens, int32_t num_q_heads, const float* inv_freq, bf16* q_out,
                             const DevicePagedKvLayer& layer, KvWriteFixedScales fixed_scales, cudaStream_t stream);

}  // namespace pagoda::cuda
