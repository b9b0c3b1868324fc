#include "pagoda/backend/registry.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu_backend.h"
#include "pagoda/backend/startup_report.h"
#ifdef PAGODA_HAVE_CUDA
#include "pagoda/backend/cuda_backend.h"
#endif

namespace pagoda::backend {
namespace {

StatusOr<ModelConfig> read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found_error("cannot read config file {}", path);
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument_error("{}: not valid JSON", path);
  return parse_model_config(json, path);
}

StatusOr<ModelConfig> load_config(const RunnerSpec& spec) {
  if (spec.load_format == LoadFormat::kAuto) return load_model_config(spec.model_dir);
  return read_config_file(spec.config_path);
}

}  // namespace

StatusOr<RunnerSetup> create_model_runner(const RunnerSpec& spec,
                                               const RunnerRequirements& requirements) {
  PAGODA_ASSIGN_OR_RETURN(ModelConfig config, load_config(spec));
  if (spec.max_model_len > 0) {
    // Lets a benchmark run past the trained context (quality is then not the point).
    config.max_position_embeddings = spec.max_model_len;
  }
  if (requirements.sequence_tokens > config.max_position_embeddings)
    return out_of_range_error("this run needs {} tokens of context, more than {} (config.json's "
                                  "max_position_embeddings, or --max-model-len)", requirements.sequence_tokens,
                                  config.max_position_embeddings);
  PAGODA_RETURN_IF_ERROR(check_cross_layer_share(config, spec));
  if (spec.device == Device::kCuda) {
#ifdef PAGODA_HAVE_CUDA
    return create_cuda_runner(spec, requirements, std::move(config));
#else
    return failed_precondition_error("--device cuda: this pagoda was built without the CUDA backend");
#endif
  }
  return create_cpu_runner(spec, requirements, std::move(config));
}

}  // namespace pagoda::backend
