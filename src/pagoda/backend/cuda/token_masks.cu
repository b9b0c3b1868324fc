// Structured outputs on the GPU: a constrained row's disallowed tokens become -inf before the
// sampler reads the row, so the row is drawn on the device like any other and its logits never
// cross PCIe (sampling.h, apply_token_masks).

#include <algorithm>
#include <cmath>

#include "pagoda/backend/cuda/sampling.h"

namespace pagoda::cuda {
namespace {

// Grid: x strides over the vocabulary, y = the masked row. Each thread owns one token; the 64
// threads of a mask word read the same word (one L1 line per warp pair).
__global__ void apply_token_masks_kernel(float* logits, int32_t vocab, int32_t words, const int32_t* rows,
                                         const uint64_t* masks) {
  const int32_t k = static_cast<int32_t>(blockIdx.y);
  float* row = logits + static_cast<size_t>(rows[k]) * static_cast<size_t>(vocab);
  const uint64_t* mask = masks + static_cast<size_t>(k) * static_cast<size_t>(words);
  for (int32_t t = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x); t < vocab;
       t += static_cast<int32_t>(gridDim.x * blockDim.x)) {
    if (((mask[t >> 6] >> (t & 63)) & 1) == 0) row[t] = -INFINITY;
  }
}

}  // namespace

cudaError_t apply_token_masks(float* logits, int32_t vocab, const int32_t* rows, const uint64_t* masks,
                              int32_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (vocab <= 0 || count < 0 || count > 65535) return cudaErrorInvalidValue;
  constexpr int32_t kThreads = 256;
  const int32_t words = (vocab + 63) / 64;
  const int32_t blocks_x = std::min<int32_t>((vocab + kThreads - 1) / kThreads, 32);
  apply_token_masks_kernel<<<dim3(blocks_x, count), kThreads, 0, stream>>>(logits, vocab, words, rows, masks);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
