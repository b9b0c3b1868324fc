#pragma once
// The decoder layers of a DeepSeek V2/V3 model (model/deepseek_config.h) on the
// GPU, run by CudaModel for MLA configs between its embedding and its head:
//
//   [residual add +] RMSNorm -> q (q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj)
//   -> kv_a_proj_with_mqa (f32) -> latent write (kv_a_layernorm on the latent,
//   rope on the rope key, quantize into the pool: mla_ops.h)
//   -> absorbed query [heads, rank + rope]: q_nope x W_UK (one strided batched
//   GEMM over the heads, W_UK read in place from kv_b_proj) and the rotated q_pe
//   -> MLA attention over the paged latent: the step's leading decode rows on the
//      paged MLA decode kernel (CudaMlaDecode, attention/mla_decode.h) when it covers
//      the shape, then rows up to the first prompt segment on mla_attention_simple
//   -> attended latent x W_UV^T (strided batched, in place from kv_b_proj); the
//      prompt segments instead run the tensor-core prefill (CudaMlaPrefill: per-head
//      K / V decompressed from the latent, cuBLAS GEMMs) straight to the head outputs
//   -> o_proj
//   -> residual add + RMSNorm -> dense SwiGLU MLP (first_k_dense_replace layers)
//      or MoE: f32 router + routing kernel, tokens grouped by expert (permute),
//      the expert GEMMs per projection (gate|up, down), SiLU-mul, weighted
//      un-permute plus the shared experts. The expert GEMMs: graph steps (pure
//      decodes padded to a bucket) use moe_grouped_gemm, which reads the
//      per-expert row ranges on the device (no host synchronization, so the
//      step is captured in a CUDA graph); eager steps one cuBLAS grouped GEMM
//      over the non-empty experts, whose row counts come back to the host each
//      MoE layer (a stream synchronization).
// bf16 GEMM inputs and outputs with f32 accumulation, an f32 residual stream,
// as the llama forward. The same math as backend/cpu (CpuMlaAttention, CpuMoeBlock).
//
// Thread safety: one caller at a time (scratch and the cuBLAS handle are owned).

#include <cstdint>
#include <memory>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_deepseek_mla_decode.h"
#include "pagoda/backend/cuda/cuda_deepseek_mla_prefill.h"
#include "pagoda/backend/cuda/cuda_deepseek_weights.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/step_plan.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda::cuda {

class CudaDeepseekForward {
 public:
  // config.mla set; weights for it; scratch for max_num_tokens rows. Errors:
  // shapes the kernels do not cover (latent > 640 or kv_lora_rank > 512, more
  // than 256 experts or 16 per token), or out of memory.
  static StatusOr<std::unique_ptr<CudaDeepseekForward>> create(const ModelConfig& config,
                                                               CudaDeepseekWeights weights, int32_t max_num_tokens,
                                                               cudaStream_t stream);
  ~CudaDeepseekForward();
  CudaDeepseekForward(const CudaDeepseekForward&) = delete;
  CudaDeepseekForward& operator=(const CudaDeepseekForward&) = delete;

  // Runs every layer for T rows: residual f32 [T, hidden] holds the embeddings
  // on entry; on exit residual + proj (bf16 [T, hidden], the last layer's MLP
  // output, not yet added) as CudaModel::run_layers leaves them. normed is bf16
  // [T, hidden] scratch. meta: the step's device metadata.
  Status run_layers(int32_t T, const CudaKvPool& pool, const StepMetadata& meta, const DeviceAttentionPlan& plan,
                    Gemm& gemm, float* residual, bf16* normed, bf16* proj);

