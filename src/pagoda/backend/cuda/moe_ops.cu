// The MoE kernels of mla_ops.h: router logits (one warp per token and
// expert), the routing decision (one thread per token, the CPU's
// kernels::moe_route step for step: repeated selection of the best remaining
// value, lower index first on ties, NaN lowest, which is the CPU's partial sort
// order), grouping by expert (one thread block: counts by shared-memory
// atomics, a prefix sum, positions), and the permute / weighted un-permute
// copies. The order of the rows inside an expert's group follows the atomics
// and is not fixed, but every row of a GEMM is computed on its own, so the
// results do not depend on it.
#include <cmath>

#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/model/random_weights.h"

namespace pagoda::cuda {

namespace {

constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;
constexpr int kMaxGroups = 64;
constexpr int kGroupThreads = 1024;

__global__ void router_logits_kernel(const bf16* __restrict__ x, const float* __restrict__ router, int32_t num_tokens,
                                     int32_t hidden, int32_t num_experts, float* __restrict__ logits) {
  const int64_t pair = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= static_cast<int64_t>(num_tokens) * num_experts) return;
  const int64_t t = pair / num_experts;
  const int64_t e = pair % num_experts;
  const bf16* xr = x + t * hidden;
  const float* wr = router + e * hidden;
  float sum = 0.0f;
  for (int i = lane; i < hidden; i += 32) sum = fmaf(__bfloat162float(xr[i]), wr[i], sum);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) logits[pair] = sum;
}

__device__ __forceinline__ float rank_key(float v) { return isnan(v) ? -INFINITY : v; }

// Index of the best value among values[i] with allowed(i) and not taken(i); -1 when none.
template <typename Allowed>
__device__ int best_index(const float* values, int n, Allowed allowed) {
  int best = -1;
  float best_key = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (!allowed(i)) continue;
    const float k = rank_key(values[i]);
    if (best < 0 || k > best_key) {  // strict: ties keep the lower index
      best = i;
      best_key = k;
    }
  }
  return best;
}

__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ correction_bias,
                             int32_t num_tokens, MoeRouteParams p, int32_t* __restrict__ indices,
                             float* __restrict__ weights) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_tokens) return;
  const int E = p.num_experts, K = p.top_k;
  const float* x = logits + t * E;
  float scores[kMaxExperts], choice[kMaxExperts];
  if (!p.sigmoid) {
    float mx = x[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, x[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      scores[e] = expf(x[e] - mx);
      sum += scores[e];
    }
    for (int e = 0; e < E; ++e) scores[e] /= sum;
  } else {
    for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + expf(-x[e]));
  }
  for (int e = 0; e < E; ++e) choice[e] = scores[e] + (correction_bias != nullptr ? correction_bias[e] : 0.0f);

  bool group_allowed[kMaxGroups];
  const int G = p.group_score != 0 ? p.num_groups : 1;
  const int group_size = E / G;
  for (int g = 0; g < G; ++g) group_allowed[g] = true;
  if (p.group_score != 0) {
    float group_values[kMaxGroups];
    for (int g = 0; g < G; ++g) {
      const float* first = choice + g * group_size;
      if (p.group_score == 1) {
        float m = first[0];
        for (int i = 1; i < group_size; ++i) m = fmaxf(m, first[i]);
        group_values[g] = m;
      } else {
        float best = -INFINITY, second = -INFINITY;
        for (int i = 0; i < group_size; ++i) {
          if (first[i] > best) {
            second = best;
            best = first[i];
          } else if (first[i] > second) {
            second = first[i];
          }
        }
        group_values[g] = best + second;
      }
    }
    bool picked_group[kMaxGroups];
    for (int g = 0; g < G; ++g) {
      picked_group[g] = false;
      group_allowed[g] = false;
    }
    for (int r = 0; r < p.topk_groups && r < G; ++r) {
      const int g = best_index(group_values, G, [&](int i) { return !picked_group[i]; });
      if (g < 0) break;
      picked_group[g] = true;
      group_allowed[g] = true;
    }
  }
  int picked[kMaxTopK];
  bool taken[kMaxExperts];
  for (int e = 0; e < E; ++e) taken[e] = false;
  for (int i = 0; i < K; ++i) {
    int e = best_index(choice, E, [&](int j) { return !taken[j] && group_allowed[j / group_size]; });
    if (e < 0) e = 0;  // fewer allowed experts than k: a config the loader refuses
    taken[e] = true;
    picked[i] = e;
  }
  float sum = 0.0f;
  for (int i = 0; i < K; ++i) sum += scores[picked[i]];
  for (int i = 0; i < K; ++i) {
    indices[t * K + i] = picked[i];
    float w = scores[picked[i]];
    if (p.norm_topk_prob) w = w / (sum + 1e-20f);
    weights[t * K + i] = w * p.routed_scaling_factor;
  }
}

