#include "pagoda/backend/cuda/cuda_deepseek_forward.h"

#include <algorithm>
#include <limits>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/model/rope_frequencies.h"
#include "pagoda/model/yarn_rope.h"

namespace pagoda::cuda {

namespace {

// DeepSeek's q_a_layernorm and kv_a_layernorm keep RMSNorm's default epsilon (as the CPU's CpuMlaAttention).
constexpr float kLatentNormEps = 1e-6f;
constexpr int32_t kMaxRank = 512;
constexpr int32_t kMaxLatent = 640;
constexpr int32_t kMaxExperts = 256;
constexpr int32_t kMaxTopK = 16;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// One strided batched bf16 GEMM in cuBLAS's column-major terms (f32 accumulation).
cublasStatus_t batched(cublasHandle_t h, cublasOperation_t op_a, int m, int n, int k, const bf16* a, int lda,
                       long long stride_a, const bf16* b, int ldb, long long stride_b, bf16* c, int ldc,
                       long long stride_c, int batch) {
  const float one = 1.0f, zero = 0.0f;
  return cublasGemmStridedBatchedEx(h, op_a, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, lda, stride_a, b,
                                    CUDA_R_16BF, ldb, stride_b, &zero, c, CUDA_R_16BF, ldc, stride_c, batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace

StatusOr<std::unique_ptr<CudaDeepseekForward>> CudaDeepseekForward::create(const ModelConfig& config,
                                                                           CudaDeepseekWeights weights,
                                                                           int32_t max_num_tokens,
                                                                           cudaStream_t stream) {
  if (!config.mla) return invalid_argument_error("{} is not an MLA (DeepSeek) config", config.architecture_name);
  const MlaConfig& m = *config.mla;
  if (m.kv_lora_rank > kMaxRank || m.latent_dim() > kMaxLatent || m.kv_lora_rank % 2 != 0 ||
      m.qk_rope_head_dim % 2 != 0 || m.latent_dim() % 8 != 0 || config.hidden_size % 8 != 0) {
    return unimplemented_error("CUDA MLA: kv_lora_rank {} (even, <= {}), qk_rope_head_dim {} (even), latent {} (a "
                               "multiple of 8, <= {}), hidden_size {} (a multiple of 8)", m.kv_lora_rank, kMaxRank,
                               m.qk_rope_head_dim, m.latent_dim(), kMaxLatent, config.hidden_size);
  }
  if (config.moe && (config.moe->num_experts > kMaxExperts || config.moe->experts_per_token > kMaxTopK ||
                     config.moe->num_groups > 64)) {
    return unimplemented_error("CUDA MoE: n_routed_experts {} (<= {}), num_experts_per_tok {} (<= {}), n_group {} "
                               "(<= 64)", config.moe->num_experts, kMaxExperts, config.moe->experts_per_token,
                               kMaxTopK, config.moe->num_groups);
  }
  std::unique_ptr<CudaDeepseekForward> f(new CudaDeepseekForward(config, std::move(weights), stream));
  PAGODA_RETURN_IF_ERROR(f->init(max_num_tokens));
  return f;
}

CudaDeepseekForward::~CudaDeepseekForward() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

Status CudaDeepseekForward::init(int32_t max_num_tokens) {
  const ModelConfig& c = config_;
  const MlaConfig& m = *c.mla;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  PAGODA_ASSIGN_OR_RETURN(cublas_workspace_, DeviceBuffer::allocate(kCublasWorkspaceBytes));
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_.bytes()));
  mla_decode_ = std::make_unique<CudaMlaDecode>(c);
  mla_prefill_ = std::make_unique<CudaMlaPrefill>(c);

  const std::vector<float> inv_freq =
      c.rope_yarn ? yarn_inverse_frequencies(m.qk_rope_head_dim, c.rope_theta, *c.rope_yarn)
                  : rope_inverse_frequencies(m.qk_rope_head_dim, c.rope_theta);
  PAGODA_ASSIGN_OR_RETURN(inv_freq_, DeviceBuffer::allocate(inv_freq.size() * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * 4,
                                         cudaMemcpyHostToDevice));

  const size_t T = static_cast<size_t>(max_num_tokens);
  const size_t H = static_cast<size_t>(c.hidden_size);
  const size_t heads = static_cast<size_t>(c.num_q_heads);
  auto alloc = [](DeviceBuffer& b, size_t bytes) -> Status {
    PAGODA_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(std::max<size_t>(bytes, 16)));
    return ok_status();
  };
  if (m.q_lora_rank > 0) {
    PAGODA_RETURN_IF_ERROR(alloc(q_a_, T * m.q_lora_rank * 4));
    PAGODA_RETURN_IF_ERROR(alloc(q_a_normed_, T * m.q_lora_rank * 2));
  }
  PAGODA_RETURN_IF_ERROR(alloc(q_, T * heads * m.qk_head_dim() * 2));
  PAGODA_RETURN_IF_ERROR(alloc(kv_a_, T * m.latent_dim() * 4));
  PAGODA_RETURN_IF_ERROR(alloc(q_absorbed_, T * heads * m.latent_dim() * 2));
  PAGODA_RETURN_IF_ERROR(alloc(attended_, T * heads * m.kv_lora_rank * 2));
  PAGODA_RETURN_IF_ERROR(alloc(heads_out_, T * heads * m.v_head_dim * 2));
  const bool any_dense = !c.moe || c.moe->first_k_dense_replace > 0;
  if (any_dense) {
    PAGODA_RETURN_IF_ERROR(alloc(gate_up_, T * 2 * c.intermediate_size * 2));
    PAGODA_RETURN_IF_ERROR(alloc(act_, T * c.intermediate_size * 2));
  }
  if (c.moe && c.moe->first_k_dense_replace < c.num_layers) {
    const MoeConfig& e = *c.moe;
    const size_t E = static_cast<size_t>(e.num_experts), K = static_cast<size_t>(e.experts_per_token);
    const size_t I = static_cast<size_t>(e.moe_intermediate_size);
    PAGODA_RETURN_IF_ERROR(alloc(logits_, T * E * 4));
    PAGODA_RETURN_IF_ERROR(alloc(indices_, T * K * 4));
    PAGODA_RETURN_IF_ERROR(alloc(weights_route_, T * K * 4));
    PAGODA_RETURN_IF_ERROR(alloc(offsets_, (E + 1) * 4));
    PAGODA_RETURN_IF_ERROR(alloc(position_, T * K * 4));
    PAGODA_RETURN_IF_ERROR(alloc(rows_, T * K * H * 2));
    PAGODA_RETURN_IF_ERROR(alloc(rows_gate_up_, T * K * 2 * I * 2));
    PAGODA_RETURN_IF_ERROR(alloc(rows_act_, T * K * I * 2));
    PAGODA_RETURN_IF_ERROR(alloc(rows_out_, T * K * H * 2));
    PAGODA_ASSIGN_OR_RETURN(host_offsets_, PinnedBuffer::allocate((E + 1) * 4));
    PAGODA_ASSIGN_OR_RETURN(host_pointers_, PinnedBuffer::allocate(2 * 3 * E * sizeof(void*)));
    PAGODA_RETURN_IF_ERROR(alloc(device_pointers_, 2 * 3 * E * sizeof(void*)));
    if (e.num_shared_experts > 0) {
      const size_t S = static_cast<size_t>(e.shared_intermediate_size());
      PAGODA_RETURN_IF_ERROR(alloc(shared_gate_up_, T * 2 * S * 2));
      PAGODA_RETURN_IF_ERROR(alloc(shared_act_, T * S * 2));
      PAGODA_RETURN_IF_ERROR(alloc(shared_out_, T * H * 2));
    }
  }
  return ok_status();
}

Status CudaDeepseekForward::linear(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, bf16* y) {
  if (m == 0) return ok_status();
  const float one = 1.0f, zero = 0.0f;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, k, x,
                                             CUDA_R_16BF, k, &zero, y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
  return ok_status();
}

Status CudaDeepseekForward::expert_gemms(const int32_t* offsets, const bf16* x, const bf16* w, int32_t n, int32_t k,
                                         bf16* y, int slot) {
  const int32_t E = config_.moe->num_experts;
  const size_t w_elements = static_cast<size_t>(n) * k;
  if (grouped_gemm_) {
    // Column-major per expert: y_e^T (n x rows) = op_T(w_e: k x n, ld k) x x_e^T (k x rows, ld k).
    const void** pointers = host_pointers_.as<const void*>() + static_cast<size_t>(slot) * 3 * E;
    std::vector<int> m_array, n_array, k_array, lda, ldb, ldc, group_size;
    std::vector<cublasOperation_t> trans_a, trans_b;
    std::vector<float> alpha, beta;
    int32_t groups = 0;
    for (int32_t e = 0; e < E; ++e) {
      const int32_t begin = offsets[e], count = offsets[e + 1] - offsets[e];
      if (count <= 0) continue;
      pointers[groups] = w + e * w_elements;
      pointers[E + groups] = x + static_cast<size_t>(begin) * k;
      pointers[2 * E + groups] = y + static_cast<size_t>(begin) * n;
      m_array.push_back(n);
      n_array.push_back(count);
      k_array.push_back(k);
      lda.push_back(k);
      ldb.push_back(k);
      ldc.push_back(n);
      group_size.push_back(1);
      trans_a.push_back(CUBLAS_OP_T);
      trans_b.push_back(CUBLAS_OP_N);
      alpha.push_back(1.0f);
      beta.push_back(0.0f);
      ++groups;
    }
    if (groups == 0) return ok_status();
    void** device = device_pointers_.as<void*>() + static_cast<size_t>(slot) * 3 * E;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device, pointers, 3 * E * sizeof(void*), cudaMemcpyHostToDevice,
                                                stream_));
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        cublas_, trans_a.data(), trans_b.data(), m_array.data(), n_array.data(), k_array.data(), alpha.data(),
        const_cast<const void* const*>(device), CUDA_R_16BF, lda.data(), const_cast<const void* const*>(device + E),
        CUDA_R_16BF, ldb.data(), beta.data(), device + 2 * E, CUDA_R_16BF, ldc.data(), groups, group_size.data(),
        CUBLAS_COMPUTE_32F);
    if (status == CUBLAS_STATUS_SUCCESS) return ok_status();
    grouped_gemm_ = false;  // this cuBLAS does not take it: one GEMM per expert from now on
  }
  for (int32_t e = 0; e < E; ++e) {
    const int32_t begin = offsets[e], count = offsets[e + 1] - offsets[e];
    if (count <= 0) continue;
    PAGODA_RETURN_IF_ERROR(linear(x + static_cast<size_t>(begin) * k, count, w + e * w_elements, n, k,
                                  y + static_cast<size_t>(begin) * n));
  }
  return ok_status();
}

