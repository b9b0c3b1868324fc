// Embedding gather: one thread per 8 consecutive elements of an output row.
#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

namespace {

__global__ void embedding_gather_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ token_ids,
                                        int32_t num_tokens, int32_t hidden, float* __restrict__ out) {
  const int32_t chunks = hidden / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * chunks) return;
  const int32_t t = static_cast<int32_t>(i / chunks);
  const int32_t c = static_cast<int32_t>(i % chunks);
  const uint4 packed = reinterpret_cast<const uint4*>(table + static_cast<int64_t>(token_ids[t]) * hidden)[c];
  const bf16* v = reinterpret_cast<const bf16*>(&packed);
  float* dst = out + static_cast<int64_t>(t) * hidden + c * 8;
#pragma unroll
  for (int k = 0; k < 8; ++k) dst[k] = __bfloat162float(v[k]);
}

}  // namespace

cudaError_t embedding_gather(const bf16* table, const int32_t* token_ids, int32_t num_tokens,
                             int32_t hidden, float* out, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(num_tokens) * (hidden / 8);
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  embedding_gather_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      table, token_ids, num_tokens, hidden, out);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
