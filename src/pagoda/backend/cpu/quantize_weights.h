#pragma once
// --quantization int8|int4 on the CPU: block-quantizes a model's linear
// weights at load (backend/cpu/kernels/quant_dot.h formats) from their
// f32/f16/bf16 form, so kernels::linear() reads them with integer dot products.
//
// Quantized: every layer matrix (attention and MLP projections) and lm_head.
// With int4, lm_head is int8 (as llama.cpp keeps its output matrix at higher
// precision in its 4-bit types). The embedding table stays as loaded (it is
// gathered, not multiplied). DeepSeek (MLA/MoE) models are refused: their
// attention slices kv_b_proj per head, which a block layout does not allow yet.
//
// Thread safety: call once, before the model runs; uses ThreadPool::global().

#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"

namespace pagoda {

// dtype: kInt8 or kInt4. Errors (naming --quantization): weights already
// quantized (a matrix not f32/f16/bf16, or quantized before), an MLA/MoE
// model, another dtype. Memory: the f32 copies made for random weights that
// are no longer referenced are released.
Status quantize_model_weights(const ModelConfig& config, ModelWeights& weights, DType dtype);

}  // namespace pagoda
