#pragma once
// --quantization int8|int4|fp8 on the CPU: quantizes a model's linear
// weights at load from their f32/f16/bf16 form. int8/int4: blocks of 32
// (backend/cpu/kernels/quant_dot.h formats), read by integer dot products.
// fp8: e4m3 bytes with one f32 scale per output row (amax / 448) and dynamic
// per-token fp8 activations (model/fp8_matrix.h), the reference of the GPU's
// fp8 GEMMs; lm_head stays as loaded, as vLLM's online fp8 leaves it.
//
// Quantized: every layer matrix (attention and MLP projections) and, with
// int8/int4, lm_head. With int4, lm_head is int8 (as llama.cpp keeps its output matrix at higher
// precision in its 4-bit types). The embedding table stays as loaded (it is
// gathered, not multiplied). DeepSeek (MLA/MoE) models are refused: their
// attention slices kv_b_proj per head, which a block layout does not allow yet.
//
// Thread safety: call once, before the model runs; uses ThreadPool::global().

#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"

namespace pagoda {

// The scheme --quantization fp8 applies (format kOnline), for reports.
Fp8QuantConfig online_fp8_config();

// dtype: kInt8, kInt4 or kFP8E4M3. Errors (naming --quantization): weights already
// quantized (a matrix not f32/f16/bf16, or quantized before), an MLA/MoE
// model, another dtype. Memory: the f32 copies made for random weights that
// are no longer referenced are released.
Status quantize_model_weights(const ModelConfig& config, ModelWeights& weights, DType dtype);

}  // namespace pagoda
