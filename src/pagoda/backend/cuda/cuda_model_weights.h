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
// fp8 projections (docs/CPU_QUANT.md "What runs where"): an FP8 checkpoint's
// q|k|v, o, gate|up and down upload as e4m3 bytes with their scales when the
// stacked parts agree on a scheme the GPU's fp8 GEMMs run (tensor or channel
// weight scales with dynamic per-token or static activations; 128x128 blocks
// with per-token groups of 128 on devices with block scales), and dequantized to
// bf16 otherwise (any other scheme, or parts that disagree). With
// Fp8UploadOptions::quantize (--quantization fp8) f32/f16/bf16 projections are
// quantized at load, one scale per output channel, by model/fp8_matrix.h's
// quantize_fp8_row: the CPU's arithmetic, byte for byte.
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

// One projection's fp8 form; data == nullptr: the projection runs bf16.
struct CudaFp8Weight {
  uint8_t* data = nullptr;        // e4m3 [rows, cols]
  float* scales = nullptr;        // per output channel [rows], or block128's [ceil(rows/128)][stride]
  float* input_scale = nullptr;   // static activations: one f32 (the largest of the stacked parts'); null: dynamic
  bool block128 = false;          // 128x128 weight blocks, per-token groups of 128 (fp8_gemm.h linear_block128)
};

struct Fp8UploadOptions {
  bool quantize = false;          // --quantization fp8: f32/f16/bf16 projections to fp8 (per channel)
  bool block128_supported = false;  // the device runs 128x128 block scales (Fp8Gemm::block128_supported)
  // Also an e4m3 copy of the lm_head (lm_head_fp8) where its scheme allows it (an fp8 checkpoint lm_head,
  // or any lm_head with quantize): the bf16 lm_head stays for the steps that run the GEMM.
  bool lm_head = false;
};

struct CudaLayerWeights {
  __nv_bfloat16* qkv_proj = nullptr;      // [(Hq + 2 Hkv) * D, hidden]
  __nv_bfloat16* o_proj = nullptr;        // [hidden, Hq * D]
  __nv_bfloat16* gate_up_proj = nullptr;  // [2 * intermediate, hidden]
  __nv_bfloat16* down_proj = nullptr;     // [hidden, intermediate]
  // fp8 forms of the four projections (the bf16 pointer is null where one is set).
  CudaFp8Weight qkv_fp8, o_fp8, gate_up_fp8, down_fp8;
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
                                           bool show_progress, const Fp8UploadOptions& fp8 = {});
  // Uniform weights with std 0.02 (initializer_range), norms 1, biases 0. quantize_fp8: the
  // projections then become e4m3 with one scale per output channel (quantized on the GPU).
  // fp8_lm_head (with quantize_fp8): lm_head_fp8 as well, per output channel.
  static StatusOr<CudaModelWeights> random(const ModelConfig& config, uint64_t seed, bool quantize_fp8 = false,
                                           bool fp8_lm_head = false);

  __nv_bfloat16* embed_tokens = nullptr;  // [vocab, hidden]
  __nv_bfloat16* lm_head = nullptr;       // [vocab, hidden]; == embed_tokens when tied
  // e4m3 form of lm_head (Fp8UploadOptions::lm_head), data null when absent; input_scale is not used (the
  // lm_head runs it as a weight-only GEMV only).
  CudaFp8Weight lm_head_fp8;
  float* final_norm = nullptr;            // [hidden]
  std::vector<CudaLayerWeights> layers;  // empty for DeepSeek (MLA) configs: CudaDeepseekWeights holds those

  size_t total_bytes() const { return total_bytes_; }
  // Projections running fp8, of 4 per layer.
  int32_t fp8_projections() const { return fp8_projections_; }
  bool has_fp8() const { return fp8_projections_ > 0; }

 private:
  StatusOr<void*> allocate(size_t bytes);
  void release(const void* data);  // frees a buffer allocate() returned
  int32_t fp8_projections_ = 0;
  std::vector<DeviceBuffer> buffers_;
  size_t total_bytes_ = 0;
};

// Converts a [rows, cols] matrix in its file dtype (f32 / f16 / bf16) into bf16 rows at dst (host).
void matrix_to_bf16(const WeightMatrix& m, uint16_t* dst);

// Bytes of bf16 matrices (+ f32 vectors) the GPU copy of `config` takes.
size_t cuda_weight_bytes(const ModelConfig& config);

}  // namespace pagoda::cuda
