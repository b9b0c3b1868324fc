#include "pagoda/model/weight_binder.h"

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
