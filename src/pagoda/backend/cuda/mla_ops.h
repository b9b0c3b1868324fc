#pragma once
// Launchers of the DeepSeek (MLA + MoE) kernels of the CUDA backend, with the
// conventions of cuda_ops.h: each enqueues on `stream`, never synchronizes or
// allocates, reads sizes from host arguments and per-token metadata from device
// arrays, and returns cudaGetLastError() after the launch. Math in f32; the CPU
// references are backend/cpu/mla_attention_layer.cpp, kernels/mla_attention.cpp,
// kernels/mla_latent_write.cpp and kernels/moe_router.cpp.
//
// Rope pairing (model/deepseek_config.h): interleaved rotates (2i, 2i + 1),
// halves (i, i + dim / 2); angle = position * inv_freq[i] in f32, cos and sin
// multiplied by `rope_factor` (yarn's attention factor, else 1).

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

// Whether `layer`'s latent page layout is one its pool can have: token-major always, swizzled pages only
// where runtime::mla_swizzled_pages_apply (bf16, head_dim % 64 == 0, block_size % 8 == 0). Every MLA
// launcher refuses the others (cudaErrorInvalidValue) rather than read a page the wrong way.
inline bool mla_latent_pages_valid(const DevicePagedKvLayer& layer) {
  return layer.latent_pages == runtime::MlaLatentPages::kTokenMajor ||
         runtime::mla_swizzled_pages_apply(layer.head_dim, layer.key_dtype == kernels::KvQuant::kNone,
                                           layer.block_size);
}

// out[r, :] = bf16(weight * y / rms(y)), y = x[r, :] (+ bias), x f32 with row
// stride x_stride; out bf16 contiguous [rows, dim]. DeepSeek's q_a_layernorm.
cudaError_t mla_rmsnorm_f32(const float* x, int64_t x_stride, const float* bias, const float* weight, bf16* out,
                            int32_t rows, int32_t dim, float eps, cudaStream_t stream);

// The latent write: for token t, kv = kv_a[t, :] (f32, [rank + rope], + bias
// when not null); c = rmsnorm(kv[:rank]) * norm_weight (eps), kr = rope(kv[rank:])
// at positions[t]; the vector [c, kr] is stored (bf16 rounded; fp8 as
// runtime/mla_fp8_layout.h's self-contained record, a scale per 128 latent
// values and kr in bf16, no scale pool; int8 / int4 quantized per
// runtime/kv_quant.h, one record per token / per group of 32) at slots[t] of
// the one-head latent pool `layer` (layer.head_dim == rank + rope,
// layer.num_kv_heads == 1). A negative slot skips the token.
// Limits: rank + rope <= 1024, rank and rope even.
cudaError_t mla_latent_write(const float* kv_a, const float* bias, const float* norm_weight, float eps,
                             const int32_t* positions, const int64_t* slots, int32_t num_tokens, int32_t rank,
                             int32_t rope_dim, const float* inv_freq, bool interleaved, float rope_factor,
                             const DevicePagedKvLayer& layer, cudaStream_t stream);

// The rope part of the query: q [T, heads, nope + rope] bf16 (contiguous);
// rope(q[t, h, nope:]) goes to q_absorbed[t, h, rank:rank + rope] (bf16,
// [T, heads, rank + rope]), whose first rank columns the W_UK GEMM fills.
cudaError_t mla_query_rope(const bf16* q, bf16* q_absorbed, const int32_t* positions, int32_t num_tokens,
                           int32_t num_heads, int32_t nope, int32_t rope_dim, int32_t rank, const float* inv_freq,
                           bool interleaved, float rope_factor, cudaStream_t stream);

// Absorbed MLA attention over the paged latent (MQA with K dim rank + rope and
// V dim rank = the first rank latent values): for token t and head h,
//   out[t, h, :] = sum_j softmax_j(q[t, h, :] . L_j * scale) * L_j[:rank]
// over the keys j in [plan.kv_begin[t], plan.kv_end[t]) of t's block table
// (none: zeros). q [T, heads, rank + rope] bf16; out [T, heads, rank] bf16.
// A plain, obviously correct kernel (one thread block per token and group of
// up to 16 heads, f32 tiles in shared memory, online softmax); the new
// tokens' latents must be in the pool. An fp8 pool holds runtime/mla_fp8_layout.h's
// records (rank % 8 == 0). Limits: rank <= 512, rank + rope <= 640.
cudaError_t mla_attention_simple(const bf16* q, const DevicePagedKvLayer& layer, const DeviceAttentionPlan& plan,
                                 int32_t num_heads, int32_t rank, float scale, bf16* out, cudaStream_t stream);

