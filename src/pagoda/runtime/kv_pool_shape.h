#pragma once
// The shape of a backend's paged KV memory: what a ModelRunner reports as its
// KV geometry and what the engine's KV manager must agree with (block size and
// block count). Per layer, K and V pools of [num_blocks, block_size,
// num_kv_heads, head_dim] elements of key_dtype / value_dtype, plus scale
// records for the quantized dtypes (runtime/kv_quant.h); the bytes are counted
// by runtime/kv_sizing.h, the one copy of that arithmetic.
//
// An MLA model (DeepSeek V2/V3) caches one latent vector per token and layer
// instead of K and V: `latent` is set, num_kv_heads is 1, head_dim is
// kv_lora_rank + qk_rope_head_dim (the normalized latent, then the rotated rope
// key) and there is no V pool: value_dtype equals key_dtype and counts no bytes.
// latent_rope_dim says where the rope key starts (head_dim - latent_rope_dim);
// an fp8 latent pool stores per token one record of runtime/mla_fp8_layout.h
// (FlashMLA's 656 B for 512 + 64; no scale pool), which needs it.
// Block ids, block tables and copies are the same as for K/V pools.
// latent_pages: how a bf16 latent pool lays out a block's rows
// (runtime/mla_latent_layout.h); token-major everywhere else.

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/runtime/cross_layer_share.h"
#include "pagoda/runtime/kv_sizing.h"
#include "pagoda/runtime/mla_latent_layout.h"

namespace pagoda {

struct KvPoolShape {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Element types of the K and V pools (runtime/kv_quant.h for the quantized
  // formats and their scale pools).
  DType key_dtype = DType::kF32;
  DType value_dtype = DType::kF32;
  bool latent = false;  // MLA: one latent pool per layer, no V pool
  // --kv-cross-layer-share (runtime/cross_layer_share.h): 1 is off; K > 1 stores
  // share().num_slots() layers' worth of K/V plus, for each shared slot, per
  // (token, KV head) a K and a V record of share().norm_record() f32 norms.
  int32_t cross_layer_share = 1;
  int32_t latent_rope_dim = 0;  // MLA: qk_rope_head_dim, the last values of each cached vector
  runtime::MlaLatentPages latent_pages = runtime::MlaLatentPages::kTokenMajor;  // MLA bf16: the block layout

  // Bytes of one cached vector of the latent pool (kv_sizing.h's mla_vector_bytes).
  size_t latent_vector_bytes() const {
    return static_cast<size_t>(mla_vector_bytes(head_dim - latent_rope_dim, latent_rope_dim, key_dtype));
  }

  runtime::CrossLayerShare share() const { return {num_layers, cross_layer_share}; }

  // Elements of one block of one layer's K (or V) pool.
  size_t elements_per_block() const {
    return static_cast<size_t>(block_size) * num_kv_heads * head_dim;
  }
  // Bytes of K plus V (or of the latent) for one token over all layers, scales included (kv_sizing.h).
  size_t bytes_per_token() const {
    if (latent) return static_cast<size_t>(num_layers) * num_kv_heads * latent_vector_bytes();
    const int64_t value_bytes = latent ? 0 : kv_vector_bytes(head_dim, value_dtype);
    const runtime::CrossLayerShare s = share();
    return static_cast<size_t>(s.num_slots()) * num_kv_heads *
               static_cast<size_t>(kv_vector_bytes(head_dim, key_dtype) + value_bytes) +
           static_cast<size_t>(s.num_shared_slots()) * num_kv_heads * 2 * s.norm_record() * sizeof(float);
  }
};

}  // namespace pagoda
