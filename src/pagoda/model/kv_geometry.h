#pragma once
// The KV cache a model needs, from its config: the paged pool shape a backend
// allocates (K and V pools of num_kv_heads x head_dim, or for an MLA model one
// latent pool of kv_lora_rank + qk_rope_head_dim) and the KvShape that
// kv_sizing counts bytes with (runtime/kv_sizing.h).
//
// Thread safety: plain functions.

#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/kv_pool_shape.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda {

// For MLA the pool is `latent` with key_dtype as the latent's dtype; a
// value_dtype that differs is kept so the pool can refuse it by name.
KvPoolShape model_kv_pool_shape(const ModelConfig& config, int32_t num_blocks, int32_t block_size, DType key_dtype,
                                DType value_dtype);

KvShape model_kv_shape(const ModelConfig& config);

}  // namespace pagoda
