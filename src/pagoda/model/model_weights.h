#pragma once
// The weights of a llama-family model (Llama, Mistral, Qwen2, Qwen3) or a
// DeepSeek V2/V3 model (MLA + MoE, model/deepseek_weights.h) bound to the
// tensors of a Checkpoint and checked against the ModelConfig: every
// expected tensor present, shape as the config implies, dtype equal to the
// config's torch_dtype (or, without one, the same across tensors). Errors name
// the tensor and the file it came from.
//
// Matrices stay zero-copy views into the mmapped files in their file dtype
// unless the whole set of matrices fits in f32_cache_bytes when converted to
// f32; then they are upcast once at load. The default budget is 0: decode is
// memory-bound and reads bf16/f16 rows directly (half the bytes of f32), and
// prefill converts cache-sized tiles on the fly, so an upcast only pays for
// prefill-heavy use of small models. Vectors (norms, biases) are always
// converted to f32 (they are tiny).
//
// Thread safety: immutable after binding.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/model/weight_matrix.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/deepseek_weights.h"
#include "pagoda/model/model_config.h"

namespace pagoda {

struct LayerWeights {
  WeightMatrix q_proj, k_proj, v_proj, o_proj;  // [heads * head_dim, hidden] etc.
  WeightMatrix gate_proj, up_proj, down_proj;
  std::vector<float> input_norm;           // [hidden]
  std::vector<float> post_attention_norm;  // [hidden]
  std::vector<float> q_norm, k_norm;       // [head_dim], Qwen3 only
  std::vector<float> q_bias, k_bias, v_bias, o_bias;       // empty when the model has none
  std::vector<float> gate_bias, up_bias, down_bias;        // Llama mlp_bias only
  // Per-tensor fp8 KV scales calibrated into the checkpoint (self_attn.k_scale /
  // self_attn.v_scale, the names vLLM and llm-compressor use); 0: absent. With
  // an fp8 KV cache they replace the per-vector amax scale (kernels/kv_write.h).
  float k_scale = 0.0f;
  float v_scale = 0.0f;
  // DeepSeek: the latent attention (q/k/v_proj stay empty) and, from
  // first_k_dense_replace on, the experts (gate/up/down_proj stay empty).
  MlaLayerWeights mla;
  MoeLayerWeights moe;

  // Every bound matrix of the layer (empty ones left out), e.g. to count or upcast them.
  std::vector<WeightMatrix*> matrices();
  std::vector<const WeightMatrix*> matrices() const;
};

struct ModelWeights {
  WeightMatrix embed_tokens;  // [vocab, hidden]
  WeightMatrix lm_head;       // [vocab, hidden]; == embed_tokens when tied
  std::vector<float> final_norm;       // [hidden]
  std::vector<LayerWeights> layers;
  DType file_dtype = DType::kF32;      // dtype of the matrices in the checkpoint
  bool upcast_to_f32 = false;          // matrices were converted to f32 at load

  std::shared_ptr<const Checkpoint> checkpoint;       // keeps the mappings alive
  std::vector<std::unique_ptr<float[]>> owned_f32;    // upcast matrices, fp8 scales
  // An FP8 checkpoint's scheme (its Linear weights are kFP8E4M3 with scales
  // unless the scheme skips them), or --quantization fp8's; nullopt: none.
  std::optional<Fp8QuantConfig> fp8;
  // --quantization: the CPU backend's block-quantized matrices (backend/cpu/quantize_weights.h).
  std::optional<DType> quantization;                  // kInt8 or kInt4 once quantized
  std::vector<std::unique_ptr<uint8_t[]>> owned_quantized;
  // A tensor-parallel rank's weights (model/tensor_shard.h): the whole model's
  // weights its views point into, and its copied row-parallel slices.
  std::shared_ptr<const ModelWeights> whole;
  std::vector<std::unique_ptr<uint8_t[]>> owned_slices;
};

struct WeightLoadOptions {
  // Upcast all matrices to f32 at load when they need at most this many bytes as f32.
  size_t f32_cache_bytes = 0;
  std::function<void(const std::string&)> progress;  // optional, one line per step
};

StatusOr<ModelWeights> bind_model_weights(const ModelConfig& config,
                                          std::shared_ptr<const Checkpoint> checkpoint,
                                          const WeightLoadOptions& options = {});

}  // namespace pagoda
