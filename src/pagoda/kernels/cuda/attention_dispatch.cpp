// launch_paged_attention: the one entry point; the plan already chose the kernel.
#include "pagoda/kernels/cuda/attention_kernels.h"
#include "pagoda/kernels/cuda/attention_launch_internal.h"

namespace pagoda::kernels::cuda {

cudaError_t prepare_paged_attention_kernels() {
  cudaError_t err = prepare_decode_attention();
  if (err == cudaSuccess) err = prepare_prefill_attention();
  if (err == cudaSuccess) err = prepare_prefill_attention_sm90();
  return err;
}

cudaError_t launch_paged_attention(const AttentionDescriptor& d, const void* q, void* out,
                                   cudaStream_t stream) {
  // TODO(issue 7, quantized KV): dequantize fp8/int8/int4 in registers with the scale pools.
  if (d.kv_element != KvElement::kBF16) return cudaErrorInvalidValue;
  switch (d.kernel) {
    case AttentionKernel::kDecode: return launch_decode_attention(d, q, out, stream);
    case AttentionKernel::kPrefill: return launch_prefill_attention(d, q, out, stream);
    case AttentionKernel::kPrefillSm90: return launch_prefill_attention_sm90(d, q, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pagoda::kernels::cuda
