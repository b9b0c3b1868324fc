#pragma once
// Launches of the paged attention kernels. Each call only enqueues work on
// `stream`: no allocation, no synchronization, so a sequence of them can be
// captured in a CUDA graph. The returned error is the launch error
// (cudaGetLastError); kernel faults surface at the caller's next sync.
//
// q and out: [num_tokens, num_q_heads, head_dim] bf16 on the device (see
// attention_descriptor.h for the row order). out must not alias q or the pool.
// The descriptor comes from PagedAttentionPlan::descriptor(); its arena and
// workspace must stay alive until the work has run.

#include <cuda_runtime.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"

namespace pagoda::kernels::cuda {

// Raises the shared-memory limits of every attention kernel (a one-time setup,
// not a stream operation). Call once before capturing launches in a graph; the
// launches also do it themselves on first use.
cudaError_t prepare_paged_attention_kernels();

// The fast path: decode (split-K + merge) or prefill (tensor cores), as the plan chose.
cudaError_t launch_paged_attention(const AttentionDescriptor& desc, const void* q, void* out,
                                   cudaStream_t stream);

// Does launch_paged_attention(desc) write AttentionDescriptor::scores (token
// eviction's mass from the decode kernel): every decode kernel does (tensor
// cores, CUDA cores bf16 and quantized, holes skipped); the prefill kernels do
// not. A descriptor with scores that this refuses is refused by the launch
// (cudaErrorInvalidValue); such steps keep the separate scoring pass
// (kv_attention_scores.h).
bool decode_attention_writes_scores(const AttentionDescriptor& desc);

// Naive reference on the GPU: one CTA per (query token, query head), f32 math,
// scores in shared memory. For tests only; max_kv_length bounds every sequence's
// cached + new length (at most 12,000).
cudaError_t launch_naive_paged_attention(const AttentionDescriptor& desc, const void* q, void* out,
                                         int max_kv_length, cudaStream_t stream);

}  // namespace pagoda::kernels::cuda
