#include "pagoda/model/fp8_config.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pagoda {

namespace {

using nlohmann::json;

// "quantization_config.config_groups.group_0.weights.strategy": error messages name the field by its path.
class Fields {
 public:
  Fields(std::string_view source, std::string path) : source_(source), path_(std::move(path)) {}
  Fields child(const std::string& key) const { return Fields(source_, path_ + "." + key); }
  std::string name(const std::string& key) const { return path_ + "." + key; }
  const std::string& path() const { return path_; }

  StatusOr<std::string> string(const json& obj, const std::string& key, std::string fallback,
                               bool required = false) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) return invalid_argument_error("{}: missing field '{}'", source_, name(key));
      return fallback;
    }
    if (!it->is_string()) return invalid_argument_error("{}: field '{}' must be a string", source_, name(key));
    return it->get<std::string>();
  }
  StatusOr<int64_t> integer(const json& obj, const std::string& key, int64_t fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number_integer())
      return invalid_argument_error("{}: field '{}' must be an integer (got {})", source_, name(key), it->dump());
    return it->get<int64_t>();
  }
  StatusOr<bool> boolean(const json& obj, const std::string& key, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return invalid_argument_error("{}: field '{}' must be true or false", source_, name(key));
    return it->get<bool>();
  }
  StatusOr<std::vector<std::string>> strings(const json& obj, const std::string& key) const {
    std::vector<std::string> out;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return out;
    if (!it->is_array())
      return invalid_argument_error("{}: field '{}' must be a list of module names", source_, name(key));
    for (const json& v : *it) {
      if (!v.is_string())
        return invalid_argument_error("{}: field '{}' must be a list of module names", source_, name(key));
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  // [rows, cols] block sizes, each in [1, 4096].
  StatusOr<std::pair<int32_t, int32_t>> block(const json& obj, const std::string& key) const {
    auto it = obj.find(key);
    const bool ok = it != obj.end() && it->is_array() && it->size() == 2 && (*it)[0].is_number_integer() &&
                    (*it)[1].is_number_integer() && (*it)[0].get<int64_t>() >= 1 && (*it)[1].get<int64_t>() >= 1 &&
                    (*it)[0].get<int64_t>() <= 4096 && (*it)[1].get<int64_t>() <= 4096;
    if (!ok)
      return invalid_argument_error("{}: field '{}' must be two block sizes [rows, cols] in 1..4096{}", source_,
                                    name(key), it == obj.end() ? " (missing)" : " (got " + it->dump() + ")");
    return std::pair<int32_t, int32_t>{static_cast<int32_t>((*it)[0].get<int64_t>()),
                                       static_cast<int32_t>((*it)[1].get<int64_t>())};
  }
  Status unsupported(const std::string& key, const std::string& value, const std::string& supported) const {
    return unimplemented_error("{}: {} '{}' is not supported (supported: {})", source_, name(key), value, supported);
  }
  std::string_view source() const { return source_; }

 private:
  std::string_view source_;
  std::string path_;
};

// compressed-tensors' "float-quantized" format.
StatusOr<Fp8QuantConfig> parse_compressed_tensors(const json& qc, const Fields& f) {
  Fp8QuantConfig c;
  c.format = Fp8Format::kCompressedTensors;
  PAGODA_ASSIGN_OR_RETURN(const std::string format, f.string(qc, "format", "float-quantized"));
  if (format != "float-quantized")
    return f.unsupported("format", format, "float-quantized (fp8 weights)");
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->size() != 1)
    return unimplemented_error("{}: field '{}' must hold exactly one group (one fp8 scheme for every Linear)",
                               f.source(), f.name("config_groups"));
  const std::string group_name = groups->begin().key();
  const json& group = groups->begin().value();
  const Fields g = f.child("config_groups").child(group_name);
  if (!group.is_object()) return invalid_argument_error("{}: field '{}' must be an object", f.source(), g.path());
  PAGODA_ASSIGN_OR_RETURN(const std::string group_format, g.string(group, "format", format));
  if (group_format != "float-quantized") return g.unsupported("format", group_format, "float-quantized");
  PAGODA_ASSIGN_OR_RETURN(const auto targets, g.strings(group, "targets"));
  if (std::find(targets.begin(), targets.end(), "Linear") == targets.end())
    return unimplemented_error("{}: field '{}' must list \"Linear\" (per-module targets are not supported)",
                               f.source(), g.name("targets"));

  auto weights = group.find("weights");
  if (weights == group.end() || !weights->is_object())
    return invalid_argument_error("{}: missing object '{}'", f.source(), g.name("weights"));
  const Fields w = g.child("weights");
  PAGODA_ASSIGN_OR_RETURN(const std::string type, w.string(*weights, "type", "", true));
  PAGODA_ASSIGN_OR_RETURN(const int64_t bits, w.integer(*weights, "num_bits", 0));
  if (type != "float" || bits != 8)
    return unimplemented_error("{}: {} is {} with {} bits: only float with 8 bits (fp8 e4m3) is supported",
                               f.source(), w.name("type"), type, bits);
  PAGODA_ASSIGN_OR_RETURN(const bool symmetric, w.boolean(*weights, "symmetric", true));
  if (!symmetric) return w.unsupported("symmetric", "false", "true");
  PAGODA_ASSIGN_OR_RETURN(const bool dynamic_weights, w.boolean(*weights, "dynamic", false));
  if (dynamic_weights) return w.unsupported("dynamic", "true", "false");
  PAGODA_ASSIGN_OR_RETURN(const std::string strategy, w.string(*weights, "strategy", "", true));
  if (strategy == "tensor") {
    c.weight_scale = Fp8WeightScale::kTensor;
  } else if (strategy == "channel") {
    c.weight_scale = Fp8WeightScale::kChannel;
  } else if (strategy == "block") {
    c.weight_scale = Fp8WeightScale::kBlock;
    PAGODA_ASSIGN_OR_RETURN(auto block, w.block(*weights, "block_structure"));
    c.block_rows = block.first;
    c.block_cols = block.second;
  } else {
    return w.unsupported("strategy", strategy, "tensor, channel, block");
  }

  auto input = group.find("input_activations");
  if (input == group.end() || input->is_null()) {
    c.activation = Fp8Activation::kNone;
  } else {
    if (!input->is_object())
      return invalid_argument_error("{}: field '{}' must be an object", f.source(), g.name("input_activations"));
    const Fields a = g.child("input_activations");
    PAGODA_ASSIGN_OR_RETURN(const std::string atype, a.string(*input, "type", "", true));
    PAGODA_ASSIGN_OR_RETURN(const int64_t abits, a.integer(*input, "num_bits", 0));
    if (atype != "float" || abits != 8)
      return unimplemented_error("{}: {} is {} with {} bits: only float with 8 bits (fp8 e4m3) is supported",
                                 f.source(), a.name("type"), atype, abits);
    PAGODA_ASSIGN_OR_RETURN(const bool dynamic, a.boolean(*input, "dynamic", false));
    PAGODA_ASSIGN_OR_RETURN(const std::string astrategy, a.string(*input, "strategy", "", true));
    if (dynamic && astrategy == "token") {
      c.activation = Fp8Activation::kDynamicToken;
    } else if (dynamic && astrategy == "group") {
      PAGODA_ASSIGN_OR_RETURN(const int64_t group_size, a.integer(*input, "group_size", 0));
      if (group_size < 1 || group_size > 4096)
        return invalid_argument_error("{}: field '{}' must be in 1..4096 (got {})", f.source(),
                                      a.name("group_size"), group_size);
      c.activation = Fp8Activation::kDynamicGroup;
      c.activation_group = static_cast<int32_t>(group_size);
    } else if (!dynamic && astrategy == "tensor") {
      c.activation = Fp8Activation::kStaticTensor;
    } else {
      return a.unsupported("strategy", std::string(dynamic ? "dynamic " : "static ") + astrategy,
                           "dynamic token, dynamic group, static tensor");
    }
  }
  PAGODA_ASSIGN_OR_RETURN(c.ignore, f.strings(qc, "ignore"));
  return c;
}