// The tensor-core MLA prefill's kernels (CudaMlaPrefill, cuda_deepseek_mla_prefill.h).
// mla_gather_latent: out[j, :] = the cached vector of key j (j < num_tokens) of the
// one-head latent pool `layer`, through the block table row `block_table`
// (device), as bf16 whatever the pool's format (code x scale + zero rounded once;
// fp8: runtime/mla_fp8_layout.h's records, rank % 8 == 0).
// out bf16 [num_tokens, layer.head_dim]; head_dim % 8 == 0.
cudaError_t mla_gather_latent(const DevicePagedKvLayer& layer, const int32_t* block_table, int32_t num_tokens,
                              int32_t rank, bf16* out, cudaStream_t stream);
// mla_causal_softmax: for head h and row i of scores f32 [num_heads, rows, ld]
// (cols <= ld columns used), probs[h, i, j] = softmax_j(scores[h, i, :visible] *
// scale) for j < visible = min(cols, first_visible + i), 0 for the other j < cols
// (bf16, same layout; columns from cols to ld untouched).
cudaError_t mla_causal_softmax(const float* scores, int32_t num_heads, int32_t rows, int32_t cols, int32_t ld,
                               int32_t first_visible, float scale, bf16* probs, cudaStream_t stream);

// The MoE router of model/deepseek_config.h, one thread per token:
// logits[t, e] = x[t, :] . router[e, :] (x bf16 [T, hidden], router f32
// [experts, hidden]) into the f32 scratch logits [T, experts], then scores,
// groups, top-k and weights exactly as kernels::moe_route: indices / weights
// [T, k]. correction_bias f32 [experts] or null. experts <= 256, k <= 16.
struct MoeRouteParams {
  int32_t num_experts = 0;
  int32_t top_k = 0;
  bool sigmoid = false;      // V3 scoring; else softmax
  int32_t group_score = 0;   // 0 none, 1 max (V2 group_limited_greedy), 2 sum of the top two (V3)
  int32_t num_groups = 1;
  int32_t topk_groups = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};
cudaError_t moe_router_logits(const bf16* x, const float* router, int32_t num_tokens, int32_t hidden,
                              int32_t num_experts, float* logits, cudaStream_t stream);
cudaError_t moe_route(const float* logits, const float* correction_bias, int32_t num_tokens,
                      const MoeRouteParams& params, int32_t* indices, float* weights, cudaStream_t stream);

// Groups the T * k (token, choice) pairs by expert, in token order within an
// expert (one thread block; T * k <= 1 << 20): offsets [experts + 1] (device),
// position[t * k + i] = the row of pair (t, i) in the grouped order.
cudaError_t moe_group_by_expert(const int32_t* indices, int32_t num_tokens, int32_t top_k, int32_t num_experts,
                                int32_t* offsets, int32_t* position, cudaStream_t stream);

// rows[position[p], :] = x[p / k, :] (bf16 [T, hidden] -> [T * k, hidden]).
cudaError_t moe_permute(const bf16* x, const int32_t* position, int32_t num_tokens, int32_t top_k, int32_t hidden,
                        bf16* rows, cudaStream_t stream);

// The expert GEMMs of a grouped MoE without a host synchronization: for every
// expert e, rows [offsets[e], offsets[e + 1]) of x (bf16 [*, k]) times w_e^T
// into the same rows of y (bf16 [*, n]), w_e = w + e * n * k ([n, k] row-major),
// f32 accumulation. offsets is a device array (moe_group_by_expert's), so the
// launch is graph-capturable; experts without rows cost a CTA that exits.
// Needs moe_grouped_gemm_supported(n, k): n even, k a multiple of 8 (16-byte rows).
bool moe_grouped_gemm_supported(int32_t n, int32_t k);
cudaError_t moe_grouped_gemm(const int32_t* offsets, int32_t num_experts, const bf16* x, const bf16* w, int32_t n,
                             int32_t k, bf16* y, cudaStream_t stream);

// out[t, :] = bf16(sum_i weights[t, i] * expert_out[position[t * k + i], :] + shared[t, :]),
// summed in f32 in choice order; shared bf16 [T, hidden] or null.
cudaError_t moe_unpermute(const bf16* expert_out, const int32_t* position, const float* weights, const bf16* shared,
                          int32_t num_tokens, int32_t top_k, int32_t hidden, bf16* out, cudaStream_t stream);

// x[i] = uniform element i of model/random_weights.h's stream, kept in f32
// (the router of a random DeepSeek model, as the CPU makes it).
cudaError_t fill_random_f32(float* x, int64_t n, float low, float high, uint64_t stream_seed, cudaStream_t stream);

}  // namespace pagoda::cuda
