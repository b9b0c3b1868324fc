#include "pagoda/model/deepseek_config.h"

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/model/model_config.h"

namespace pagoda {

namespace {

using nlohmann::json;

// Typed reads of optional fields; absent or null gives the fallback (transformers' default).
class FieldReader {
 public:
  FieldReader(const json& j, std::string_view source) : j_(j), source_(source) {}

  bool present(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it != obj.end() && !it->is_null();
  }
  bool present(const char* key) const { return present(j_, key); }

  // An int >= min_value.
  StatusOr<int32_t> integer(const char* key, int32_t fallback, int32_t min_value = 1) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < min_value || it->get<int64_t>() > INT32_MAX)
      return invalid_argument_error("{}: field '{}' must be an integer >= {} (got {})", source_, key, min_value,
                                    it->dump());
    return static_cast<int32_t>(it->get<int64_t>());
  }
  StatusOr<double> number(const json& obj, const char* key, double fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number()) return invalid_argument_error("{}: field '{}' must be a number (got {})", source_, key,
                                                        it->dump());
    return it->get<double>();
  }
  StatusOr<bool> boolean(const json& obj, const char* key, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return invalid_argument_error("{}: field '{}' must be true or false", source_, key);
    return it->get<bool>();
  }
  StatusOr<std::string> string(const char* key, const char* fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::string(fallback);
    if (!it->is_string()) return invalid_argument_error("{}: field '{}' must be a string", source_, key);
    return it->get<std::string>();
  }

 private:
  const json& j_;
  std::string_view source_;
};

// The rope: rope_parameters (transformers 5) or rope_theta + rope_scaling (the Hub's configs).
Status parse_rope(const json& j, const FieldReader& r, std::string_view source, ModelConfig& cfg) {
  const json* params = nullptr;
  double theta = 10000.0;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) return invalid_argument_error("{}: '{}' must be an object", source, key);
    params = &*it;
    break;
  }
  if (params != nullptr) {
    PAGODA_ASSIGN_OR_RETURN(theta, r.number(*params, "rope_theta", theta));
  }
  PAGODA_ASSIGN_OR_RETURN(theta, r.number(j, "rope_theta", theta));
  if (!(theta > 1.0)) return invalid_argument_error("{}: rope_theta must be > 1 (got {})", source, theta);
  cfg.rope_theta = static_cast<float>(theta);
  std::string type = "default";
  if (params != nullptr) {
    for (const char* key : {"rope_type", "type"}) {
      auto it = params->find(key);
      if (it != params->end() && it->is_string()) {
        type = it->get<std::string>();
        break;
      }
    }
  }
  if (type == "default") return ok_status();
  if (type != "yarn")
    return unimplemented_error("{}: rope type '{}' is not supported for {} (supported: default, yarn)", source,
                               type, cfg.architecture_name);
  YarnRopeScaling y;
  PAGODA_ASSIGN_OR_RETURN(double original, r.number(*params, "original_max_position_embeddings", 0.0));
  if (!(original >= 1.0) || original != std::floor(original))
    return invalid_argument_error("{}: yarn rope needs a positive integer original_max_position_embeddings", source);
  y.original_max_position_embeddings = static_cast<int32_t>(original);
  PAGODA_ASSIGN_OR_RETURN(y.factor, r.number(*params, "factor", static_cast<double>(cfg.max_position_embeddings) /
                                                                     original));
  if (!(y.factor > 0.0)) return invalid_argument_error("{}: yarn rope factor must be > 0 (got {})", source, y.factor);
  PAGODA_ASSIGN_OR_RETURN(y.beta_fast, r.number(*params, "beta_fast", 32.0));
  PAGODA_ASSIGN_OR_RETURN(y.beta_slow, r.number(*params, "beta_slow", 1.0));
  PAGODA_ASSIGN_OR_RETURN(y.mscale, r.number(*params, "mscale", 0.0));
  PAGODA_ASSIGN_OR_RETURN(y.mscale_all_dim, r.number(*params, "mscale_all_dim", 0.0));
  PAGODA_ASSIGN_OR_RETURN(y.truncate, r.boolean(*params, "truncate", true));
  if (r.present(*params, "attention_factor")) {
    PAGODA_ASSIGN_OR_RETURN(double factor, r.number(*params, "attention_factor", 1.0));
    y.attention_factor = factor;
  }
  if (r.present(*params, "partial_rotary_factor"))
    return unimplemented_error("{}: rope 'partial_rotary_factor' is not supported for {}", source,
                               cfg.architecture_name);
  cfg.rope_yarn = y;
  return ok_status();
}

