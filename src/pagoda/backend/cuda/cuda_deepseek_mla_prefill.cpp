#include "pagoda/backend/cuda/cuda_deepseek_mla_prefill.h"

#include <algorithm>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/mla_ops.h"

namespace pagoda::cuda {

namespace {

int32_t round_up8(int32_t n) { return (n + 7) / 8 * 8; }

Status grow(DeviceBuffer& b, size_t bytes) {
  if (b.bytes() >= bytes) return ok_status();
  b = DeviceBuffer{};  // free first: the old and new scratch need not both fit
  PAGODA_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(std::max<size_t>(bytes, 256)));
  return ok_status();
}

}  // namespace

CudaMlaPrefill::CudaMlaPrefill(const ModelConfig& config)
    : heads_(config.num_q_heads),
      nope_(config.mla->qk_nope_head_dim),
      rope_(config.mla->qk_rope_head_dim),
      rank_(config.mla->kv_lora_rank),
      v_(config.mla->v_head_dim),
      scale_(config.mla->softmax_scale) {}

StatusOr<int32_t> CudaMlaPrefill::plan(const ForwardBatch& batch, int32_t first_row) {
  segments_.clear();
  int32_t first = batch.num_tokens();
  size_t max_context = 0, max_scores = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    if (seq.token_offset < first_row) continue;
    if (segments_.empty() && seq.num_new_tokens < std::max(tuning_.min_rows, 2)) continue;
    Segment g;
    g.row = seq.token_offset;
    g.rows = seq.num_new_tokens;
    g.context = seq.num_cached_tokens + seq.num_new_tokens;
    g.sequence = static_cast<int32_t>(s);
    const size_t per_row = static_cast<size_t>(heads_) * round_up8(g.context) * (sizeof(float) + sizeof(bf16));
    g.chunk = static_cast<int32_t>(std::clamp<size_t>(tuning_.score_budget_bytes / per_row, 1, g.rows));
    if (segments_.empty()) first = g.row;
    segments_.push_back(g);
    max_context = std::max<size_t>(max_context, g.context);
    max_scores = std::max(max_scores, static_cast<size_t>(heads_) * g.chunk * round_up8(g.context));
  }
  if (segments_.empty()) return first;
  PAGODA_RETURN_IF_ERROR(grow(latent_, max_context * (rank_ + rope_) * sizeof(bf16)));
  PAGODA_RETURN_IF_ERROR(grow(kv_, max_context * heads_ * (nope_ + v_) * sizeof(bf16)));
  PAGODA_RETURN_IF_ERROR(grow(scores_, max_scores * sizeof(float)));
  PAGODA_RETURN_IF_ERROR(grow(probs_, max_scores * sizeof(bf16)));
  return first;
}

Status CudaMlaPrefill::run(cublasHandle_t cublas, const DevicePagedKvLayer& layer, const int32_t* block_tables,
                           int32_t block_table_stride, const bf16* q, const bf16* q_absorbed, const bf16* kv_b_proj,
                           bf16* heads_out, cudaStream_t stream) {
  const int32_t latent = rank_ + rope_, qk = nope_ + rope_, per_head = nope_ + v_;
  const int32_t kv_ld = heads_ * per_head;
  const float one = 1.0f, zero = 0.0f;
  bf16* lat = latent_.as<bf16>();
  bf16* kv = kv_.as<bf16>();
  float* scores = scores_.as<float>();
  bf16* probs = probs_.as<bf16>();
  for (const Segment& g : segments_) {
    const int32_t C = g.context, cached = g.context - g.rows;
    PAGODA_CUDA_RETURN_IF_ERROR(mla_gather_latent(
        layer, block_tables + static_cast<size_t>(g.sequence) * block_table_stride, C, rank_, lat, stream));
    // kv^T (kv_ld x C, column-major) = kv_b_proj (rank x kv_ld, ld rank)^T x latent^T (rank x C, ld latent).
    PAGODA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, kv_ld, C, rank_, &one, kv_b_proj,
                                               CUDA_R_16BF, rank_, lat, CUDA_R_16BF, latent, &zero, kv, CUDA_R_16BF,
                                               kv_ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    for (int32_t i0 = 0; i0 < g.rows; i0 += g.chunk) {
      const int32_t n = std::min(g.chunk, g.rows - i0);
      const int32_t keys = cached + i0 + n;  // the chunk's last row sees these
      const int32_t ld = round_up8(keys);    // 16-byte aligned P rows for the tensor-core GEMM
      const size_t row = static_cast<size_t>(g.row) + i0;
      const long long s_stride = static_cast<long long>(n) * ld;
      // Column-major per head: S^T (keys x n, ld ld) = K_nope (nope x keys)^T x q_nope^T (nope x n).
      PAGODA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
          cublas, CUBLAS_OP_T, CUBLAS_OP_N, keys, n, nope_, &one, kv, CUDA_R_16BF, kv_ld, per_head,
          q + row * heads_ * qk, CUDA_R_16BF, heads_ * qk, qk, &zero, scores, CUDA_R_32F, ld, s_stride, heads_,
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      // + the rope part: the shared rotated key (stride 0 over heads) against each head's rotated q_pe.
      PAGODA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
          cublas, CUBLAS_OP_T, CUBLAS_OP_N, keys, n, rope_, &one, lat + rank_, CUDA_R_16BF, latent, 0,
          q_absorbed + row * heads_ * latent + rank_, CUDA_R_16BF, heads_ * latent, latent, &one, scores, CUDA_R_32F,
          ld, s_stride, heads_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      PAGODA_CUDA_RETURN_IF_ERROR(
          mla_causal_softmax(scores, heads_, n, keys, ld, cached + i0 + 1, scale_, probs, stream));
      // O^T (v x n, ld heads * v) = V (v x keys, ld kv_ld) x P^T (keys x n, ld ld).
      PAGODA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
          cublas, CUBLAS_OP_N, CUBLAS_OP_N, v_, n, keys, &one, kv + nope_, CUDA_R_16BF, kv_ld, per_head, probs,
          CUDA_R_16BF, ld, s_stride, &zero, heads_out + row * heads_ * v_, CUDA_R_16BF, heads_ * v_, v_, heads_,
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  return ok_status();
}

}  // namespace pagoda::cuda