StatusOr<Fp8QuantConfig> parse_modelopt_algo(const std::string& algo_in, std::vector<std::string> exclude,
                                             const Fields& f, const std::string& algo_field) {
  std::string algo = algo_in;
  for (char& ch : algo) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  Fp8QuantConfig c;
  c.format = Fp8Format::kModelOpt;
  c.ignore = std::move(exclude);
  if (algo == "FP8") {
    c.weight_scale = Fp8WeightScale::kTensor;
    c.activation = Fp8Activation::kStaticTensor;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    c.weight_scale = Fp8WeightScale::kChannel;
    c.activation = Fp8Activation::kDynamicToken;
  } else if (algo == "FP8_PB_WO") {
    c.weight_scale = Fp8WeightScale::kBlock;
    c.block_rows = c.block_cols = 128;
    c.activation = Fp8Activation::kDynamicGroup;
    c.activation_group = 128;
  } else {
    return f.unsupported(algo_field, algo_in, "FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO");
  }
  return c;
}

StatusOr<Fp8QuantConfig> parse_modelopt(const json& qc, const Fields& f) {
  auto nested = qc.find("quantization");
  if (nested != qc.end() && nested->is_object()) {
    const Fields n = f.child("quantization");
    PAGODA_ASSIGN_OR_RETURN(const std::string algo, n.string(*nested, "quant_algo", "", true));
    PAGODA_ASSIGN_OR_RETURN(auto exclude, n.strings(*nested, "exclude_modules"));
    return parse_modelopt_algo(algo, std::move(exclude), n, "quant_algo");
  }
  PAGODA_ASSIGN_OR_RETURN(const std::string algo, f.string(qc, "quant_algo", "", true));
  PAGODA_ASSIGN_OR_RETURN(auto exclude, f.strings(qc, qc.contains("ignore") ? "ignore" : "exclude_modules"));
  return parse_modelopt_algo(algo, std::move(exclude), f, "quant_algo");
}

