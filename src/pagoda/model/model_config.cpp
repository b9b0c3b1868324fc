#include "pagoda/model/model_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pagoda {

namespace {

using nlohmann::json;

struct ArchitectureName {
  const char* name;
  Architecture architecture;
};
constexpr ArchitectureName kArchitectures[] = {
    {"LlamaForCausalLM", Architecture::kLlama},
    {"MistralForCausalLM", Architecture::kMistral},
    {"Qwen2ForCausalLM", Architecture::kQwen2},
    {"Qwen3ForCausalLM", Architecture::kQwen3},
    {"DeepseekV2ForCausalLM", Architecture::kDeepseekV2},
    {"DeepseekV3ForCausalLM", Architecture::kDeepseekV3},
};

// Reads config fields with type checks; every error names the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string_view source) : j_(j), source_(source) {}

  StatusOr<int32_t> required_int(const char* key, int32_t min_value = 1) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return invalid_argument_error("{}: missing field '{}'", source_, key);
    return checked_int(*it, key, min_value);
  }
  StatusOr<int32_t> optional_int(const char* key, int32_t fallback, int32_t min_value = 1) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    return checked_int(*it, key, min_value);
  }
  StatusOr<float> optional_float(const json& obj, const char* key, float fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number()) return invalid_argument_error("{}: field '{}' must be a number", source_, key);
    return it->get<float>();
  }
  StatusOr<bool> optional_bool(const char* key, bool fallback) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return invalid_argument_error("{}: field '{}' must be true or false", source_, key);
    return it->get<bool>();
  }
  // An int, a list of ints, or absent/null.
  StatusOr<std::vector<int32_t>> token_ids(const json& obj, const char* key) const {
    std::vector<int32_t> ids;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return ids;
    const json list = it->is_array() ? *it : json::array({*it});
    for (const auto& v : list) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        return invalid_argument_error("{}: field '{}' must be a token id or a list of them", source_, key);
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  }

 private:
  StatusOr<int32_t> checked_int(const json& v, const char* key, int32_t min_value) const {
    if (!v.is_number_integer() || v.get<int64_t>() < min_value || v.get<int64_t>() > INT32_MAX)
      return invalid_argument_error("{}: field '{}' must be an integer >= {} (got {})", source_, key,
                                    min_value, v.dump());
    return static_cast<int32_t>(v.get<int64_t>());
  }

  const json& j_;
  std::string_view source_;
};

StatusOr<std::optional<DType>> parse_torch_dtype(const json& j, std::string_view source) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) return invalid_argument_error("{}: field '{}' must be a string", source, key);
    const std::string name = it->get<std::string>();
    if (name == "float32") return std::optional<DType>(DType::kF32);
    if (name == "float16") return std::optional<DType>(DType::kF16);
    if (name == "bfloat16") return std::optional<DType>(DType::kBF16);
    return unimplemented_error("{}: {} '{}' not supported (float32, float16, bfloat16)", source, key, name);
  }
  return std::optional<DType>();
}

// RoPE: transformers 5 puts everything in rope_parameters; transformers 4 uses
// rope_theta plus an optional rope_scaling object.
Status parse_rope(const json& j, const ConfigReader& reader, std::string_view source, ModelConfig& cfg) {
  const json* scaling = nullptr;
  float theta_fallback = 10000.0f;
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_argument_error("{}: 'rope_parameters' must be an object", source);
    scaling = &*it;
    PAGODA_ASSIGN_OR_RETURN(theta_fallback, reader.optional_float(*it, "rope_theta", theta_fallback));
  }
  PAGODA_ASSIGN_OR_RETURN(cfg.rope_theta, reader.optional_float(j, "rope_theta", theta_fallback));
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_argument_error("{}: 'rope_scaling' must be an object", source);
    scaling = &*it;
  }
  if (scaling == nullptr) return ok_status();
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = scaling->find(key);
    if (it != scaling->end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  if (type == "default") return ok_status();
  if (type != "llama3") {
    return unimplemented_error("{}: rope type '{}' not supported (supported: default, llama3)", source, type);
  }
  Llama3RopeScaling s;
  PAGODA_ASSIGN_OR_RETURN(s.factor, reader.optional_float(*scaling, "factor", s.factor));
  PAGODA_ASSIGN_OR_RETURN(s.low_freq_factor, reader.optional_float(*scaling, "low_freq_factor", s.low_freq_factor));
  PAGODA_ASSIGN_OR_RETURN(s.high_freq_factor, reader.optional_float(*scaling, "high_freq_factor", s.high_freq_factor));
  PAGODA_ASSIGN_OR_RETURN(float original, reader.optional_float(*scaling, "original_max_position_embeddings",
                                                                static_cast<float>(s.original_max_position_embeddings)));
  s.original_max_position_embeddings = static_cast<int32_t>(original);
  if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0) ||
      s.original_max_position_embeddings <= 0) {
    return invalid_argument_error(
        "{}: llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0 "
        "(got factor={} low={} high={})", source, s.factor, s.low_freq_factor, s.high_freq_factor);
  }
  cfg.rope_llama3 = s;
  return ok_status();
}

}  // namespace

