#pragma once
// One rotate-half rotary pair (a at i, b at i + head_dim / 2) at the angle's sine s and cosine c, rounded to
// bf16: (a c - b s, b c + a s). Shared by rope.cu and the fused rope + KV write (kv_write.cu) so that both
// round the same products in the same way (their results are compared bit for bit).
#include <cuda_bf16.h>

namespace pagoda::cuda {

__device__ __forceinline__ void rope_pair(float a, float b, float s, float c, __nv_bfloat16& lo, __nv_bfloat16& hi) {
  lo = __float2bfloat16(a * c - b * s);
  hi = __float2bfloat16(b * c + a * s);
}

}  // namespace pagoda::cuda