__global__ void __launch_bounds__(kGroupThreads)
    group_kernel(const int32_t* __restrict__ indices, int32_t pairs, int32_t num_experts, int32_t* __restrict__ offsets,
                 int32_t* __restrict__ position) {
  __shared__ int32_t counts[kMaxExperts + 1];
  for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) position[p] = atomicAdd(&counts[indices[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t running = 0;
    for (int e = 0; e < num_experts; ++e) {
      const int32_t c = counts[e];
      counts[e] = running;
      offsets[e] = running;
      running += c;
    }
    offsets[num_experts] = running;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) position[p] += counts[indices[p]];
}

__global__ void permute_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ position, int32_t pairs,
                               int32_t top_k, int32_t chunks_per_row, bf16* __restrict__ rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(pairs) * chunks_per_row) return;
  const int64_t p = i / chunks_per_row;
  const int64_t c = i % chunks_per_row;
  const int64_t t = p / top_k;
  reinterpret_cast<uint4*>(rows)[position[p] * static_cast<int64_t>(chunks_per_row) + c] =
      reinterpret_cast<const uint4*>(x)[t * chunks_per_row + c];
}

__global__ void unpermute_kernel(const bf16* __restrict__ expert_out, const int32_t* __restrict__ position,
                                 const float* __restrict__ weights, const bf16* __restrict__ shared, int32_t top_k,
                                 int32_t hidden, bf16* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float sum = 0.0f;
    for (int k = 0; k < top_k; ++k) {
      const int64_t row = position[t * top_k + k];
      sum = fmaf(weights[t * top_k + k], __bfloat162float(expert_out[row * hidden + i]), sum);
    }
    if (shared != nullptr) sum += __bfloat162float(shared[t * hidden + i]);
    out[t * hidden + i] = __float2bfloat16(sum);
  }
}

__global__ void fill_random_f32_kernel(float* x, int64_t n, float low, float high, uint64_t stream_seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = random_uniform_element(stream_seed, static_cast<uint64_t>(i), low, high);
}

}  // namespace

cudaError_t moe_router_logits(const bf16* x, const float* router, int32_t num_tokens, int32_t hidden,
                              int32_t num_experts, float* logits, cudaStream_t stream) {
  const int64_t threads = static_cast<int64_t>(num_tokens) * num_experts * 32;
  if (threads == 0) return cudaSuccess;
  router_logits_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(x, router, num_tokens, hidden,
                                                                                       num_experts, logits);
  return cudaGetLastError();
}

cudaError_t moe_route(const float* logits, const float* correction_bias, int32_t num_tokens,
                      const MoeRouteParams& params, int32_t* indices, float* weights, cudaStream_t stream) {
  if (params.num_experts <= 0 || params.num_experts > kMaxExperts || params.top_k <= 0 || params.top_k > kMaxTopK ||
      params.top_k > params.num_experts || (params.group_score != 0 && (params.num_groups <= 0 ||
                                                                        params.num_groups > kMaxGroups ||
                                                                        params.num_experts % params.num_groups != 0)))
    return cudaErrorInvalidValue;
  if (num_tokens <= 0) return cudaSuccess;
  route_kernel<<<(num_tokens + 63) / 64, 64, 0, stream>>>(logits, correction_bias, num_tokens, params, indices,
                                                          weights);
  return cudaGetLastError();
}

cudaError_t moe_group_by_expert(const int32_t* indices, int32_t num_tokens, int32_t top_k, int32_t num_experts,
                                int32_t* offsets, int32_t* position, cudaStream_t stream) {
  if (num_experts <= 0 || num_experts > kMaxExperts) return cudaErrorInvalidValue;
  group_kernel<<<1, kGroupThreads, 0, stream>>>(indices, num_tokens * top_k, num_experts, offsets, position);
  return cudaGetLastError();
}

cudaError_t moe_permute(const bf16* x, const int32_t* position, int32_t num_tokens, int32_t top_k, int32_t hidden,
                        bf16* rows, cudaStream_t stream) {
  if (hidden % 8 != 0) return cudaErrorInvalidValue;
  const int32_t chunks = hidden / 8;
  const int64_t n = static_cast<int64_t>(num_tokens) * top_k * chunks;
  if (n == 0) return cudaSuccess;
  permute_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, position, num_tokens * top_k, top_k,
                                                                            chunks, rows);
  return cudaGetLastError();
}

cudaError_t moe_unpermute(const bf16* expert_out, const int32_t* position, const float* weights, const bf16* shared,
                          int32_t num_tokens, int32_t top_k, int32_t hidden, bf16* out, cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  unpermute_kernel<<<num_tokens, 256, 0, stream>>>(expert_out, position, weights, shared, top_k, hidden, out);
  return cudaGetLastError();
}

cudaError_t fill_random_f32(float* x, int64_t n, float low, float high, uint64_t stream_seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fill_random_f32_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, n, low, high, stream_seed);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
