#pragma once
// KV-cache sizing: how many bytes one token's K and V take in every layer, for
// each attention kind (MHA / GQA / MQA through kv_heads, MLA latent + rope
// dims) and each KV dtype, scales included. This file is the single source of
// truth for the quantized layouts, so `pagoda kvcalc`, the server's start-up
// report and the pool allocator agree:
//
//   bf16 / f16  2 bytes per element
//   fp8 e4m3    1 byte per element + one f32 scale per (token, head)
//   int8        1 byte per element + f16 scale and f16 zero point per (token, head)
//   int4        half a byte per element + f16 scale and f16 zero per group of 32
//               elements (a head dim not divisible by 32 ends with a short group)
//
// An MLA layer caches one latent vector (kv_lora_rank) plus the decoupled rope
// key (qk_rope_head_dim) per token, shared by all heads: no separate V. Its
// KvShape keeps the per-head K and V dims as well (head_dim = qk_nope_head_dim +
// qk_rope_head_dim, v_head_dim), so the report can say what MHA caching of the
// same model would take.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"

namespace pagoda {

enum class AttentionKind { kMHA, kGQA, kMQA, kMLA };
std::string_view attention_kind_name(AttentionKind kind);

struct KvShape {
  int64_t layers = 0;
  int64_t query_heads = 0;
  int64_t kv_heads = 0;   // unused for MLA
  int64_t head_dim = 0;   // K head dim (and V unless v_head_dim is set); MLA: per-head K dim, for comparison only
  int64_t v_head_dim = 0; // 0: same as head_dim
  int64_t mla_latent_dim = 0;  // kv_lora_rank; > 0 means MLA
  int64_t mla_rope_dim = 0;    // qk_rope_head_dim
  // --kv-cross-layer-share K (runtime/cross_layer_share.h): groups of K upper layers store one K/V plus
  // per-token norm records; 1: off. Not for MLA.
  int64_t cross_layer_share = 1;

  bool is_mla() const { return mla_latent_dim > 0; }
  AttentionKind kind() const;
  // Values cached per token in one layer: kv_heads x (K dim + V dim), or for MLA latent + rope.
  int64_t values_per_token_per_layer() const;
};

// The same model caching full K and V for every query head (MHA): for MLA the
// per-head K dim and V dim of the decompressed attention. A shape without those
// dims (head_dim 0) comes back with no bytes.
KvShape mha_equivalent(const KvShape& shape);

// Bytes of one cached vector of `elements` values in `dtype`, scales included.
int64_t kv_vector_bytes(int64_t elements, DType dtype);

// Bytes of one cached MLA vector (latent + rope values) in `dtype`: fp8 is the
// self-contained record of runtime/mla_fp8_layout.h (656 B for 512 + 64), every
// other dtype kv_vector_bytes(latent + rope, dtype).
int64_t mla_vector_bytes(int64_t latent, int64_t rope, DType dtype);

// K + V bytes per token over all layers (scales included).
int64_t kv_bytes_per_token(const KvShape& shape, DType k_dtype, DType v_dtype);
inline int64_t kv_bytes_per_token(const KvShape& shape, DType dtype) {
  return kv_bytes_per_token(shape, dtype, dtype);
}

// Reads the attention geometry from a Hugging Face config.json: num_hidden_layers,
// num_attention_heads, num_key_value_heads (default: the query heads), head_dim
// (default hidden_size / heads), and for DeepSeek-style MLA kv_lora_rank and
// qk_rope_head_dim (plus qk_nope_head_dim and v_head_dim, default 128 as in
// transformers, for the MHA comparison). Errors name the missing or bad field.
StatusOr<KvShape> kv_shape_from_config(const nlohmann::json& config);

// What a KV memory budget holds: paging rounds every request up to whole blocks.
struct KvCapacity {
  int64_t bytes_per_token = 0;  // K + V, all layers, scales included
  int64_t blocks = 0;           // whole blocks of block_size tokens in the budget
  int64_t tokens = 0;           // blocks * block_size
  int64_t requests = 0;         // concurrent requests of tokens_per_request tokens (0 if not asked)
};
// Errors: non-positive budget, block size or a shape without bytes. tokens_per_request 0: no
// request count.
StatusOr<KvCapacity> kv_capacity(const KvShape& shape, DType k_dtype, DType v_dtype, int64_t budget_bytes,
                                 int64_t block_size, int64_t tokens_per_request = 0);

// The start-up line a server prints, e.g.
//   "KV cache: int8 (K) / int4 (V), 43,008 B/token (bf16: 131,072 B), 24,960 tokens fit in 1.00 GiB"
// For MLA, whose one latent vector has no separate V, the line names the kind,
// the values cached per token per layer and what MHA caching would take, e.g.
// for DeepSeek-V2-Lite's shape:
//   "KV cache: MLA, 576 values/token/layer (latent 512 + rope 64), fp8 (latent), 17,712 B/token
//    (bf16: 31,104 B; MHA K/V in bf16: 276,480 B), 60,608 tokens fit in 1.00 GiB".
// Tokens are whole blocks of block_size.
std::string format_kv_cache_line(const KvShape& shape, DType k_dtype, DType v_dtype, int64_t budget_bytes,
                                 int64_t block_size = 16);

// 327680 -> "327,680".
std::string format_with_commas(int64_t value);

// Parses "80GiB", "16GB", "512MiB", "1.5e9" or a plain byte count.
StatusOr<int64_t> parse_byte_size(std::string_view text);
// 1536 -> "1.50 KiB".
std::string format_bytes(double bytes);

}  // namespace pagoda
