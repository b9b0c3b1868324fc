// Greedy sampling on the GPU: one block per row, (value, index) reduction that
// keeps the first index on ties like torch.argmax.
#include <cfloat>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

namespace {

__device__ void keep_better(float& best, int32_t& best_index, float value, int32_t index) {
  if (value > best || (value == best && index < best_index)) {
    best = value;
    best_index = index;
  }
}

__global__ void argmax_kernel(const float* __restrict__ logits, int32_t cols, int32_t* __restrict__ out) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  float best = -FLT_MAX;
  int32_t best_index = INT32_MAX;
  for (int32_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = row[i];
    if (!isnan(v)) keep_better(best, best_index, v, i);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    keep_better(best, best_index, other, other_index);
  }
  __shared__ float warp_best[32];
  __shared__ int32_t warp_index[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_index[warp] = best_index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) keep_better(best, best_index, warp_best[w], warp_index[w]);
    out[blockIdx.x] = best_index == INT32_MAX ? 0 : best_index;
  }
}

}  // namespace

cudaError_t argmax_rows(const float* logits, int32_t rows, int32_t cols, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  argmax_kernel<<<rows, 1024, 0, stream>>>(logits, cols, out);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
