#pragma once
// The layer weights of a DeepSeek V2/V3 model (MLA + MoE, model/deepseek_config.h)
// on the GPU: matrices in bf16, norms, biases and the MoE router in f32 (the
// router stays f32 so that expert choices match the CPU's wherever the
// scores are not near ties). kv_b_proj is kept whole: the forward reads W_UK
// and W_UV (each head's key rows, then value rows) in place as strided
// batched GEMM operands, so absorption needs no extra copy. The routed
// experts of a layer are stacked: gate|up [E, 2 I, hidden] (gate rows first)
// and down [E, hidden, I]. Embeddings, lm_head and the final norm stay in
// CudaModelWeights.
//
// Two ways in, as CudaModelWeights: upload() from bound checkpoint weights,
// random() from model/random_weights.h (the same matrices and elements as
// backend/cpu/random_deepseek_model, rounded to bf16; the router in f32).
//
// Thread safety: immutable after construction.

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>

#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"

namespace pagoda::cuda {

struct CudaDeepseekLayerWeights {
  float* input_norm = nullptr;           // [hidden]
  float* post_attention_norm = nullptr;  // [hidden]
  // Attention.
  __nv_bfloat16* q_proj = nullptr;    // [heads * qk_head_dim, hidden]; null with q LoRA
  __nv_bfloat16* q_a_proj = nullptr;  // [q_lora_rank, hidden]
  float* q_a_bias = nullptr;          // [q_lora_rank] or null
  float* q_a_norm = nullptr;          // [q_lora_rank]
  __nv_bfloat16* q_b_proj = nullptr;  // [heads * qk_head_dim, q_lora_rank]
  __nv_bfloat16* kv_a_proj = nullptr; // [kv_lora_rank + qk_rope_head_dim, hidden]
  float* kv_a_bias = nullptr;         // or null
  float* kv_a_norm = nullptr;         // [kv_lora_rank]
  __nv_bfloat16* kv_b_proj = nullptr; // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  __nv_bfloat16* o_proj = nullptr;    // [hidden, heads * v_head_dim]
  float* o_bias = nullptr;            // or null
  // Dense MLP (layers < first_k_dense_replace).
  __nv_bfloat16* gate_up_proj = nullptr;  // [2 * intermediate, hidden]
  __nv_bfloat16* down_proj = nullptr;     // [hidden, intermediate]
  // MoE.
  float* router = nullptr;                   // [experts, hidden] f32
  float* correction_bias = nullptr;          // [experts] (V3) or null
  __nv_bfloat16* experts_gate_up = nullptr;  // [experts, 2 * moe_intermediate, hidden]
  __nv_bfloat16* experts_down = nullptr;     // [experts, hidden, moe_intermediate]
  __nv_bfloat16* shared_gate_up = nullptr;   // [2 * shared_intermediate, hidden] or null
  __nv_bfloat16* shared_down = nullptr;      // [hidden, shared_intermediate] or null
};

class CudaDeepseekWeights {
 public:
  // host: bound by bind_model_weights for a DeepSeek config (config.mla and config.moe set).
  static StatusOr<CudaDeepseekWeights> upload(const ModelConfig& config, const ModelWeights& host,
                                              bool show_progress);
  static StatusOr<CudaDeepseekWeights> random(const ModelConfig& config, uint64_t seed);

  std::vector<CudaDeepseekLayerWeights> layers;
  size_t total_bytes() const { return total_bytes_; }

 private:
  StatusOr<void*> allocate(size_t bytes);
  std::vector<DeviceBuffer> buffers_;
  size_t total_bytes_ = 0;
};

}  // namespace pagoda::cuda
