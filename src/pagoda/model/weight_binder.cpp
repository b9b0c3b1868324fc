#include "pagoda/model/weight_binder.h"

#include <algorithm>
#include <cmath>

namespace pagoda {

StatusOr<const TensorInfo*> WeightBinder::tensor(const std::string& name, std::vector<int64_t> shape) {
  const TensorInfo* t = ckpt_.find(name);
  if (t == nullptr) {
    return not_found_error("{}: missing tensor '{}' (expected shape {}) in {}", ckpt_.dir().string(), name,
                           shape_to_string(shape), ckpt_.source_name());
  }
  if (t->shape != shape) {
    return invalid_argument_error("{}/{}: tensor '{}' has shape {} but config.json implies {}", ckpt_.dir().string(),
                                  t->file_name, name, shape_to_string(t->shape), shape_to_string(shape));
  }
  const std::optional<DType> expected = config_.dtype ? config_.dtype : first_dtype_;
  if (expected && t->dtype != *expected) {
    return invalid_argument_error("{}/{}: tensor '{}' has dtype {} but {} is {}", ckpt_.dir().string(), t->file_name,
                                  name, dtype_name(t->dtype),
                                  config_.dtype ? "config.json torch_dtype" : "the rest of the checkpoint",
                                  dtype_name(*expected));
  }
  if (!first_dtype_) first_dtype_ = t->dtype;
  return t;
}

StatusOr<WeightMatrix> WeightBinder::matrix(const std::string& name, int64_t rows, int64_t cols) {
  PAGODA_ASSIGN_OR_RETURN(const TensorInfo* t, tensor(name, {rows, cols}));
  return WeightMatrix{t->dtype, t->data, static_cast<size_t>(rows), static_cast<size_t>(cols)};
}

StatusOr<const float*> WeightBinder::scales(const std::string& name, const std::vector<std::vector<int64_t>>& shapes,
                                            bool positive, const char* what) {
  const TensorInfo* t = ckpt_.find(name);
  if (t == nullptr) {
    return not_found_error("{}: missing tensor '{}' ({} {}, expected shape {}) in {}", ckpt_.dir().string(), name,
                           config_.fp8->describe(), what, shape_to_string(shapes.front()), ckpt_.source_name());
  }
  if (std::find(shapes.begin(), shapes.end(), t->shape) == shapes.end()) {
    return invalid_argument_error("{}/{}: tensor '{}' has shape {} but the {} of this layer is {}",
                                  ckpt_.dir().string(), t->file_name, name, shape_to_string(t->shape), what,
                                  shape_to_string(shapes.front()));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
    return invalid_argument_error("{}/{}: tensor '{}' has dtype {}; a {} is f32, f16 or bf16", ckpt_.dir().string(),
                                  t->file_name, name, dtype_name(t->dtype), what);
  }
  const size_t n = static_cast<size_t>(t->num_elements());
  auto values = std::make_unique<float[]>(n);
  convert_to_f32(t->dtype, t->data, values.get(), n);
  for (size_t i = 0; i < n; ++i) {
    const float v = values[i];
    if (!std::isfinite(v) || v < 0.0f || (positive && v == 0.0f)) {
      return invalid_argument_error("{}/{}: tensor '{}' holds {} at element {}; a {} must be finite and {}",
                                    ckpt_.dir().string(), t->file_name, name, v, i, what,
                                    positive ? "positive" : "non-negative");
    }
  }
  owned_scales_.push_back(std::move(values));
  return owned_scales_.back().get();
}

StatusOr<WeightMatrix> WeightBinder::linear(const std::string& module, int64_t rows, int64_t cols) {
  const std::string name = module + ".weight";
  if (!config_.fp8 || config_.fp8->skips(module)) return matrix(name, rows, cols);
  const Fp8QuantConfig& q = *config_.fp8;
  const TensorInfo* t = ckpt_.find(name);
  // Block-fp8 checkpoints (DeepSeek-V3, Qwen3-FP8) keep lm_head unquantized without listing it, as vLLM's
  // fp8 method never quantizes it: a stored lm_head that is not fp8 is read as it is.
  if (module == "lm_head" && t != nullptr && t->dtype != DType::kFP8E4M3) return matrix(name, rows, cols);
  if (t == nullptr) {
    return not_found_error("{}: missing tensor '{}' (expected shape {}) in {}", ckpt_.dir().string(), name,
                           shape_to_string({rows, cols}), ckpt_.source_name());
  }
  if (t->shape != std::vector<int64_t>{rows, cols}) {
    return invalid_argument_error("{}/{}: tensor '{}' has shape {} but config.json implies {}", ckpt_.dir().string(),
                                  t->file_name, name, shape_to_string(t->shape), shape_to_string({rows, cols}));
  }
  if (t->dtype != DType::kFP8E4M3) {
    return invalid_argument_error("{}/{}: tensor '{}' has dtype {} but quantization_config ({}) makes it F8_E4M3 "
                                  "(list the module in the config's ignore list if it is not quantized)",
                                  ckpt_.dir().string(), t->file_name, name, dtype_name(t->dtype), q.describe());
  }
  WeightMatrix m{DType::kFP8E4M3, t->data, static_cast<size_t>(rows), static_cast<size_t>(cols)};
  m.fp8.layout = q.weight_scale;
  std::vector<std::vector<int64_t>> shapes;
  switch (q.weight_scale) {
    case Fp8WeightScale::kTensor: shapes = {{}, {1}}; break;
    case Fp8WeightScale::kChannel: shapes = {{rows, 1}, {rows}}; break;
    case Fp8WeightScale::kBlock: {
      const int64_t rb = (rows + q.block_rows - 1) / q.block_rows, cb = (cols + q.block_cols - 1) / q.block_cols;
      shapes = {{rb, cb}, {rb, 1, cb, 1}};  // the second: ModelOpt's FP8_PB_WO export
      m.fp8.block_rows = q.block_rows;
      m.fp8.block_cols = q.block_cols;
      break;
    }
  }
  PAGODA_ASSIGN_OR_RETURN(m.fp8.scales, scales(module + "." + q.scale_name, shapes, false, "weight scale"));
  m.fp8.activation = q.activation;
  m.fp8.activation_group = q.activation_group;
  if (q.activation == Fp8Activation::kStaticTensor) {
    PAGODA_ASSIGN_OR_RETURN(const float* input, scales(module + ".input_scale", {{}, {1}}, true, "input scale"));
    m.fp8.input_scale = input[0];
  }
  return m;
}

StatusOr<std::vector<float>> WeightBinder::vector(const std::string& name, int64_t size) {
  PAGODA_ASSIGN_OR_RETURN(const TensorInfo* t, tensor(name, {size}));
  std::vector<float> v(static_cast<size_t>(size));
  convert_to_f32(t->dtype, t->data, v.data(), v.size());
  return v;
}

StatusOr<std::vector<float>> WeightBinder::vector_any_float(const std::string& name, int64_t size) {
  const TensorInfo* t = ckpt_.find(name);
  if (t == nullptr) {
    return not_found_error("{}: missing tensor '{}' (expected shape {}) in {}", ckpt_.dir().string(), name,
                           shape_to_string({size}), ckpt_.source_name());
  }
  if (t->shape != std::vector<int64_t>{size}) {
    return invalid_argument_error("{}/{}: tensor '{}' has shape {} but config.json implies {}", ckpt_.dir().string(),
                                  t->file_name, name, shape_to_string(t->shape), shape_to_string({size}));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
    return invalid_argument_error("{}/{}: tensor '{}' has dtype {}; f32, f16 or bf16 expected", ckpt_.dir().string(),
                                  t->file_name, name, dtype_name(t->dtype));
  }
  std::vector<float> v(static_cast<size_t>(size));
  convert_to_f32(t->dtype, t->data, v.data(), v.size());
  for (float x : v) {
    if (!std::isfinite(x))
      return invalid_argument_error("{}/{}: tensor '{}' holds a value that is not finite", ckpt_.dir().string(),
                                    t->file_name, name);
  }
  return v;
}

StatusOr<float> WeightBinder::optional_positive_scalar(const std::string& name) {
  const TensorInfo* t = ckpt_.find(name);
  if (t == nullptr) return 0.0f;
  if (!(t->shape.empty() || t->shape == std::vector<int64_t>{1})) {
    return invalid_argument_error("{}/{}: tensor '{}' has shape {} but a KV scale is a scalar ([] or [1])",
                                  ckpt_.dir().string(), t->file_name, name, shape_to_string(t->shape));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
    return invalid_argument_error("{}/{}: tensor '{}' has dtype {}; a KV scale is f32, f16 or bf16",
                                  ckpt_.dir().string(), t->file_name, name, dtype_name(t->dtype));
  }
  float value = 0.0f;
  convert_to_f32(t->dtype, t->data, &value, 1);
  if (!std::isfinite(value) || value <= 0.0f) {
    return invalid_argument_error("{}/{}: tensor '{}' is {}; a KV scale must be finite and positive",
                                  ckpt_.dir().string(), t->file_name, name, value);
  }
  return value;
}

}  // namespace pagoda
