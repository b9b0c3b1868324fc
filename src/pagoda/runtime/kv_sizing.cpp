#include "pagoda/runtime/kv_sizing.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "pagoda/runtime/cross_layer_share.h"
#include "pagoda/runtime/kv_quant.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda {

std::string_view attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kMHA: return "MHA";
    case AttentionKind::kGQA: return "GQA";
    case AttentionKind::kMQA: return "MQA";
    case AttentionKind::kMLA: return "MLA";
  }
  return "?";
}

AttentionKind KvShape::kind() const {
  if (is_mla()) return AttentionKind::kMLA;
  if (kv_heads == 1 && query_heads > 1) return AttentionKind::kMQA;
  if (kv_heads < query_heads) return AttentionKind::kGQA;
  return AttentionKind::kMHA;
}

int64_t KvShape::values_per_token_per_layer() const {
  if (is_mla()) return mla_latent_dim + mla_rope_dim;
  return kv_heads * (head_dim + (v_head_dim > 0 ? v_head_dim : head_dim));
}

KvShape mha_equivalent(const KvShape& s) {
  KvShape mha;
  mha.layers = s.layers;
  mha.query_heads = s.query_heads;
  mha.kv_heads = s.query_heads;
  mha.head_dim = s.head_dim;
  mha.v_head_dim = s.v_head_dim;
  return mha;
}

int64_t kv_vector_bytes(int64_t elements, DType dtype) {
  // The quantized formats' bytes come from runtime/kv_quant.h, which the
  // kernels read and write: codes plus 4-byte scale records.
  using kernels::KvQuant;
  const auto quantized = [elements](KvQuant q) {
    const int32_t n = static_cast<int32_t>(elements);
    return static_cast<int64_t>(kernels::kv_head_data_bytes(n, q)) +
           static_cast<int64_t>(kernels::kv_scale_groups(n, q)) * static_cast<int64_t>(sizeof(kernels::KvScaleZero));
  };
  switch (dtype) {
    case DType::kF32: return elements * 4;
    case DType::kF16:
    case DType::kBF16: return elements * 2;
    case DType::kFP8E4M3: return quantized(KvQuant::kFP8E4M3);
    case DType::kInt8: return quantized(KvQuant::kInt8);
    case DType::kInt4: return quantized(KvQuant::kInt4);
  }
  return 0;
}

int64_t mla_vector_bytes(int64_t latent, int64_t rope, DType dtype) {
  if (dtype == DType::kFP8E4M3)
    return kernels::mla_fp8_record_bytes(static_cast<int32_t>(latent), static_cast<int32_t>(rope));
  return kv_vector_bytes(latent + rope, dtype);
}

int64_t kv_bytes_per_token(const KvShape& s, DType k_dtype, DType v_dtype) {
  if (s.is_mla()) {
    // The latent and the rope key are stored as one vector per token and layer.
    return s.layers * mla_vector_bytes(s.mla_latent_dim, s.mla_rope_dim, k_dtype);
  }
  int64_t v_dim = s.v_head_dim > 0 ? s.v_head_dim : s.head_dim;
  const runtime::CrossLayerShare share{static_cast<int32_t>(s.layers), static_cast<int32_t>(s.cross_layer_share)};
  const int64_t per_slot = s.kv_heads * (kv_vector_bytes(s.head_dim, k_dtype) + kv_vector_bytes(v_dim, v_dtype));
  // A shared slot also holds, per KV head, a K and a V record of f32 norms (runtime/cross_layer_share.h).
  const int64_t norms = s.kv_heads * 2 * share.norm_record() * static_cast<int64_t>(sizeof(float));
  return share.num_slots() * per_slot + share.num_shared_slots() * norms;
}

namespace {

StatusOr<int64_t> positive_field(const nlohmann::json& c, const char* name) {
  auto it = c.find(name);
  if (it == c.end() || it->is_null()) return not_found_error("config.json has no field '{}'", name);
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    return invalid_argument_error("config.json field '{}' must be a positive integer, got {}", name, it->dump());
  return it->get<int64_t>();
}

bool has_field(const nlohmann::json& c, const char* name) {
  auto it = c.find(name);
  return it != c.end() && !it->is_null();
}

}  // namespace

