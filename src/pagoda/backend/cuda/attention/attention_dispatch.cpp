// launch_paged_attention: the one entry point; the plan already chose the kernel.
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/attention_launch_internal.h"

namespace pagoda::kernels::cuda {

cudaError_t prepare_paged_attention_kernels() {
  cudaError_t err = prepare_decode_attention();
  if (err == cudaSuccess) err = prepare_decode_attention_mma();
  if (err == cudaSuccess) err = prepare_decode_attention_quantized();
  if (err == cudaSuccess) err = prepare_prefill_attention();
  if (err == cudaSuccess) err = prepare_prefill_attention_sm90();
  return err;
}

bool decode_attention_writes_scores(const AttentionDescriptor& d) { return d.kernel == AttentionKernel::kDecode; }

cudaError_t launch_paged_attention(const AttentionDescriptor& d, const void* q, void* out,
                                   cudaStream_t stream) {
  // Eviction scores come from the decode kernels only (tensor-core, CUDA-core bf16 and quantized).
  if (d.scores != nullptr && (!decode_attention_writes_scores(d) || d.score_stride <= 0)) return cudaErrorInvalidValue;
  // Holes (per-head budgets): the CUDA-core decode kernels skip them; nothing else does yet.
  const bool holes = d.hole_begin != nullptr;
  if (holes && (d.kernel != AttentionKernel::kDecode || d.hole_end == nullptr)) return cudaErrorInvalidValue;
  // Decode on tensor cores where it applies (bf16, fp8, int8, int4 at head_dim 64 / 128).
  if (d.kernel == AttentionKernel::kDecode && !holes && decode_attention_mma_supports(d))
    return launch_decode_attention_mma(d, q, out, stream);
  // Quantized pools: the decode kernel dequantizes in registers; the prefill
  // kernels read bf16 only (the plan refuses them for quantized pools).
  if (d.key_element != KvElement::kBF16 || d.value_element != KvElement::kBF16) {
    if (d.kernel != AttentionKernel::kDecode) return cudaErrorInvalidValue;
    return launch_decode_attention_quantized(d, q, out, stream);
  }
  switch (d.kernel) {
    case AttentionKernel::kDecode: return launch_decode_attention(d, q, out, stream);
    case AttentionKernel::kPrefill: return launch_prefill_attention(d, q, out, stream);
    case AttentionKernel::kPrefillSm90: return launch_prefill_attention_sm90(d, q, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pagoda::kernels::cuda
