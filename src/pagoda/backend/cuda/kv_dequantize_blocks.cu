// Dequantizing listed blocks of a quantized KV layer into a bf16 scratch pool,
// so that the bf16 tensor-core prefill kernels can attend over quantized KV.
// One thread per 8-element chunk of a (slot, kv head) vector, K and V
// together: the read is 8 (fp8 / int8) or 4 (int4) bytes of codes plus a
// 4-byte scale record, the write one 16-byte store. The values are
// code * scale + zero rounded once to bf16, exactly as the builtin attention
// kernel (paged_attention.cu) dequantizes into shared memory.
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/kv_chunk_bf16.cuh"

namespace pagoda::cuda {

namespace {

__global__ void kv_dequantize_blocks_kernel(DevicePagedKvLayer layer, const int32_t* __restrict__ source_blocks,
                                            int32_t num_blocks, bf16* __restrict__ key_out,
                                            bf16* __restrict__ value_out) {
  const int32_t chunks = layer.head_dim / 8;
  const int64_t per_block = int64_t{layer.block_size} * layer.num_kv_heads * chunks;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= per_block * num_blocks) return;
  const int64_t scratch_block = i / per_block;
  const int64_t within = i % per_block;  // (slot, head, chunk) inside the block
  const int32_t c = static_cast<int32_t>(within % chunks);
  const int64_t vec_in_block = within / chunks;  // slot * num_kv_heads + head
  const int64_t source = source_blocks[scratch_block];
  const int64_t vec = source * layer.block_size * layer.num_kv_heads + vec_in_block;
  const int32_t head = static_cast<int32_t>(vec_in_block % layer.num_kv_heads);
  const int64_t scale_vec = kernels::kv_scale_vector(source * layer.block_size + vec_in_block / layer.num_kv_heads,
                                                     head, layer.block_size, layer.num_kv_heads);
  const int64_t dst = (scratch_block * layer.block_size * layer.num_kv_heads + vec_in_block) * chunks + c;
  reinterpret_cast<uint4*>(key_out)[dst] =
      load_kv_chunk_bf16(layer.key, layer.key_scale, layer.key_dtype, vec, scale_vec, layer.head_dim, c);
  reinterpret_cast<uint4*>(value_out)[dst] =
      load_kv_chunk_bf16(layer.value, layer.value_scale, layer.value_dtype, vec, scale_vec, layer.head_dim, c);
}

}  // namespace

cudaError_t kv_dequantize_blocks(const DevicePagedKvLayer& layer, const int32_t* source_blocks, int32_t num_blocks,
                                 bf16* key_out, bf16* value_out, cudaStream_t stream) {
  if (num_blocks <= 0) return cudaSuccess;
  if (layer.head_dim % 8 != 0) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  const int64_t total = int64_t{num_blocks} * layer.block_size * layer.num_kv_heads * (layer.head_dim / 8);
  const int64_t grid = (total + kThreads - 1) / kThreads;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  kv_dequantize_blocks_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(layer, source_blocks, num_blocks,
                                                                                 key_out, value_out);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