StatusOr<KvShape> kv_shape_from_config(const nlohmann::json& config) {
  if (!config.is_object()) return invalid_argument_error("config.json must hold a JSON object");
  // Multimodal configs keep the language model under text_config.
  const nlohmann::json& c = config.contains("text_config") && config["text_config"].is_object()
                                ? config["text_config"] : config;
  KvShape s;
  PAGODA_ASSIGN_OR_RETURN(s.layers, positive_field(c, "num_hidden_layers"));
  PAGODA_ASSIGN_OR_RETURN(s.query_heads, positive_field(c, "num_attention_heads"));
  if (has_field(c, "kv_lora_rank")) {
    PAGODA_ASSIGN_OR_RETURN(s.mla_latent_dim, positive_field(c, "kv_lora_rank"));
    PAGODA_ASSIGN_OR_RETURN(s.mla_rope_dim, positive_field(c, "qk_rope_head_dim"));
    // Per-head dims of the decompressed attention (transformers' defaults when absent).
    int64_t nope = 128;
    s.v_head_dim = 128;
    if (has_field(c, "qk_nope_head_dim")) {
      PAGODA_ASSIGN_OR_RETURN(nope, positive_field(c, "qk_nope_head_dim"));
    }
    if (has_field(c, "v_head_dim")) {
      PAGODA_ASSIGN_OR_RETURN(s.v_head_dim, positive_field(c, "v_head_dim"));
    }
    s.head_dim = nope + s.mla_rope_dim;
    return s;
  }
  if (has_field(c, "num_key_value_heads")) {
    PAGODA_ASSIGN_OR_RETURN(s.kv_heads, positive_field(c, "num_key_value_heads"));
  } else {
    s.kv_heads = s.query_heads;
  }
  if (s.query_heads % s.kv_heads != 0)
    return invalid_argument_error("config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                  s.query_heads, s.kv_heads);
  if (has_field(c, "head_dim")) {
    PAGODA_ASSIGN_OR_RETURN(s.head_dim, positive_field(c, "head_dim"));
  } else {
    PAGODA_ASSIGN_OR_RETURN(int64_t hidden, positive_field(c, "hidden_size"));
    if (hidden % s.query_heads != 0)
      return invalid_argument_error("config.json: hidden_size {} is not a multiple of num_attention_heads {}",
                                    hidden, s.query_heads);
    s.head_dim = hidden / s.query_heads;
  }
  return s;
}

StatusOr<KvCapacity> kv_capacity(const KvShape& shape, DType k_dtype, DType v_dtype, int64_t budget_bytes,
                                 int64_t block_size, int64_t tokens_per_request) {
  if (budget_bytes <= 0) return invalid_argument_error("KV memory budget must be positive, got {} bytes", budget_bytes);
  if (block_size <= 0) return invalid_argument_error("KV block size must be positive, got {}", block_size);
  if (tokens_per_request < 0)
    return invalid_argument_error("tokens per request must be >= 0, got {}", tokens_per_request);
  KvCapacity c;
  c.bytes_per_token = kv_bytes_per_token(shape, k_dtype, v_dtype);
  if (c.bytes_per_token <= 0) return invalid_argument_error("the KV shape holds no bytes per token");
  c.blocks = budget_bytes / (c.bytes_per_token * block_size);
  c.tokens = c.blocks * block_size;
  if (tokens_per_request > 0) c.requests = c.blocks / ((tokens_per_request + block_size - 1) / block_size);
  return c;
}

std::string format_kv_cache_line(const KvShape& shape, DType k_dtype, DType v_dtype, int64_t budget_bytes,
                                 int64_t block_size) {
  const std::string dtypes = shape.is_mla() ? fmt::format("{} (latent)", dtype_name(k_dtype))
                                            : fmt::format("{} (K) / {} (V)", dtype_name(k_dtype), dtype_name(v_dtype));
  const int64_t bf16 = kv_bytes_per_token(shape, DType::kBF16);
  auto capacity = kv_capacity(shape, k_dtype, v_dtype, std::max<int64_t>(budget_bytes, 1), block_size);
  const int64_t per_token = kv_bytes_per_token(shape, k_dtype, v_dtype);
  const int64_t tokens = capacity.ok() && budget_bytes > 0 ? capacity->tokens : 0;
  std::string kind;
  std::string comparison;
  if (shape.is_mla()) {
    kind = fmt::format("MLA, {} values/token/layer (latent {} + rope {}), ", shape.values_per_token_per_layer(),
                       shape.mla_latent_dim, shape.mla_rope_dim);
    const int64_t mha = kv_bytes_per_token(mha_equivalent(shape), DType::kBF16);
    if (mha > 0) comparison = fmt::format("; MHA K/V in bf16: {} B", format_with_commas(mha));
  }
  if (shape.cross_layer_share > 1 && !shape.is_mla()) {
    const runtime::CrossLayerShare share{static_cast<int32_t>(shape.layers), static_cast<int32_t>(shape.cross_layer_share)};
    KvShape unshared = shape;
    unshared.cross_layer_share = 1;
    kind = fmt::format("cross-layer share {} (layers {}-{} in groups, {} of {} layers' K/V stored; unshared: {} B/token), ",
                       shape.cross_layer_share, share.first_shared(), shape.layers - 1, share.num_slots(), shape.layers,
                       format_with_commas(kv_bytes_per_token(unshared, k_dtype, v_dtype)));
  }
  return fmt::format("KV cache: {}{}, {} B/token (bf16: {} B{}), {} tokens fit in {}", kind, dtypes,
                     format_with_commas(per_token), format_with_commas(bf16), comparison, format_with_commas(tokens),
                     format_bytes(static_cast<double>(std::max<int64_t>(budget_bytes, 0))));
}

std::string format_with_commas(int64_t value) {
  const std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out = value < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

StatusOr<int64_t> parse_byte_size(std::string_view text) {
  std::string t(text);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' || t[i] == 'e' ||
                          t[i] == 'E' || ((t[i] == '+' || t[i] == '-') && i > 0 && (t[i - 1] == 'e' || t[i - 1] == 'E'))))
    ++i;
  if (i == 0) return invalid_argument_error("'{}' is not a byte size (examples: 80GiB, 16GB, 1.5e9)", text);
  char* end = nullptr;
  std::string number = t.substr(0, i);
  double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value) || value < 0)
    return invalid_argument_error("'{}' is not a byte size (examples: 80GiB, 16GB, 1.5e9)", text);
  std::string unit = t.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kb" || unit == "k") mult = 1e3;
  else if (unit == "mb" || unit == "m") mult = 1e6;
  else if (unit == "gb" || unit == "g") mult = 1e9;
  else if (unit == "tb" || unit == "t") mult = 1e12;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else return invalid_argument_error("'{}': unknown unit '{}' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", text, unit);
  double bytes = value * mult;
  if (bytes > 9.0e18) return out_of_range_error("'{}' is too large", text);
  return static_cast<int64_t>(std::llround(bytes));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) { bytes /= 1024.0; ++u; }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

}  // namespace pagoda
