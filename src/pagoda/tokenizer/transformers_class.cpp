#include "pagoda/tokenizer/transformers_class.h"

namespace pagoda::tokenizer {
namespace {

constexpr const char* kMetaspace = "\u2581";

// A boolean config flag: absent or null -> nullopt; anything but a boolean is an error.
StatusOr<std::optional<bool>> config_flag(const nlohmann::json& config, const char* field,
                                          std::string_view config_name) {
  if (!config.contains(field) || config[field].is_null()) return std::optional<bool>();
  if (!config[field].is_boolean()) {
    return data_loss_error("{}: {}: expected true or false, got {}", config_name, field,
                           config[field].dump());
  }
  return std::optional<bool>(config[field].get<bool>());
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* field) {
  if (!config.contains(field)) return std::nullopt;
  const auto& value = config[field];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

bool is_llama_class(std::string_view name) {
  return name == "LlamaTokenizer" || name == "LlamaTokenizerFast";
}

Status rebuild_llama_pipeline(const nlohmann::json& config, std::string_view config_name,
                              PipelineSpecs& specs) {
  PAGODA_ASSIGN_OR_RETURN(std::optional<bool> legacy, config_flag(config, "legacy", config_name));
  PAGODA_ASSIGN_OR_RETURN(std::optional<bool> add_prefix_space,
                          config_flag(config, "add_prefix_space", config_name));
  const bool prefix = add_prefix_space.value_or(true);
  const char* scheme = !prefix ? "never" : legacy.value_or(false) ? "always" : "first";

  specs.normalizer = nullptr;
  specs.pre_tokenizer = {{"type", "Metaspace"},
                         {"replacement", kMetaspace},
                         {"prepend_scheme", scheme},
                         {"split", false}};
  nlohmann::json decoders = nlohmann::json::array();
  decoders.push_back({{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}});
  decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  specs.decoder = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
  if (!specs.model.is_object()) specs.model = nlohmann::json::object();
  specs.model["byte_fallback"] = true;
  specs.model["fuse_unk"] = true;
  specs.model["ignore_merges"] = false;
  return ok_status();
}

Status rebuild_post_processor(
    const nlohmann::json& config, std::string_view config_name, bool add_bos, bool add_eos,
    const std::function<std::optional<int32_t>(const std::string&)>& token_id,
    PipelineSpecs& specs) {
  nlohmann::json single = nlohmann::json::array();
  nlohmann::json special_tokens = nlohmann::json::object();
  auto add_special = [&](const char* field) -> Status {
    const std::optional<std::string> token = config_token(config, field);
    if (!token) return ok_status();  // transformers turns the flag off when the token is unset
    const std::optional<int32_t> id = token_id(*token);
    if (!id) {
      return data_loss_error("{}: {}: \"{}\" is not a token of the vocabulary", config_name, field,
                             *token);
    }
    single.push_back({{"SpecialToken", {{"id", *token}, {"type_id", 0}}}});
    special_tokens[*token] = {{"id", *token}, {"ids", {*id}}, {"tokens", {*token}}};
    return ok_status();
  };
  if (add_bos) PAGODA_RETURN_IF_ERROR(add_special("bos_token"));
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) PAGODA_RETURN_IF_ERROR(add_special("eos_token"));
  specs.post_processor = {{"type", "TemplateProcessing"},
                          {"single", std::move(single)},
                          {"special_tokens", std::move(special_tokens)}};
  return ok_status();
}

}  // namespace

StatusOr<TransformersClassReport> apply_transformers_class(
    const nlohmann::json& tokenizer_config,
    const std::function<std::optional<int32_t>(const std::string&)>& token_id,
    std::string_view config_name, PipelineSpecs& specs) {
  TransformersClassReport report;
  if (tokenizer_config.is_null()) return report;
  if (!tokenizer_config.is_object()) {
    return data_loss_error("{}: expected a JSON object", config_name);
  }
  if (tokenizer_config.contains("tokenizer_class")) {
    const auto& value = tokenizer_config["tokenizer_class"];
    if (!value.is_string() && !value.is_null()) {
      return data_loss_error("{}: tokenizer_class: expected a string", config_name);
    }
    if (value.is_string()) report.tokenizer_class = value.get<std::string>();
  }
  if (is_llama_class(report.tokenizer_class)) {
    PAGODA_RETURN_IF_ERROR(rebuild_llama_pipeline(tokenizer_config, config_name, specs));
    report.pipeline_rebuilt = true;
  }
  // transformers rebuilds when either key is present at all (a null value counts as false).
  PAGODA_ASSIGN_OR_RETURN(std::optional<bool> add_bos,
                          config_flag(tokenizer_config, "add_bos_token", config_name));
  PAGODA_ASSIGN_OR_RETURN(std::optional<bool> add_eos,
                          config_flag(tokenizer_config, "add_eos_token", config_name));
  if (tokenizer_config.contains("add_bos_token") || tokenizer_config.contains("add_eos_token")) {
    PAGODA_RETURN_IF_ERROR(rebuild_post_processor(tokenizer_config, config_name,
                                                  add_bos.value_or(false), add_eos.value_or(false),
                                                  token_id, specs));
    report.post_processor_rebuilt = true;
  }
  return report;
}

}  // namespace pagoda::tokenizer