Status CudaDeepseekForward::attention(int32_t l, int32_t T, const CudaKvPool& pool, const StepMetadata& meta,
                                      const DeviceAttentionPlan& plan, Gemm& gemm, const bf16* x, bf16* out) {
  const ModelConfig& c = config_;
  const MlaConfig& m = *c.mla;
  const CudaDeepseekLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const int32_t H = c.hidden_size, heads = c.num_q_heads;
  const int32_t qk = m.qk_head_dim(), nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
  const int32_t rank = m.kv_lora_rank, latent = m.latent_dim(), v = m.v_head_dim;
  bf16* q = q_.as<bf16>();
  if (m.q_lora_rank == 0) {
    PAGODA_RETURN_IF_ERROR(gemm.linear(x, T, w.q_proj, heads * qk, H, q, GemmOutput::kBF16, stream_));
  } else {
    PAGODA_RETURN_IF_ERROR(gemm.linear(x, T, w.q_a_proj, m.q_lora_rank, H, q_a_.data(), GemmOutput::kF32, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(mla_rmsnorm_f32(q_a_.as<float>(), m.q_lora_rank, w.q_a_bias, w.q_a_norm,
                                                q_a_normed_.as<bf16>(), T, m.q_lora_rank, kLatentNormEps, stream_));
    PAGODA_RETURN_IF_ERROR(
        gemm.linear(q_a_normed_.as<bf16>(), T, w.q_b_proj, heads * qk, m.q_lora_rank, q, GemmOutput::kBF16, stream_));
  }
  // The latent: kv_a in f32, then norm + rope + quantize into the pool.
  PAGODA_RETURN_IF_ERROR(gemm.linear(x, T, w.kv_a_proj, latent, H, kv_a_.data(), GemmOutput::kF32, stream_));
  const DevicePagedKvLayer kv = pool.layer(l);
  const float* inv_freq = inv_freq_.as<float>();
  PAGODA_CUDA_RETURN_IF_ERROR(mla_latent_write(kv_a_.as<float>(), w.kv_a_bias, w.kv_a_norm, kLatentNormEps,
                                               meta.positions, meta.slots, T, rank, rope, inv_freq, m.rope_interleave,
                                               m.rope_attention_factor, kv, stream_));
  // Absorbed query [T, heads, latent]: q_nope_h . W_UK_h for every head in one batched GEMM
  // (column-major: (rank x T) = W_UK_h (rank x nope, kv_b_proj rows read as ld rank) x q_nope_h^T), then q_pe.
  // Rows [0, absorbed) attend in the absorbed form (fast decode kernel, then the simple one);
  // rows [absorbed, T) are prompt segments on the tensor-core prefill (CudaMlaPrefill).
  const int32_t absorbed = std::min(prefill_row_, T);
  bf16* qa = q_absorbed_.as<bf16>();
  const long long kv_b_head = static_cast<long long>(nope + v) * rank;
  if (absorbed > 0) {
    PAGODA_CUBLAS_RETURN_IF_ERROR(batched(cublas_, CUBLAS_OP_N, rank, absorbed, nope, w.kv_b_proj, rank, kv_b_head,
                                          q, heads * qk, qk, qa, heads * latent, latent, heads));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(mla_query_rope(q, qa, meta.positions, T, heads, nope, rope, rank, inv_freq,
                                             m.rope_interleave, m.rope_attention_factor, stream_));
  bf16* att = attended_.as<bf16>();
  bf16* ho = heads_out_.as<bf16>();
  // Leading decode rows on the fast kernel, then up to `absorbed` on the simple one.
  const int32_t fast = std::min(fast_rows_, absorbed);
  if (fast > 0) PAGODA_RETURN_IF_ERROR(mla_decode_->run(kv, qa, att, stream_));
  if (fast < absorbed) {
    const DeviceAttentionPlan rest{plan.token_sequence + fast, plan.kv_begin + fast, plan.kv_end + fast,
                                   plan.block_tables, plan.block_table_stride, absorbed - fast};
    PAGODA_CUDA_RETURN_IF_ERROR(mla_attention_simple(qa + static_cast<size_t>(fast) * heads * latent, kv, rest, heads,
                                                     rank, m.softmax_scale,
                                                     att + static_cast<size_t>(fast) * heads * rank, stream_));
  }
  if (absorbed > 0) {
    // Per head: W_UV_h [v, rank] (kv_b_proj's value rows) expands the attended latent:
    // column-major (v x T) = op T of (rank x v, ld rank) x att_h^T (rank x T).
    const bf16* w_uv = w.kv_b_proj + static_cast<size_t>(nope) * rank;
    PAGODA_CUBLAS_RETURN_IF_ERROR(batched(cublas_, CUBLAS_OP_T, v, absorbed, rank, w_uv, rank, kv_b_head, att,
                                          heads * rank, rank, ho, heads * v, v, heads));
  }
  if (absorbed < T) {
    PAGODA_RETURN_IF_ERROR(mla_prefill_->run(cublas_, kv, plan.block_tables, plan.block_table_stride, q, qa,
                                             w.kv_b_proj, ho, stream_));
  }
  PAGODA_RETURN_IF_ERROR(gemm.linear(ho, T, w.o_proj, H, heads * v, out, GemmOutput::kBF16, stream_));
  if (w.o_bias != nullptr) PAGODA_CUDA_RETURN_IF_ERROR(add_bias(out, H, T, H, w.o_bias, stream_));
  return ok_status();
}

Status CudaDeepseekForward::dense_mlp(int32_t l, int32_t T, Gemm& gemm, const bf16* x, bf16* out) {
  const CudaDeepseekLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const int32_t H = config_.hidden_size, I = config_.intermediate_size;
  PAGODA_RETURN_IF_ERROR(gemm.linear(x, T, w.gate_up_proj, 2 * I, H, gate_up_.data(), GemmOutput::kBF16, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(silu_mul(gate_up_.as<bf16>(), act_.as<bf16>(), T, I, stream_));
  return gemm.linear(act_.as<bf16>(), T, w.down_proj, H, I, out, GemmOutput::kBF16, stream_);
}

Status CudaDeepseekForward::moe(int32_t l, int32_t T, Gemm& gemm, const bf16* x, bf16* out) {
  const MoeConfig& e = *config_.moe;
  const CudaDeepseekLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const int32_t H = config_.hidden_size, E = e.num_experts, K = e.experts_per_token;
  const int32_t I = e.moe_intermediate_size;
  MoeRouteParams params;
  params.num_experts = E;
  params.top_k = K;
  params.sigmoid = e.scoring == MoeScoring::kSigmoid;
  params.group_score = e.group_score == MoeGroupScore::kNone ? 0 : (e.group_score == MoeGroupScore::kMax ? 1 : 2);
  params.num_groups = e.num_groups;
  params.topk_groups = e.topk_groups;
  params.norm_topk_prob = e.norm_topk_prob;
  params.routed_scaling_factor = e.routed_scaling_factor;
  int32_t* indices = indices_.as<int32_t>();
  int32_t* position = position_.as<int32_t>();
  float* route_weights = weights_route_.as<float>();
  PAGODA_CUDA_RETURN_IF_ERROR(moe_router_logits(x, w.router, T, H, E, logits_.as<float>(), stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(moe_route(logits_.as<float>(), e.score_correction_bias ? w.correction_bias : nullptr,
                                        T, params, indices, route_weights, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(moe_group_by_expert(indices, T, K, E, offsets_.as<int32_t>(), position, stream_));
  bf16* rows = rows_.as<bf16>();
  PAGODA_CUDA_RETURN_IF_ERROR(moe_permute(x, position, T, K, H, rows, stream_));
  // Eager steps: the row counts go to the host for cuBLAS's grouped GEMM.
  if (!graph_step_) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_offsets_.data(), offsets_.data(), (E + 1) * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
  }
  // The shared experts are enqueued before the wait, so the GPU works while the host waits for the offsets.
  const bf16* shared = nullptr;
  if (w.shared_gate_up != nullptr) {
    const int32_t S = e.shared_intermediate_size();
    PAGODA_RETURN_IF_ERROR(
        gemm.linear(x, T, w.shared_gate_up, 2 * S, H, shared_gate_up_.data(), GemmOutput::kBF16, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(silu_mul(shared_gate_up_.as<bf16>(), shared_act_.as<bf16>(), T, S, stream_));
    PAGODA_RETURN_IF_ERROR(
        gemm.linear(shared_act_.as<bf16>(), T, w.shared_down, H, S, shared_out_.data(), GemmOutput::kBF16, stream_));
    shared = shared_out_.as<bf16>();
  }
  bf16* gate_up = rows_gate_up_.as<bf16>();
  bf16* act = rows_act_.as<bf16>();
  bf16* rows_out = rows_out_.as<bf16>();
  if (graph_step_) {
    const int32_t* offsets = offsets_.as<int32_t>();
    PAGODA_CUDA_RETURN_IF_ERROR(moe_grouped_gemm(offsets, E, rows, w.experts_gate_up, 2 * I, H, gate_up, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(silu_mul(gate_up, act, T * K, I, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(moe_grouped_gemm(offsets, E, act, w.experts_down, H, I, rows_out, stream_));
  } else {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const int32_t* offsets = host_offsets_.as<int32_t>();
    PAGODA_RETURN_IF_ERROR(expert_gemms(offsets, rows, w.experts_gate_up, 2 * I, H, gate_up, 0));
    PAGODA_CUDA_RETURN_IF_ERROR(silu_mul(gate_up, act, T * K, I, stream_));
    PAGODA_RETURN_IF_ERROR(expert_gemms(offsets, act, w.experts_down, H, I, rows_out, 1));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(moe_unpermute(rows_out, position, route_weights, shared, T, K, H, out, stream_));
  return ok_status();
}

bool CudaDeepseekForward::graph_capable() const {
  if (!config_.moe) return true;
  const MoeConfig& e = *config_.moe;
  return moe_grouped_gemm_supported(2 * e.moe_intermediate_size, config_.hidden_size) &&
         moe_grouped_gemm_supported(config_.hidden_size, e.moe_intermediate_size);
}

StatusOr<bool> CudaDeepseekForward::plan_step(const ForwardBatch& batch, const KvPoolShape& pool, int32_t bucket,
                                              int32_t max_bucket, int32_t block_table_stride, bool fast_decode,
                                              const int32_t* device_block_tables) {
  if (bucket > 0 && !graph_capable()) return internal_error("DeepSeek forward: graph step for a model without graphs");
  graph_step_ = bucket > 0;
  fast_rows_ = 0;
  prefill_row_ = std::numeric_limits<int32_t>::max();  // graph steps (padded rows) never reach the prefill
  if (fast_decode) {
    PAGODA_ASSIGN_OR_RETURN(fast_rows_, mla_decode_->plan(batch, pool, bucket, max_bucket, block_table_stride, stream_,
                                                          bucket > 0 ? device_block_tables : nullptr));
    if (bucket == 0) {
      PAGODA_ASSIGN_OR_RETURN(prefill_row_, mla_prefill_->plan(batch, fast_rows_));
      if (prefill_row_ < batch.num_tokens()) ++prefill_steps_;
    }
  }
  return fast_rows_ > 0;
}

Status CudaDeepseekForward::run_layers(int32_t T, const CudaKvPool& pool, const StepMetadata& meta,
                                       const DeviceAttentionPlan& plan, Gemm& gemm, float* residual, bf16* normed,
                                       bf16* proj) {
  const ModelConfig& c = config_;
  const int32_t H = c.hidden_size;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const CudaDeepseekLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    if (l == 0) {
      PAGODA_CUDA_RETURN_IF_ERROR(rmsnorm(residual, nullptr, w.input_norm, normed, T, H, c.rms_norm_eps, stream_));
    } else {
      PAGODA_CUDA_RETURN_IF_ERROR(add_rmsnorm(residual, proj, w.input_norm, normed, T, H, c.rms_norm_eps, stream_));
    }
    PAGODA_RETURN_IF_ERROR(attention(l, T, pool, meta, plan, gemm, normed, proj));
    PAGODA_CUDA_RETURN_IF_ERROR(
        add_rmsnorm(residual, proj, w.post_attention_norm, normed, T, H, c.rms_norm_eps, stream_));
    if (c.moe && c.moe->is_moe_layer(l)) {
      PAGODA_RETURN_IF_ERROR(moe(l, T, gemm, normed, proj));
    } else {
      PAGODA_RETURN_IF_ERROR(dense_mlp(l, T, gemm, normed, proj));
    }
  }
  return ok_status();
}

}  // namespace pagoda::cuda
