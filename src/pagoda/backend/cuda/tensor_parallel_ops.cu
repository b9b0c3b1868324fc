// The vocab-parallel embedding gather, the rank-order sum of the same-device communicator and its
// device-side rendezvous.
#include "pagoda/backend/cuda/tensor_parallel_ops.h"

namespace pagoda::cuda {

namespace {

// One thread per 8 consecutive elements of an output row, as embedding_gather.
__global__ void embedding_gather_shard_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ token_ids,
                                              int32_t num_tokens, int32_t hidden, int32_t vocab_begin,
                                              int32_t vocab_end, float* __restrict__ out) {
  const int32_t chunks = hidden / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * chunks) return;
  const int32_t t = static_cast<int32_t>(i / chunks);
  const int32_t c = static_cast<int32_t>(i % chunks);
  const int32_t id = token_ids[t];
  float* dst = out + static_cast<int64_t>(t) * hidden + c * 8;
  if (id < vocab_begin || id >= vocab_end) {
#pragma unroll
    for (int k = 0; k < 8; ++k) dst[k] = 0.0f;
    return;
  }
  const uint4 packed = reinterpret_cast<const uint4*>(table + static_cast<int64_t>(id - vocab_begin) * hidden)[c];
  const bf16* v = reinterpret_cast<const bf16*>(&packed);
#pragma unroll
  for (int k = 0; k < 8; ++k) dst[k] = __bfloat162float(v[k]);
}

__global__ void sum_f32_kernel(RankBuffers buffers, int32_t n, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int32_t r = 0; r < n; ++r) s += static_cast<const float*>(buffers.data[r])[i];
    for (int32_t r = 0; r < n; ++r) static_cast<float*>(buffers.data[r])[i] = s;
  }
}

__global__ void sum_bf16_kernel(RankBuffers buffers, int32_t n, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int32_t r = 0; r < n; ++r) s += __bfloat162float(static_cast<const bf16*>(buffers.data[r])[i]);
    const bf16 rounded = __float2bfloat16_rn(s);
    for (int32_t r = 0; r < n; ++r) static_cast<bf16*>(buffers.data[r])[i] = rounded;
  }
}

__device__ unsigned long long load_volatile(const unsigned long long* p) {
  return *static_cast<const volatile unsigned long long*>(p);
}

__global__ void rank_signal_kernel(unsigned long long* counters, int32_t rank) {
  // The stream's earlier kernels are complete; make their writes visible before the count moves.
  __threadfence();
  atomicAdd(counters + rank, 1ull);
  __threadfence();
}

// Thread r (< n) waits for rank r's count to reach rank 0's.
__global__ void rank_wait_all_kernel(const unsigned long long* counters, int32_t n) {
  const int32_t r = static_cast<int32_t>(threadIdx.x);
  if (r < n) {
    const unsigned long long want = load_volatile(counters);
    while (load_volatile(counters + r) < want) __nanosleep(64);
  }
  __threadfence();
}

__global__ void rank_release_kernel(const unsigned long long* counters, unsigned long long* done) {
  __threadfence();
  atomicExch(done, load_volatile(counters));
  __threadfence();
}

__global__ void rank_wait_done_kernel(const unsigned long long* counters, int32_t rank,
                                      const unsigned long long* done) {
  const unsigned long long want = load_volatile(counters + rank);
  while (load_volatile(done) < want) __nanosleep(64);
  __threadfence();
}

}  // namespace

cudaError_t preload_rank_kernels() {
  cudaFuncAttributes attributes{};
  for (const void* kernel : {reinterpret_cast<const void*>(rank_signal_kernel),
                             reinterpret_cast<const void*>(rank_wait_all_kernel),
                             reinterpret_cast<const void*>(rank_release_kernel),
                             reinterpret_cast<const void*>(rank_wait_done_kernel),
                             reinterpret_cast<const void*>(sum_f32_kernel),
                             reinterpret_cast<const void*>(sum_bf16_kernel)}) {
    const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t rank_signal(unsigned long long* counters, int32_t rank, cudaStream_t stream) {
  rank_signal_kernel<<<1, 1, 0, stream>>>(counters, rank);
  return cudaGetLastError();
}

cudaError_t rank_wait_all(const unsigned long long* counters, int32_t n, cudaStream_t stream) {
  if (n < 1 || n > kMaxRankBuffers) return cudaErrorInvalidValue;
  rank_wait_all_kernel<<<1, 32, 0, stream>>>(counters, n);
  return cudaGetLastError();
}

cudaError_t rank_release(const unsigned long long* counters, unsigned long long* done, cudaStream_t stream) {
  rank_release_kernel<<<1, 1, 0, stream>>>(counters, done);
  return cudaGetLastError();
}

cudaError_t rank_wait_done(const unsigned long long* counters, int32_t rank, const unsigned long long* done,
                           cudaStream_t stream) {
  rank_wait_done_kernel<<<1, 1, 0, stream>>>(counters, rank, done);
  return cudaGetLastError();
}

cudaError_t embedding_gather_shard(const bf16* table, const int32_t* token_ids, int32_t num_tokens, int32_t hidden,
                                   int32_t vocab_begin, int32_t vocab_end, float* out, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(num_tokens) * (hidden / 8);
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  embedding_gather_shard_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      table, token_ids, num_tokens, hidden, vocab_begin, vocab_end, out);
  return cudaGetLastError();
}

cudaError_t sum_in_rank_order(const RankBuffers& buffers, int32_t n, int64_t count, bool bf16_elements,
                              cudaStream_t stream) {
  if (count <= 0 || n <= 0) return cudaSuccess;
  if (n > kMaxRankBuffers) return cudaErrorInvalidValue;
  const int threads = 256;
  const int64_t wanted = (count + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 4096 ? wanted : 4096);
  if (bf16_elements) {
    sum_bf16_kernel<<<blocks, threads, 0, stream>>>(buffers, n, count);
  } else {
    sum_f32_kernel<<<blocks, threads, 0, stream>>>(buffers, n, count);
  }
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
