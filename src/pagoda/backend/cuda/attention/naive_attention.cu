// The naive GPU reference for paged attention: one CTA per (query token, query
// head), plain f32 math with every score kept in shared memory, three passes
// (scores, softmax, weighted sum of V). Slow on purpose and easy to check by
// eye; the fast kernels are tested against it and against the CPU. Quantized
// pools are read one element at a time (code x scale + zero).

#include <cuda_bf16.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/kv_dequant.cuh"

namespace pagoda::kernels::cuda {
namespace {

constexpr int kNaiveThreads = 128;
constexpr int kNaiveMaxKv = 12000;

__device__ float block_reduce(float v, float* scratch, bool is_max) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kNaiveThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

// Element i of the vector of position pos (kv head kv_head) in one pool.
__device__ float kv_element_at(const void* pool, const void* scales, KvElement element, const AttentionDescriptor& d,
                               const int32_t* table, int pos, int kv_head, int i) {
  const int block = table[pos / d.block_size];
  if (element == KvElement::kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(pool)[int64_t{block} * d.block_stride +
                                                                     int64_t{pos % d.block_size} * d.token_stride +
                                                                     int64_t{kv_head} * d.head_dim + i]);
  }
  const auto format = static_cast<KvQuant>(element);
  const int64_t vec = (int64_t{block} * d.block_size + pos % d.block_size) * d.num_kv_heads + kv_head;
  const auto* codes = static_cast<const uint8_t*>(pool) + vec * kv_head_data_bytes(d.head_dim, format);
  const int64_t scale_vec = kv_scale_vector(int64_t{block} * d.block_size + pos % d.block_size, kv_head, d.block_size,
                                            d.num_kv_heads);
  const uint32_t record = static_cast<const uint32_t*>(scales)[scale_vec * kv_scale_groups(d.head_dim, format) +
                                                               i / kv_scale_group_size(d.head_dim, format)];
  const device::KvScale s = device::decode_scale_record(record, format);
  float code;
  if (format == KvQuant::kInt4) {
    code = static_cast<float>((codes[i / 2] >> ((i & 1) * 4)) & 0xf);
  } else if (format == KvQuant::kInt8) {
    code = static_cast<float>(codes[i]);
  } else {
    float four[4];
    device::fp8x4_to_float(codes[i], four);
    code = four[0];
  }
  return code * s.scale + s.zero;
}

__global__ void naive_attention_kernel(const AttentionDescriptor d, const __nv_bfloat16* q,
                                       __nv_bfloat16* out) {
  extern __shared__ float shared[];
  float* q_row = shared;                // [head_dim]
  float* scratch = q_row + d.head_dim;  // [warps]
  float* scores = scratch + kNaiveThreads / 32;

  const int token = blockIdx.x;
  const int q_head = blockIdx.y;
  int lo = 0, hi = d.num_sequences - 1;  // last sequence whose query_start <= token
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (d.query_start[mid] <= token) lo = mid; else hi = mid - 1;
  }
  const int sequence = lo;
  const int num_new = d.query_start[sequence + 1] - d.query_start[sequence];
  const int position = d.kv_length[sequence] - num_new + (token - d.query_start[sequence]);
  const int num_keys = position + 1;
  const int kv_head = q_head / (d.num_q_heads / d.num_kv_heads);
  const int32_t* table = d.block_tables + d.block_table_start[sequence];
  for (int i = threadIdx.x; i < d.head_dim; i += blockDim.x)
    q_row[i] = __bfloat162float(q[(int64_t{token} * d.num_q_heads + q_head) * d.head_dim + i]);
  __syncthreads();

  float local_max = -INFINITY;
  for (int pos = threadIdx.x; pos < num_keys; pos += blockDim.x) {
    float dot = 0.0f;
    for (int i = 0; i < d.head_dim; ++i)
      dot += q_row[i] * kv_element_at(d.key, d.key_scale, d.key_element, d, table, pos, kv_head, i);
    scores[pos] = dot * d.scale;
    local_max = fmaxf(local_max, scores[pos]);
  }
  const float max_score = block_reduce(local_max, scratch, true);
  float local_sum = 0.0f;
  for (int pos = threadIdx.x; pos < num_keys; pos += blockDim.x) {
    scores[pos] = expf(scores[pos] - max_score);
    local_sum += scores[pos];
  }
  const float sum = block_reduce(local_sum, scratch, false);
  __syncthreads();
  for (int col = threadIdx.x; col < d.head_dim; col += blockDim.x) {
    float acc = 0.0f;
    for (int pos = 0; pos < num_keys; ++pos)
      acc += scores[pos] * kv_element_at(d.value, d.value_scale, d.value_element, d, table, pos, kv_head, col);
    out[(int64_t{token} * d.num_q_heads + q_head) * d.head_dim + col] = __float2bfloat16(acc / sum);
  }
}

}  // namespace

cudaError_t launch_naive_paged_attention(const AttentionDescriptor& d, const void* q, void* out,
                                         int max_kv_length, cudaStream_t stream) {
  if (max_kv_length < 1 || max_kv_length > kNaiveMaxKv) return cudaErrorInvalidValue;
  if ((d.key_element != KvElement::kBF16 && d.key_scale == nullptr) ||
      (d.value_element != KvElement::kBF16 && d.value_scale == nullptr))
    return cudaErrorInvalidValue;
  const size_t smem = (d.head_dim + kNaiveThreads / 32 + max_kv_length) * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(naive_attention_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  naive_attention_kernel<<<dim3(d.num_tokens, d.num_q_heads), kNaiveThreads, smem, stream>>>(
      d, static_cast<const __nv_bfloat16*>(q), static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace pagoda::kernels::cuda
