#pragma once
// Per-kernel launchers behind launch_paged_attention (attention_kernels.h).
// Internal to backend/cuda/attention.

#include <cuda_runtime.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"

namespace pagoda::kernels::cuda {

cudaError_t launch_decode_attention(const AttentionDescriptor& desc, const void* q, void* out,
                                    cudaStream_t stream);
cudaError_t prepare_decode_attention();
// The split-K merge pass of decode (decode_attention.cu): combines the
// workspace partials of every sequence with more than one work item.
cudaError_t launch_decode_merge(const AttentionDescriptor& desc, void* out, cudaStream_t stream);
// Decode on tensor cores (decode_attention_mma.cu): bf16, fp8, int8 or int4 K and V
// (the same format), head_dim 64 or 128, unless desc.decode_cuda_cores.
bool decode_attention_mma_supports(const AttentionDescriptor& desc);
cudaError_t launch_decode_attention_mma(const AttentionDescriptor& desc, const void* q, void* out,
                                        cudaStream_t stream);
cudaError_t prepare_decode_attention_mma();
// Decode over a quantized pool on CUDA cores (decode_attention_quantized.cu): K and V fp8,
// int8 or int4 (the same format), or K int8 with V int4; head_dim 64 or 128.
bool decode_attention_quantized_supports(KvElement key, KvElement value, int head_dim);
cudaError_t launch_decode_attention_quantized(const AttentionDescriptor& desc, const void* q, void* out,
                                              cudaStream_t stream);
cudaError_t prepare_decode_attention_quantized();
cudaError_t prepare_prefill_attention();
cudaError_t launch_prefill_attention(const AttentionDescriptor& desc, const void* q, void* out,
                                     cudaStream_t stream);
cudaError_t prepare_prefill_attention_sm90();
cudaError_t launch_prefill_attention_sm90(const AttentionDescriptor& desc, const void* q, void* out,
                                          cudaStream_t stream);

}  // namespace pagoda::kernels::cuda