// quant_method "fp8": block-wise (weight_block_size) or per-tensor.
StatusOr<Fp8QuantConfig> parse_block_fp8(const json& qc, const Fields& f) {
  Fp8QuantConfig c;
  c.format = Fp8Format::kBlockFp8;
  PAGODA_ASSIGN_OR_RETURN(const std::string fmt_name, f.string(qc, "fmt", "e4m3"));
  if (fmt_name != "e4m3") return f.unsupported("fmt", fmt_name, "e4m3");
  PAGODA_ASSIGN_OR_RETURN(const std::string scheme, f.string(qc, "activation_scheme", "dynamic"));
  if (scheme != "dynamic" && scheme != "static") return f.unsupported("activation_scheme", scheme, "dynamic, static");
  PAGODA_ASSIGN_OR_RETURN(c.ignore, f.strings(qc, qc.contains("modules_to_not_convert") ? "modules_to_not_convert"
                                                                                          : "ignored_layers"));
  if (qc.contains("weight_block_size") && !qc["weight_block_size"].is_null()) {
    PAGODA_ASSIGN_OR_RETURN(auto block, f.block(qc, "weight_block_size"));
    if (scheme != "dynamic")
      return f.unsupported("activation_scheme", scheme, "dynamic (with weight_block_size)");
    c.weight_scale = Fp8WeightScale::kBlock;
    c.block_rows = block.first;
    c.block_cols = block.second;
    c.scale_name = "weight_scale_inv";
    c.activation = Fp8Activation::kDynamicGroup;
    c.activation_group = block.second;
  } else {
    c.weight_scale = Fp8WeightScale::kTensor;
    c.activation = scheme == "static" ? Fp8Activation::kStaticTensor : Fp8Activation::kDynamicToken;
  }
  return c;
}

bool wildcard_match(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

}  // namespace

