#pragma once
// Per-kernel launchers behind launch_paged_attention (attention_kernels.h).
// Internal to kernels/cuda.

#include <cuda_runtime.h>

#include "pagoda/kernels/cuda/attention_descriptor.h"

namespace pagoda::kernels::cuda {

cudaError_t launch_decode_attention(const AttentionDescriptor& desc, const void* q, void* out,
                                    cudaStream_t stream);
cudaError_t prepare_decode_attention();
cudaError_t prepare_prefill_attention();
cudaError_t launch_prefill_attention(const AttentionDescriptor& desc, const void* q, void* out,
                                     cudaStream_t stream);
cudaError_t prepare_prefill_attention_sm90();
cudaError_t launch_prefill_attention_sm90(const AttentionDescriptor& desc, const void* q, void* out,
                                          cudaStream_t stream);

}  // namespace pagoda::kernels::cuda
