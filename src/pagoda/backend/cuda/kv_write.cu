// KV write into the paged pool: one thread per 16-byte chunk of a (token, kv head)
// vector, K and V together.
#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

namespace {

__global__ void kv_write_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t row_stride,
                                const int64_t* __restrict__ slots, int32_t num_tokens, bf16* __restrict__ key,
                                bf16* __restrict__ value, int32_t num_kv_heads, int32_t head_dim) {
  const int32_t chunks_per_row = num_kv_heads * head_dim / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * chunks_per_row) return;
  const int64_t t = i / chunks_per_row;
  const int32_t c = static_cast<int32_t>(i % chunks_per_row);
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t dst = slot * num_kv_heads * head_dim / 8 + c;  // in 16-byte chunks
  reinterpret_cast<uint4*>(key)[dst] = reinterpret_cast<const uint4*>(k + t * row_stride)[c];
  reinterpret_cast<uint4*>(value)[dst] = reinterpret_cast<const uint4*>(v + t * row_stride)[c];
}

}  // namespace

cudaError_t kv_write(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots, int32_t num_tokens,
                     const DevicePagedKvLayer& layer, cudaStream_t stream) {
  if (layer.head_dim % 8 != 0 || row_stride % 8 != 0) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(num_tokens) * layer.num_kv_heads * layer.head_dim / 8;
  if (n == 0) return cudaSuccess;
  kv_write_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      k, v, row_stride, slots, num_tokens, layer.key, layer.value, layer.num_kv_heads, layer.head_dim);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
