// Dequantizing listed blocks of a quantized KV layer into a bf16 scratch pool,
// so that the bf16 tensor-core prefill kernels can attend over quantized KV.
// One thread per 8-element chunk of a (slot, kv head) vector, K and V
// together: the read is 8 (fp8 / int8) or 4 (int4) bytes of codes plus a
// 4-byte scale record, the write one 16-byte store. The values are
// code * scale + zero rounded once to bf16, exactly as the builtin attention
// kernel (paged_attention.cu) dequantizes into shared memory.
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/kernels/cuda/kv_dequant.cuh"

namespace pagoda::cuda {

namespace {

using kernels::KvQuant;

// Elements [8 c, 8 c + 8) of vector `vec` of a pool in `format` as 16 bytes of bf16.
__device__ __forceinline__ uint4 dequantize_chunk(const void* pool, const void* scales, KvQuant format, int64_t vec,
                                                  int32_t head_dim, int32_t c) {
  if (format == KvQuant::kNone)
    return reinterpret_cast<const uint4*>(static_cast<const bf16*>(pool) + vec * head_dim)[c];
  const uint8_t* data = static_cast<const uint8_t*>(pool) + vec * kernels::kv_head_data_bytes(head_dim, format);
  float f[8];
  kernels::cuda::device::codes8_to_float(data, c * 8, format, f);
  const int32_t groups = kernels::kv_scale_groups(head_dim, format);
  const int32_t group = c * 8 / kernels::kv_scale_group_size(head_dim, format);
  const kernels::cuda::device::KvScale s = kernels::cuda::device::decode_scale_record(
      static_cast<const uint32_t*>(scales)[vec * groups + group], format);
  uint4 out;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int w = 0; w < 4; ++w)
    pairs[w] = __floats2bfloat162_rn(f[2 * w] * s.scale + s.zero, f[2 * w + 1] * s.scale + s.zero);
  return out;
}

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
  const int64_t dst = (scratch_block * layer.block_size * layer.num_kv_heads + vec_in_block) * chunks + c;
  reinterpret_cast<uint4*>(key_out)[dst] =
      dequantize_chunk(layer.key, layer.key_scale, layer.key_dtype, vec, layer.head_dim, c);
  reinterpret_cast<uint4*>(value_out)[dst] =
      dequantize_chunk(layer.value, layer.value_scale, layer.value_dtype, vec, layer.head_dim, c);
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