std::string supported_architectures() {
  std::string s;
  for (const auto& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

bool ModelConfig::is_eos(int32_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

StatusOr<ModelConfig> parse_model_config(const json& j, std::string_view source) {
  if (!j.is_object()) return invalid_argument_error("{}: not a JSON object", source);
  ModelConfig cfg;
  auto arch_it = j.find("architectures");
  if (arch_it == j.end() || !arch_it->is_array() || arch_it->empty() || !(*arch_it)[0].is_string()) {
    return invalid_argument_error("{}: missing 'architectures' (supported: {})", source,
                                  supported_architectures());
  }
  cfg.architecture_name = (*arch_it)[0].get<std::string>();
  bool known = false;
  for (const auto& a : kArchitectures) {
    if (cfg.architecture_name == a.name) {
      cfg.architecture = a.architecture;
      known = true;
    }
  }
  if (!known) {
    return unimplemented_error("{}: unsupported architecture '{}' (supported: {})", source,
                               cfg.architecture_name, supported_architectures());
  }
  if (auto act = j.find("hidden_act"); act != j.end() && act->is_string() && *act != "silu") {
    return unimplemented_error("{}: hidden_act '{}' not supported (silu only)", source, act->get<std::string>());
  }

  ConfigReader r(j, source);
  PAGODA_ASSIGN_OR_RETURN(cfg.vocab_size, r.required_int("vocab_size"));
  PAGODA_ASSIGN_OR_RETURN(cfg.hidden_size, r.required_int("hidden_size"));
  PAGODA_ASSIGN_OR_RETURN(cfg.intermediate_size, r.required_int("intermediate_size"));
  PAGODA_ASSIGN_OR_RETURN(cfg.num_layers, r.required_int("num_hidden_layers"));
  PAGODA_ASSIGN_OR_RETURN(cfg.num_q_heads, r.required_int("num_attention_heads"));
  const bool deepseek = cfg.architecture == Architecture::kDeepseekV2 || cfg.architecture == Architecture::kDeepseekV3;
  if (deepseek) {
    // MLA: heads, cache geometry, rope (incl. yarn) and the experts come from their own fields.
    PAGODA_ASSIGN_OR_RETURN(cfg.max_position_embeddings, r.optional_int("max_position_embeddings", 2048));
    PAGODA_ASSIGN_OR_RETURN(cfg.rms_norm_eps, r.optional_float(j, "rms_norm_eps", 1e-6f));
    PAGODA_RETURN_IF_ERROR(parse_deepseek_config(j, source, cfg));
    PAGODA_ASSIGN_OR_RETURN(cfg.tie_word_embeddings, r.optional_bool("tie_word_embeddings", false));
    PAGODA_ASSIGN_OR_RETURN(cfg.bos_token_ids, r.token_ids(j, "bos_token_id"));
    PAGODA_ASSIGN_OR_RETURN(cfg.eos_token_ids, r.token_ids(j, "eos_token_id"));
    PAGODA_ASSIGN_OR_RETURN(cfg.dtype, parse_torch_dtype(j, source));
    return cfg;
  }
  PAGODA_ASSIGN_OR_RETURN(cfg.num_kv_heads, r.optional_int("num_key_value_heads", cfg.num_q_heads));
  if (cfg.num_q_heads % cfg.num_kv_heads != 0) {
    return invalid_argument_error("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                  source, cfg.num_q_heads, cfg.num_kv_heads);
  }
  const bool has_default_head_dim = cfg.hidden_size % cfg.num_q_heads == 0;
  PAGODA_ASSIGN_OR_RETURN(cfg.head_dim,
                          r.optional_int("head_dim", has_default_head_dim ? cfg.hidden_size / cfg.num_q_heads : 0));
  if (cfg.head_dim <= 0 || cfg.head_dim % 2 != 0) {
    return invalid_argument_error("{}: head_dim must be a positive even number (got {}; hidden_size {} / heads {})",
                                  source, cfg.head_dim, cfg.hidden_size, cfg.num_q_heads);
  }
  PAGODA_ASSIGN_OR_RETURN(cfg.max_position_embeddings, r.optional_int("max_position_embeddings", 4096));
  PAGODA_ASSIGN_OR_RETURN(cfg.rms_norm_eps, r.optional_float(j, "rms_norm_eps", 1e-6f));
  PAGODA_RETURN_IF_ERROR(parse_rope(j, r, source, cfg));
  PAGODA_ASSIGN_OR_RETURN(cfg.tie_word_embeddings, r.optional_bool("tie_word_embeddings", false));
  PAGODA_ASSIGN_OR_RETURN(cfg.bos_token_ids, r.token_ids(j, "bos_token_id"));
  PAGODA_ASSIGN_OR_RETURN(cfg.eos_token_ids, r.token_ids(j, "eos_token_id"));
  PAGODA_ASSIGN_OR_RETURN(cfg.dtype, parse_torch_dtype(j, source));
  PAGODA_ASSIGN_OR_RETURN(cfg.fp8, parse_fp8_quant_config(j, source));

  PAGODA_ASSIGN_OR_RETURN(bool attention_bias, r.optional_bool("attention_bias", false));
  switch (cfg.architecture) {
    case Architecture::kLlama: {
      cfg.qkv_bias = cfg.o_proj_bias = attention_bias;
      PAGODA_ASSIGN_OR_RETURN(cfg.mlp_bias, r.optional_bool("mlp_bias", false));
      break;
    }
    case Architecture::kMistral: {
      PAGODA_ASSIGN_OR_RETURN(cfg.sliding_window, r.optional_int("sliding_window", 0, 0));
      break;
    }
    case Architecture::kQwen2: {
      cfg.qkv_bias = true;
      PAGODA_ASSIGN_OR_RETURN(bool use_sliding, r.optional_bool("use_sliding_window", false));
      if (use_sliding)
        return unimplemented_error("{}: Qwen2 use_sliding_window=true is not supported", source);
      break;
    }
    case Architecture::kQwen3: {
      cfg.qk_norm = true;
      cfg.qkv_bias = cfg.o_proj_bias = attention_bias;
      PAGODA_ASSIGN_OR_RETURN(bool use_sliding, r.optional_bool("use_sliding_window", false));
      if (use_sliding)
        return unimplemented_error("{}: Qwen3 use_sliding_window=true is not supported", source);
      break;
    }
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3: break;  // returned above
  }
  return cfg;
}

StatusOr<ModelConfig> load_model_config(const std::filesystem::path& model_dir) {
  auto read = [](const std::filesystem::path& path) -> StatusOr<json> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found_error("{}: cannot open", path.string());
    std::stringstream buffer;
    buffer << in.rdbuf();
    json j = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument_error("{}: not valid JSON", path.string());
    return j;
  };
  const auto config_path = model_dir / "config.json";
  PAGODA_ASSIGN_OR_RETURN(json j, read(config_path));
  PAGODA_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(j, config_path.string()));

  // ModelOpt exports may keep their quantization in hf_quant_config.json only.
  const auto modelopt_path = model_dir / "hf_quant_config.json";
  std::error_code modelopt_ec;
  if (!cfg.fp8 && !cfg.mla && std::filesystem::exists(modelopt_path, modelopt_ec)) {
    PAGODA_ASSIGN_OR_RETURN(json q, read(modelopt_path));
    const auto nested = q.is_object() ? q.find("quantization") : q.end();
    if (nested != q.end() && nested->is_object() && nested->contains("quant_algo") &&
        (*nested)["quant_algo"].is_string()) {
      PAGODA_ASSIGN_OR_RETURN(Fp8QuantConfig fp8, parse_modelopt_quant_file(q, modelopt_path.string()));
      cfg.fp8 = std::move(fp8);
    }
  }

  // Chat models often list extra stop tokens (e.g. <|eot_id|>) only here.
  const auto gen_path = model_dir / "generation_config.json";
  std::error_code ec;
  if (std::filesystem::exists(gen_path, ec)) {
    PAGODA_ASSIGN_OR_RETURN(json g, read(gen_path));
    if (g.is_object()) {
      ConfigReader r(g, gen_path.string());
      PAGODA_ASSIGN_OR_RETURN(auto extra, r.token_ids(g, "eos_token_id"));
      for (int32_t id : extra)
        if (!cfg.is_eos(id)) cfg.eos_token_ids.push_back(id);
    }
  }
  return cfg;
}

}  // namespace pagoda
