#pragma once
// Megatron-style tensor parallelism of the llama family (docs/TENSOR_PARALLEL.md):
// which part of every weight rank r of N holds, the config its forward runs
// with, and the sliced weights.
//
// Rank r holds query heads [r*Hq/N, (r+1)*Hq/N) and their KV heads: KV heads
// [r*Hkv/N, ...) when Hkv >= N, else the one KV head its query heads share
// (replicated on N/Hkv ranks); the rows of q/k/v_proj for those heads and of
// gate/up_proj for intermediate features [r*I/N, (r+1)*I/N) (column-parallel:
// zero-copy views into the mmapped checkpoint); the matching columns of o_proj
// and down_proj (row-parallel: the rank's slice is copied once, since a column
// range is not contiguous in a row-major matrix; the N slices together are one
// copy of those matrices, never a copy per rank); vocabulary rows
// [r*C, min(V, (r+1)*C)) of embed_tokens and lm_head with C = ceil(V/N)
// (vocab-parallel, views). o_proj's and down_proj's biases stay on rank 0
// only, so they count once in the all-reduce.
//
// Thread safety: plain functions and data.

#include <cstdint>
#include <memory>

#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"

namespace pagoda {

struct TensorShard {
  int32_t rank = 0;
  int32_t size = 1;
  int32_t q_head_begin = 0, num_q_heads = 0;
  int32_t kv_head_begin = 0, num_kv_heads = 0;
  int32_t intermediate_begin = 0, intermediate_size = 0;
  int32_t vocab_begin = 0, vocab_end = 0;  // this rank's vocabulary rows
  int32_t vocab_chunk = 0;                 // ceil(vocab / size): every rank's logits width in the all-gather
};

// Whether `config` can run on `size` ranks. Errors name --tensor-parallel-size
// and the numbers: size < 1 (kInvalidArgument), an architecture or checkpoint
// without a sharded forward (DeepSeek MLA/MoE: kUnimplemented), attention heads, KV heads or intermediate size that the
// ranks do not split evenly (kInvalidArgument).
Status check_tensor_parallel(const ModelConfig& config, int32_t size);

// Rank `rank`'s part; config must pass check_tensor_parallel(config, size).
TensorShard tensor_shard(const ModelConfig& config, int32_t rank, int32_t size);

// The config a rank's forward runs with: its query heads, KV heads and
// intermediate size; vocab_size and everything else stay the model's.
ModelConfig shard_config(const ModelConfig& config, const TensorShard& shard);

// Rank shard's weights from the whole model's (bound by bind_model_weights or
// random: f32/f16/bf16 matrices, or an fp8 checkpoint's), which the result
// keeps alive. fp8 scales are sliced with their matrices: per-channel scales
// follow the rows of a column-parallel slice (and stay whole for a
// row-parallel one), a per-tensor scale and static input scale are
// replicated, block scales are cut at the rank's blocks. Errors: matrices
// quantized by --quantization (kUnimplemented), shapes that do not fit the
// config, fp8 scale blocks (or grouped activation scales) that the rank's rows
// or columns would cut, naming the tensor, its shape, the blocks and the
// rank's range (kInvalidArgument).
StatusOr<ModelWeights> shard_model_weights(const ModelConfig& config, std::shared_ptr<const ModelWeights> whole,
                                           const TensorShard& shard);

}  // namespace pagoda
