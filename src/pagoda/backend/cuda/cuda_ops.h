#pragma once
// Launchers of the CUDA backend's fused kernels (the GEMMs live in gemm.h, the
// paged attention in attention/, driven through fast_attention.h). Every launcher enqueues on
// `stream`, never synchronizes, never allocates, and reads its sizes from host
// arguments and its per-token metadata from device arrays, so a whole forward
// can be captured in a CUDA graph. Each returns cudaGetLastError() after the
// launch (cudaSuccess when there was nothing to do).
//
// Conventions: "bf16" tensors are __nv_bfloat16, "f32" are float; all math is
// f32 and rounds to bf16 once on store. Matrices are row-major; a row_stride
// (in elements) lets a kernel work on a column slice of a wider matrix, e.g.
// the q, k or v part of the fused qkv projection output. Every op has a CPU
// reference in backend/cpu/kernels and a comparison test in tests/gpu_backend.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "pagoda/runtime/kv_quant.h"
#include "pagoda/runtime/mla_latent_layout.h"

namespace pagoda::cuda {

using bf16 = __nv_bfloat16;

// out[t, :] = table[token_ids[t], :] as f32. table [vocab, hidden] bf16;
// token_ids [num_tokens] (device); out [num_tokens, hidden] f32. hidden % 8 == 0.
cudaError_t embedding_gather(const bf16* table, const int32_t* token_ids, int32_t num_tokens,
                             int32_t hidden, float* out, cudaStream_t stream);

// out[r, :] = bf16(weight * x[src, :] / rms(x[src, :])), src = row_index ? row_index[r] : r.
// x f32 [*, dim]; weight f32 [dim]; out bf16 [rows, dim]. row_index (device, may be
// null) gathers rows, so the final norm runs only on rows that need logits.
cudaError_t rmsnorm(const float* x, const int32_t* row_index, const float* weight, bf16* out,
                    int32_t rows, int32_t dim, float eps, cudaStream_t stream);

// residual += delta (when delta != null), then out = bf16(weight * rmsnorm(residual)).
// residual f32 [rows, dim] (updated in place); delta bf16 [rows, dim].
cudaError_t add_rmsnorm(float* residual, const bf16* delta, const float* weight, bf16* out,
                        int32_t rows, int32_t dim, float eps, cudaStream_t stream);

// residual[i] += delta[i] for i < n.
cudaError_t add_residual(float* residual, const bf16* delta, int64_t n, cudaStream_t stream);

// Qwen3 q/k norm: every head vector x[t, h * head_dim .. +head_dim) (row stride
// row_stride) is RMS-normalized and scaled by weight [head_dim], in place.
cudaError_t head_rmsnorm(bf16* x, int64_t row_stride, int32_t num_tokens, int32_t num_heads,
                         int32_t head_dim, const float* weight, float eps, cudaStream_t stream);

// Rotary embedding in place ("rotate half"): element i < head_dim/2 of every head
// pairs with i + head_dim/2, angle = positions[t] * inv_freq[i] (f32 product, as
// the CPU kernel and transformers). inv_freq [head_dim/2] f32 on the device
// (llama3 scaling is already folded in: rope_inverse_frequencies). head_dim <= 512 (one CTA per token).
cudaError_t rope(bf16* x, int64_t row_stride, const int32_t* positions, int32_t num_tokens,
                 int32_t num_heads, int32_t head_dim, const float* inv_freq, cudaStream_t stream);

// rope over the q and k heads of qkv rows laid out [q heads | k heads | ...] (head h at h * head_dim), one
// launch; when q_out is not null the rotated q heads are also written to q_out [num_tokens, num_q_heads *
// head_dim] (contiguous: the decode attention's q, without a separate copy). Launched with programmatic
// dependent launch (pdl.cuh), as rope, the norms and silu_mul are.
cudaError_t rope_qk(bf16* qkv, int64_t row_stride, const int32_t* positions, int32_t num_tokens, int32_t num_q_heads,
                    int32_t num_kv_heads, int32_t head_dim, const float* inv_freq, bf16* q_out, cudaStream_t stream);

// x[r, c] += bias[c] for c < cols (row stride row_stride). bias f32.
cudaError_t add_bias(bf16* x, int64_t row_stride, int32_t rows, int32_t cols, const float* bias,
                     cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, intermediate + i]: gate_up is the
// fused [rows, 2 * intermediate] projection (gate columns first); out [rows, intermediate].
cudaError_t silu_mul(const bf16* gate_up, bf16* out, int32_t rows, int32_t intermediate,
                     cudaStream_t stream);

// One layer of the paged KV pool on the GPU. For bf16 (KvQuant::kNone), key and
// value are each [num_blocks, block_size, num_kv_heads, head_dim] bf16 (the
// CpuKvPool layout). For the quantized formats of runtime/kv_quant.h they hold
// kv_head_data_bytes(head_dim, dtype) bytes per (block, slot, head) vector, and
// key_scale / value_scale kv_scale_groups(head_dim, dtype) 4-byte records per
// vector (null for bf16). K and V may use different formats.
struct DevicePagedKvLayer {
  void* key = nullptr;
  void* value = nullptr;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  kernels::KvQuant key_dtype = kernels::KvQuant::kNone;
  kernels::KvQuant value_dtype = kernels::KvQuant::kNone;
  void* key_scale = nullptr;
  void* value_scale = nullptr;
  // A bf16 MLA latent pool's block layout (runtime/mla_latent_layout.h); token-major for every other pool.
  runtime::MlaLatentPages latent_pages = runtime::MlaLatentPages::kTokenMajor;
};

// vLLM's reshape_and_cache: k and v rows [num_tokens, num_kv_heads * head_dim]
// (row stride row_stride) go to flat slot slots[t] = block * block_size + offset;
// a negative slot skips the token (padding rows of a CUDA graph bucket). head_dim % 8 == 0.
// Quantized pools are quantized here, one warp per (token, kv head), with the
// arithmetic of runtime/kv_quant.h (the same codes as the CPU's quantize_kv_vector).
cudaError_t kv_write(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots,
                     int32_t num_tokens, const DevicePagedKvLayer& layer, cudaStream_t stream);

// Per-tensor fp8 scales for the KV write: a checkpoint's calibrated
// self_attn.k_scale / v_scale (CudaLayerWeights::k_scale / v_scale). A scale
// > 0 makes every vector of an fp8 pool code fp8_satfinite(x * (1 / scale))
// (saturating at +-448) instead of using its own amax / 448, and still writes
// the scale used into the vector's scale record, so reads are unchanged; 0
// keeps the per-vector scale. Ignored for bf16, int8 and int4 pools, as on the
// CPU (kernels::PagedKvLayer::key_fixed_scale). The codes equal the CPU's
// quantize_kv_vector_fp8_fixed_scale bit for bit.
struct KvWriteFixedScales {
  float key = 0.0f;
  float value = 0.0f;
};
// kv_write with per-tensor fp8 scales. Errors: cudaErrorInvalidValue for a
// negative, NaN or infinite scale (and kv_write's own).
cudaError_t kv_write(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots,
                     int32_t num_tokens, const DevicePagedKvLayer& layer, KvWriteFixedScales fixed_scales,
                     cudaStream_t stream);

// Copies blocks source_blocks[0..num_blocks) (device array of block ids) of
// `layer` into a bf16 scratch pool: scratch block j = source block
// source_blocks[j], with the layer's block_size, num_kv_heads and head_dim
// (key_out / value_out each [num_blocks, block_size, num_kv_heads, head_dim]).
// Quantized layers are dequantized as the builtin attention does (code x scale
// + zero in f32, rounded once to bf16); bf16 layers are copied. For the bf16
// tensor-core prefill over a quantized pool. head_dim % 8 == 0.
cudaError_t kv_dequantize_blocks(const DevicePagedKvLayer& layer, const int32_t* source_blocks, int32_t num_blocks,
                                 bf16* key_out, bf16* value_out, cudaStream_t stream);

// Per-token view of the paged KV that attention needs, planned once per step on
// the host and copied to the device (all pointers are device arrays).
struct DeviceAttentionPlan {
  const int32_t* token_sequence = nullptr;  // [num_tokens] row of block_tables for token t
  const int32_t* kv_begin = nullptr;        // [num_tokens] first visible key index (sliding window)
  const int32_t* kv_end = nullptr;          // [num_tokens] one past the last visible key (causal);
                                            // kv_end <= kv_begin: padding, output zeros
  const int32_t* block_tables = nullptr;    // [num_sequences, block_table_stride]
  int32_t block_table_stride = 0;
  int32_t num_tokens = 0;
  // Token eviction's per-head holes of this layer (null: none): KV head h of
  // sequence i neither reads nor attends key indices [hole_begin[i *
  // num_kv_heads + h], hole_end[i]) (CudaKvScores::prepare_holes).
  const int32_t* hole_begin = nullptr;
  const int32_t* hole_end = nullptr;
};

// Causal paged attention for a mixed batch (prefill chunks after a cached
// prefix, and decodes), GQA-aware: one thread block serves up to 8 query heads
// of one KV head, so they share every K/V tile load. q [num_tokens, num_q_heads
// * head_dim] (row stride q_row_stride); out [num_tokens, num_q_heads * head_dim]
// contiguous. Online softmax in f32, scale applied to q. head_dim % 8 == 0 and
// <= 256; num_q_heads % num_kv_heads == 0. The new tokens' K/V must already be
// in the pool (kv_write). Quantized pools are dequantized (codes x scale + zero,
// in f32, then bf16) as the tiles are loaded. A simple, correct kernel;
// backend/cuda/attention has the fast ones.
cudaError_t paged_attention(const bf16* q, int64_t q_row_stride, const DevicePagedKvLayer& layer,
                            const DeviceAttentionPlan& plan, int32_t num_q_heads, float scale,
                            bf16* out, cudaStream_t stream);

// out[r] = index of the largest logits[r, :] (first one on ties; NaN ignored).
cudaError_t argmax_rows(const float* logits, int32_t rows, int32_t cols, int32_t* out,
                        cudaStream_t stream);

// x[i] = value (f32), e.g. norm weights of a random model.
cudaError_t fill_constant(float* x, int64_t n, float value, cudaStream_t stream);

}  // namespace pagoda::cuda
