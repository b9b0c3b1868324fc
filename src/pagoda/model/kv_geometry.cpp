#include "pagoda/model/kv_geometry.h"

namespace pagoda {

KvPoolShape model_kv_pool_shape(const ModelConfig& c, int32_t num_blocks, int32_t block_size, DType key_dtype,
                                DType value_dtype) {
  KvPoolShape shape{c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, key_dtype, value_dtype};
  if (c.mla) {
    shape.num_kv_heads = 1;
    shape.head_dim = c.mla->latent_dim();
    shape.latent = true;
    shape.latent_rope_dim = c.mla->qk_rope_head_dim;
  }
  return shape;
}

KvShape model_kv_shape(const ModelConfig& c) {
  KvShape s;
  s.layers = c.num_layers;
  s.query_heads = c.num_q_heads;
  if (c.mla) {
    s.mla_latent_dim = c.mla->kv_lora_rank;
    s.mla_rope_dim = c.mla->qk_rope_head_dim;
    s.head_dim = c.mla->qk_head_dim();
    s.v_head_dim = c.mla->v_head_dim;
    return s;
  }
  s.kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  return s;
}

}  // namespace pagoda
