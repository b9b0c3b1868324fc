// Rotary embedding: one CTA per token, each thread one rotary pair of a head per pass over the token's
// heads, so a pair's sine and cosine are computed once per token instead of once per head, and no thread
// divides 64-bit indices (the one-thread-per-(token, head, pair) kernel spent most of its time on both:
// 150 us for 8K tokens of 40 heads). sincosf (not the fast intrinsics): angles reach position * 1 radian,
// where __sinf loses accuracy. Few tokens (decode at small batch): the passes over the heads are spread
// over grid.y instead, one pass per CTA, so that one token's 40 heads are not 10 dependent passes of a
// single CTA.
#include <algorithm>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/pdl.cuh"
#include "pagoda/backend/cuda/rope_pair.cuh"

namespace pagoda::cuda {

namespace {

constexpr int32_t kRopeThreads = 256;
constexpr int32_t kSpreadBelowTokens = 64;  // fewer tokens than this: one pass of heads per CTA (grid.y)

// q_out != nullptr: heads h < q_heads are also written to q_out [num_tokens, q_heads * 2 * half].
// blockDim.x = half * heads_per_pass (heads_per_pass >= 1); CTA (t, y) rotates heads y * heads_per_pass + i,
// stepping heads_per_pass * gridDim.y.
__global__ void rope_kernel(bf16* __restrict__ x, int64_t row_stride, const int32_t* __restrict__ positions,
                            int32_t num_heads, int32_t half, const float* __restrict__ inv_freq,
                            bf16* __restrict__ q_out, int32_t q_heads) {
  const int64_t t = blockIdx.x;
  const int32_t pair = static_cast<int32_t>(threadIdx.x) % half;
  const int32_t heads_per_pass = static_cast<int32_t>(blockDim.x) / half;
  const int32_t first_head =
      static_cast<int32_t>(blockIdx.y) * heads_per_pass + static_cast<int32_t>(threadIdx.x) / half;
  const int32_t head_step = heads_per_pass * static_cast<int32_t>(gridDim.y);
  // Positions and frequencies are the step's inputs, written before the step's first kernel: the angle
  // is computed while the kernel ahead (a programmatic launch, pdl.cuh) may still run.
  const float angle = static_cast<float>(positions[t]) * inv_freq[pair];
  float s, c;
  sincosf(angle, &s, &c);
  pdl_wait();
  pdl_launch_dependents();
  bf16* row = x + t * row_stride;
  // Unrolled: one token's heads are independent, so several passes' loads are in flight at once (a large
  // batch's decode runs one CTA per token through ten passes of 4 heads).
#pragma unroll 4
  for (int32_t h = first_head; h < num_heads; h += head_step) {
    bf16* v = row + static_cast<int64_t>(h) * 2 * half;
    const float a = __bfloat162float(v[pair]);
    const float b = __bfloat162float(v[pair + half]);
    bf16 lo, hi;
    rope_pair(a, b, s, c, lo, hi);
    v[pair] = lo;
    v[pair + half] = hi;
    if (q_out != nullptr && h < q_heads) {
      bf16* o = q_out + (t * q_heads + h) * 2 * half;
      o[pair] = lo;
      o[pair + half] = hi;
    }
  }
}

cudaError_t launch_rope(bf16* x, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t heads,
                        int32_t head_dim, const float* inv_freq, bf16* q_out, int32_t q_heads, cudaStream_t stream) {
  const int32_t half = head_dim / 2;
  if (num_tokens == 0 || heads == 0 || half == 0) return cudaSuccess;
  if (half > kRopeThreads) return cudaErrorInvalidValue;
  const int32_t heads_per_pass = std::max(1, std::min(heads, kRopeThreads / half));
  const int32_t passes = (heads + heads_per_pass - 1) / heads_per_pass;
  const int32_t head_groups = num_tokens < kSpreadBelowTokens ? passes : 1;
  return launch_pdl(rope_kernel, dim3(static_cast<unsigned>(num_tokens), static_cast<unsigned>(head_groups)),
                    dim3(half * heads_per_pass), 0, stream,
                    x, row_stride, positions, heads, half, inv_freq, q_out, q_heads);
}

}  // namespace

cudaError_t rope(bf16* x, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t num_heads,
                 int32_t head_dim, const float* inv_freq, cudaStream_t stream) {
  return launch_rope(x, row_stride, positions, num_tokens, num_heads, head_dim, inv_freq, nullptr, 0, stream);
}

cudaError_t rope_qk(bf16* qkv, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t num_q_heads,
                    int32_t num_kv_heads, int32_t head_dim, const float* inv_freq, bf16* q_out, cudaStream_t stream) {
  return launch_rope(qkv, row_stride, positions, num_tokens, num_q_heads + num_kv_heads, head_dim, inv_freq, q_out,
                     num_q_heads, stream);
}

}  // namespace pagoda::cuda
