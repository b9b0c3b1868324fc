#pragma once
// The weights of a llama-family model on the GPU, as bf16 matrices in the
// layouts the CUDA forward wants: q/k/v fused into one [(q_heads + 2 kv_heads)
// * head_dim, hidden] matrix and gate/up into one [2 * intermediate, hidden]
// matrix (gate rows first), so each becomes one GEMM. Norm weights and biases
// stay f32 (tiny; the kernels compute in f32).
//
// Two ways in: upload() converts a checkpoint's tensors (f32/f16/bf16, bound by
// bind_model_weights) to bf16 and copies them over, with a progress bar on
// stderr; random() builds reproducible random weights for any config directly
// on the GPU (`--load-format random`: real shapes such as Llama-3-8B benchmarked
// without a download).
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

struct CudaLayerWeights {
  __nv_bfloat16* qkv_proj = nullptr;      // [(Hq + 2 Hkv) * D, hidden]
  __nv_bfloat16* o_proj = nullptr;        // [hidden, Hq * D]
  __nv_bfloat16* gate_up_proj = nullptr;  // [2 * intermediate, hidden]
  __nv_bfloat16* down_proj = nullptr;     // [hidden, intermediate]
  float* input_norm = nullptr;            // [hidden]
  float* post_attention_norm = nullptr;   // [hidden]
  float* q_norm = nullptr;                // [D], Qwen3 only
  float* k_norm = nullptr;                // [D], Qwen3 only
  float* qkv_bias = nullptr;              // [(Hq + 2 Hkv) * D] or null
  float* o_bias = nullptr;                // [hidden] or null
  float* gate_up_bias = nullptr;          // [2 * intermediate] or null
  float* down_bias = nullptr;             // [hidden] or null
  // A checkpoint's calibrated per-tensor fp8 KV scales (self_attn.k_scale /
  // v_scale, validated by bind_model_weights: finite and > 0); 0 when absent.
  // Host floats, passed by value to kv_write (KvWriteFixedScales): with an fp8
  // KV cache they replace each vector's amax / 448; other KV dtypes ignore them.
  float k_scale = 0.0f;
  float v_scale = 0.0f;
};

class CudaModelWeights {
 public:
  // host: bound with WeightLoadOptions{.f32_cache_bytes = 0} so matrices are
  // mmapped views. show_progress draws the bar on stderr.
  static StatusOr<CudaModelWeights> upload(const ModelConfig& config, const ModelWeights& host,
                                           bool show_progress);
  // Uniform weights with std 0.02 (initializer_range), norms 1, biases 0.
  static StatusOr<CudaModelWeights> random(const ModelConfig& config, uint64_t seed);

  __nv_bfloat16* embed_tokens = nullptr;  // [vocab, hidden]
  __nv_bfloat16* lm_head = nullptr;       // [vocab, hidden]; == embed_tokens when tied
  float* final_norm = nullptr;            // [hidden]
  std::vector<CudaLayerWeights> layers;  // empty for DeepSeek (MLA) configs: CudaDeepseekWeights holds those

  size_t total_bytes() const { return total_bytes_; }

 private:
  StatusOr<void*> allocate(size_t bytes);
  std::vector<DeviceBuffer> buffers_;
  size_t total_bytes_ = 0;
};

// Converts a [rows, cols] matrix in its file dtype (f32 / f16 / bf16) into bf16 rows at dst (host).
void matrix_to_bf16(const WeightMatrix& m, uint16_t* dst);

// Bytes of bf16 matrices (+ f32 vectors) the GPU copy of `config` takes.
size_t cuda_weight_bytes(const ModelConfig& config);

}  // namespace pagoda::cuda