Status parse_moe(const json& j, const FieldReader& r, std::string_view source, ModelConfig& cfg) {
  const bool v3 = cfg.architecture == Architecture::kDeepseekV3;
  MoeConfig e;
  if (r.present("moe_layer_freq")) {
    PAGODA_ASSIGN_OR_RETURN(int32_t freq, r.integer("moe_layer_freq", 1));
    if (freq != 1)
      return unimplemented_error("{}: moe_layer_freq {} is not supported (transformers makes every layer from "
                                 "first_k_dense_replace on an MoE layer; 1 only)", source, freq);
  }
  auto explicit_null = [&j](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_null();
  };
  for (const char* key : {"n_routed_experts", "n_shared_experts", "num_experts_per_tok"}) {
    if (explicit_null(key))
      return unimplemented_error("{}: field '{}' is null (a dense {} is not supported)", source, key,
                                 cfg.architecture_name);
  }
  PAGODA_ASSIGN_OR_RETURN(e.num_experts, r.integer("n_routed_experts", v3 ? 256 : 64));
  PAGODA_ASSIGN_OR_RETURN(e.num_shared_experts, r.integer("n_shared_experts", v3 ? 1 : 2, 0));
  if (!v3 && !r.present("num_experts_per_tok"))
    return invalid_argument_error("{}: missing field 'num_experts_per_tok'", source);
  PAGODA_ASSIGN_OR_RETURN(e.experts_per_token, r.integer("num_experts_per_tok", 8));
  PAGODA_ASSIGN_OR_RETURN(e.moe_intermediate_size, r.integer("moe_intermediate_size", v3 ? 2048 : 1407));
  PAGODA_ASSIGN_OR_RETURN(e.first_k_dense_replace, r.integer("first_k_dense_replace", v3 ? 3 : 0, 0));
  PAGODA_ASSIGN_OR_RETURN(double scaling, r.number(j, "routed_scaling_factor", v3 ? 2.5 : 1.0));
  e.routed_scaling_factor = static_cast<float>(scaling);
  PAGODA_ASSIGN_OR_RETURN(e.norm_topk_prob, r.boolean(j, "norm_topk_prob", v3));
  if (e.experts_per_token > e.num_experts)
    return invalid_argument_error("{}: num_experts_per_tok {} exceeds n_routed_experts {}", source,
                                  e.experts_per_token, e.num_experts);

  PAGODA_ASSIGN_OR_RETURN(std::string scoring, r.string("scoring_func", v3 ? "sigmoid" : "softmax"));
  if (scoring != (v3 ? "sigmoid" : "softmax"))
    return unimplemented_error("{}: scoring_func '{}' is not supported for {} ({} only)", source, scoring,
                               cfg.architecture_name, v3 ? "sigmoid" : "softmax");
  if (v3) {
    e.scoring = MoeScoring::kSigmoid;
    e.score_correction_bias = true;
    e.group_score = MoeGroupScore::kTopTwoSum;
    PAGODA_ASSIGN_OR_RETURN(std::string method, r.string("topk_method", "noaux_tc"));
    if (method != "noaux_tc")
      return unimplemented_error("{}: topk_method '{}' is not supported for {} (noaux_tc only)", source, method,
                                 cfg.architecture_name);
    PAGODA_ASSIGN_OR_RETURN(e.num_groups, r.integer("n_group", 8));
    PAGODA_ASSIGN_OR_RETURN(e.topk_groups, r.integer("topk_group", 4));
  } else {
    e.scoring = MoeScoring::kSoftmax;
    PAGODA_ASSIGN_OR_RETURN(std::string method, r.string("topk_method", "greedy"));
    if (method == "group_limited_greedy") {
      e.group_score = MoeGroupScore::kMax;
      if (!r.present("n_group") || !r.present("topk_group"))
        return invalid_argument_error("{}: topk_method group_limited_greedy needs 'n_group' and 'topk_group'", source);
      PAGODA_ASSIGN_OR_RETURN(e.num_groups, r.integer("n_group", 1));
      PAGODA_ASSIGN_OR_RETURN(e.topk_groups, r.integer("topk_group", 1));
    } else if (method != "greedy") {
      return unimplemented_error("{}: topk_method '{}' is not supported for {} (greedy, group_limited_greedy)",
                                 source, method, cfg.architecture_name);
    }
    if (e.norm_topk_prob)
      return unimplemented_error("{}: norm_topk_prob true is not supported for {} (transformers does not apply it "
                                 "to V2 routing while DeepSeek's code does; the result would be ambiguous)",
                                 source, cfg.architecture_name);
  }
  if (e.group_score != MoeGroupScore::kNone) {
    if (e.num_experts % e.num_groups != 0)
      return invalid_argument_error("{}: n_routed_experts {} is not a multiple of n_group {}", source, e.num_experts,
                                    e.num_groups);
    if (e.topk_groups > e.num_groups)
      return invalid_argument_error("{}: topk_group {} exceeds n_group {}", source, e.topk_groups, e.num_groups);
    const int32_t group_size = e.num_experts / e.num_groups;
    if (e.group_score == MoeGroupScore::kTopTwoSum && group_size < 2)
      return invalid_argument_error("{}: each of n_group {} groups needs at least 2 of the {} experts", source,
                                    e.num_groups, e.num_experts);
    if (e.experts_per_token > e.topk_groups * group_size)
      return invalid_argument_error("{}: num_experts_per_tok {} exceeds the {} experts of topk_group {} groups",
                                    source, e.experts_per_token, e.topk_groups * group_size, e.topk_groups);
  }
  if (e.first_k_dense_replace > cfg.num_layers) e.first_k_dense_replace = cfg.num_layers;
  cfg.moe = e;
  return ok_status();
}

}  // namespace