  // Plans a step before run_layers (and before capturing or replaying its
  // graph): bucket > 0 for a graph step (a pure decode padded to `bucket` rows,
  // run_layers then runs exactly what a capture may record: no host
  // synchronization), 0 for an eager step. fast_decode false keeps every row on
  // the simple attention kernel (neither the fast decode kernel nor the
  // tensor-core prefill: the reference the tests compare them with). Returns
  // whether decode rows run on the fast MLA decode kernel. Enqueues the plan's
  // arena copy on the stream.
  // device_block_tables: the step's tables on the device (CudaMlaDecode::plan), for graph steps.
  StatusOr<bool> plan_step(const ForwardBatch& batch, const KvPoolShape& pool, int32_t bucket, int32_t max_bucket,
                           int32_t block_table_stride, bool fast_decode, const int32_t* device_block_tables = nullptr);

  // True when graph steps can run (moe_grouped_gemm covers the expert shapes).
  bool graph_capable() const;

  size_t weight_bytes() const { return weights_.total_bytes(); }

  // Eager steps whose prompt rows ran on the tensor-core prefill (tests).
  int64_t prefill_steps() const { return prefill_steps_; }
  void set_prefill_tuning(const CudaMlaPrefill::Tuning& tuning) { mla_prefill_->set_tuning(tuning); }

 private:
  CudaDeepseekForward(const ModelConfig& config, CudaDeepseekWeights weights, cudaStream_t stream)
      : config_(config), weights_(std::move(weights)), stream_(stream) {}
  Status init(int32_t max_num_tokens);
  Status attention(int32_t layer, int32_t T, const CudaKvPool& pool, const StepMetadata& meta,
                   const DeviceAttentionPlan& plan, Gemm& gemm, const bf16* x, bf16* out);
  Status dense_mlp(int32_t layer, int32_t T, Gemm& gemm, const bf16* x, bf16* out);
  Status moe(int32_t layer, int32_t T, Gemm& gemm, const bf16* x, bf16* out);
  // y[m, n] = x[m, k] . w[n, k]^T (row-major, contiguous) through cuBLAS.
  Status linear(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, bf16* y);
  // For every expert e with rows (offsets[e + 1] > offsets[e]): y_e = x_e . w_e^T,
  // x_e / y_e the expert's rows of x [*, k] / y [*, n], w_e = w + e * n * k.
  // One cuBLAS grouped GEMM (pointer arrays staged through pinned memory, set
  // `slot` 0 or 1 so the two projections of a layer do not share one), or one
  // GEMM per expert if cuBLAS refuses the grouped call.
  Status expert_gemms(const int32_t* offsets, const bf16* x, const bf16* w, int32_t n, int32_t k, bf16* y, int slot);

  ModelConfig config_;
  CudaDeepseekWeights weights_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer inv_freq_;  // f32 [rope / 2]

  DeviceBuffer q_a_, q_a_normed_, q_, kv_a_, q_absorbed_, attended_, heads_out_, gate_up_, act_;
  DeviceBuffer logits_, indices_, weights_route_, offsets_, position_, rows_, rows_gate_up_, rows_act_, rows_out_;
  DeviceBuffer shared_gate_up_, shared_act_, shared_out_;
  PinnedBuffer host_offsets_;
  PinnedBuffer host_pointers_;    // [2 slots][3][experts] A, B, C pointers of the grouped GEMMs
  DeviceBuffer device_pointers_;  // the same, on the device
  bool grouped_gemm_ = true;      // false once cuBLAS refused cublasGemmGroupedBatchedEx
  DeviceBuffer cublas_workspace_;  // set on cublas_ so its calls allocate nothing (graph capture)
  std::unique_ptr<CudaMlaDecode> mla_decode_;
  std::unique_ptr<CudaMlaPrefill> mla_prefill_;
  int32_t fast_rows_ = 0;    // this step's leading rows on the fast decode kernel
  int64_t prefill_steps_ = 0;
  int32_t prefill_row_ = 0;  // this step's first row on the tensor-core prefill (int32 max: none)
  bool graph_step_ = false;  // this step is a graph step (plan_step)
};

}  // namespace pagoda::cuda