bool Fp8QuantConfig::skips(const std::string& module) const {
  for (const std::string& pattern : ignore) {
    if (pattern == module) return true;
    if (pattern.rfind("re:", 0) == 0) {
      // compressed-tensors matches with Python's re.match: anchored at the start.
      try {
        const std::regex re(pattern.substr(3));
        if (std::regex_search(module, re, std::regex_constants::match_continuous)) return true;
      } catch (const std::regex_error&) {
        continue;  // validated at parse time; never reached for a loaded config
      }
      continue;
    }
    if (pattern.find_first_of("*?[") != std::string::npos && wildcard_match(pattern, module)) return true;
    // ModelOpt's older exports list module names that are a part of the path ("lm_head", "model.layers.0.mlp").
    if (format == Fp8Format::kModelOpt && module.find(pattern) != std::string::npos) return true;
  }
  return false;
}

std::string Fp8QuantConfig::describe() const {
  static constexpr const char* kFormats[] = {"compressed-tensors fp8", "modelopt fp8", "block fp8",
                                             "--quantization fp8"};
  std::string weights;
  switch (weight_scale) {
    case Fp8WeightScale::kTensor: weights = "per-tensor weight scales"; break;
    case Fp8WeightScale::kChannel: weights = "per-channel weight scales"; break;
    case Fp8WeightScale::kBlock: weights = fmt::format("{}x{} block weight scales", block_rows, block_cols); break;
  }
  std::string acts;
  switch (activation) {
    case Fp8Activation::kNone: acts = "activations not quantized"; break;
    case Fp8Activation::kDynamicToken: acts = "dynamic per-token fp8 activations"; break;
    case Fp8Activation::kDynamicGroup: acts = fmt::format("dynamic fp8 activations per token and {}", activation_group); break;
    case Fp8Activation::kStaticTensor: acts = "static fp8 activations (input_scale)"; break;
  }
  return fmt::format("{}, {}, {}", kFormats[static_cast<int>(format)], weights, acts);
}

StatusOr<std::optional<Fp8QuantConfig>> parse_fp8_quant_config(const json& config_json, std::string_view source) {
  auto it = config_json.find("quantization_config");
  if (it == config_json.end() || it->is_null()) return std::optional<Fp8QuantConfig>();
  if (!it->is_object())
    return invalid_argument_error("{}: field 'quantization_config' must be an object", source);
  const json& qc = *it;
  const Fields f(source, "quantization_config");
  PAGODA_ASSIGN_OR_RETURN(const std::string method, f.string(qc, "quant_method", "", true));
  StatusOr<Fp8QuantConfig> parsed = [&]() -> StatusOr<Fp8QuantConfig> {
    if (method == "compressed-tensors") return parse_compressed_tensors(qc, f);
    if (method == "modelopt") return parse_modelopt(qc, f);
    if (method == "fp8") return parse_block_fp8(qc, f);
    return unimplemented_error("{}: quantization_config.quant_method '{}' is not supported (supported: "
                               "compressed-tensors float-quantized, modelopt FP8, fp8)", source, method);
  }();
  if (!parsed.ok()) return parsed.status();
  for (const std::string& pattern : parsed->ignore) {
    if (pattern.rfind("re:", 0) != 0) continue;
    try {
      std::regex re(pattern.substr(3));
    } catch (const std::regex_error&) {
      return invalid_argument_error("{}: quantization_config ignore pattern '{}' is not a valid regex", source,
                                    pattern);
    }
  }
  return std::optional<Fp8QuantConfig>(std::move(*parsed));
}

StatusOr<Fp8QuantConfig> parse_modelopt_quant_file(const json& file, std::string_view source) {
  const Fields f(source, "");
  auto nested = file.find("quantization");
  if (nested == file.end() || !nested->is_object())
    return invalid_argument_error("{}: missing object 'quantization'", source);
  const Fields n(source, "quantization");
  PAGODA_ASSIGN_OR_RETURN(const std::string algo, n.string(*nested, "quant_algo", "", true));
  PAGODA_ASSIGN_OR_RETURN(auto exclude, n.strings(*nested, "exclude_modules"));
  return parse_modelopt_algo(algo, std::move(exclude), n, "quant_algo");
}

}  // namespace pagoda