Status parse_deepseek_config(const json& j, std::string_view source, ModelConfig& cfg) {
  FieldReader r(j, source);
  if (r.present("quantization_config"))
    return unimplemented_error("{}: field 'quantization_config' is set: quantized {} weights (e.g. fp8 blocks with "
                               "weight_scale_inv) are not supported; use a bf16/f16/f32 checkpoint", source,
                               cfg.architecture_name);
  PAGODA_ASSIGN_OR_RETURN(bool mlp_bias, r.boolean(j, "mlp_bias", false));
  if (mlp_bias) return unimplemented_error("{}: mlp_bias true is not supported for {}", source, cfg.architecture_name);

  MlaConfig m;
  PAGODA_ASSIGN_OR_RETURN(m.kv_lora_rank, r.integer("kv_lora_rank", 512));
  // null (and 0) mean a plain q_proj; absent takes transformers' default.
  if (!j.contains("q_lora_rank")) {
    m.q_lora_rank = 1536;
  } else {
    PAGODA_ASSIGN_OR_RETURN(m.q_lora_rank, r.integer("q_lora_rank", 0, 0));
  }
  PAGODA_ASSIGN_OR_RETURN(m.qk_nope_head_dim, r.integer("qk_nope_head_dim", 128));
  PAGODA_ASSIGN_OR_RETURN(m.qk_rope_head_dim, r.integer("qk_rope_head_dim", 64));
  PAGODA_ASSIGN_OR_RETURN(m.v_head_dim, r.integer("v_head_dim", 128));
  if (m.qk_rope_head_dim % 2 != 0)
    return invalid_argument_error("{}: qk_rope_head_dim must be even (got {})", source, m.qk_rope_head_dim);
  if (cfg.architecture == Architecture::kDeepseekV3) {
    PAGODA_ASSIGN_OR_RETURN(m.rope_interleave, r.boolean(j, "rope_interleave", true));
  }  // DeepSeek-V2 always rotates interleaved pairs.
  PAGODA_ASSIGN_OR_RETURN(m.attention_bias, r.boolean(j, "attention_bias", false));

  PAGODA_RETURN_IF_ERROR(parse_rope(j, r, source, cfg));
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head_dim()));
  if (cfg.rope_yarn) {
    scale *= deepseek_softmax_mscale(*cfg.rope_yarn);
    m.rope_attention_factor = static_cast<float>(yarn_attention_factor(*cfg.rope_yarn));
  }
  m.softmax_scale = static_cast<float>(scale);
  cfg.mla = m;
  PAGODA_RETURN_IF_ERROR(parse_moe(j, r, source, cfg));

  // The cache holds one latent vector per token and layer.
  cfg.num_kv_heads = 1;
  cfg.head_dim = m.latent_dim();
  return ok_status();
}

}  // namespace pagoda
