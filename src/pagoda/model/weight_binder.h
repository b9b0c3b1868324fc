#pragma once
// Looks up checkpoint tensors by name and checks them against what config.json
// implies: present, of the expected shape, and of the checkpoint's one dtype
// (config.json's torch_dtype, or else the first tensor's). Errors name the
// tensor, the file and the expected shape. Used by bind_model_weights for every
// architecture (model/model_weights.cpp, model/deepseek_weights.cpp).
//
// Thread safety: one binder per load, one thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/weight_matrix.h"

namespace pagoda {

class WeightBinder {
 public:
  WeightBinder(const ModelConfig& config, const Checkpoint& ckpt) : config_(config), ckpt_(ckpt) {}

  // The tensor `name` with exactly `shape` and the checkpoint's dtype.
  StatusOr<const TensorInfo*> tensor(const std::string& name, std::vector<int64_t> shape);
  // A [rows, cols] matrix, as a view into the mapped file.
  StatusOr<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols);
  // The weight "<module>.weight" of a Linear layer: with an FP8 checkpoint
  // (config.fp8) and a module it does not skip, an F8_E4M3 [rows, cols] view
  // with its scales (<module>.weight_scale or .weight_scale_inv, as the format
  // names it, converted to f32 and owned by the binder) and, for static
  // activations, <module>.input_scale. Errors name the tensor: missing, of
  // another shape or dtype, or a scale that is not finite (weight scales may
  // be 0 for all-zero rows or blocks; input scales must be positive).
  // Otherwise as matrix().
  StatusOr<WeightMatrix> linear(const std::string& module, int64_t rows, int64_t cols);
  // The f32 scales linear() made; the caller keeps them alive with the matrices.
  std::vector<std::unique_ptr<float[]>> take_owned_scales() { return std::move(owned_scales_); }
  // A [size] vector converted to f32.
  StatusOr<std::vector<float>> vector(const std::string& name, int64_t size);
  // A [size] vector of any float dtype (f32, f16, bf16), converted to f32: for
  // tensors checkpoints keep in f32 beside bf16 weights (DeepSeek-V3's
  // e_score_correction_bias).
  StatusOr<std::vector<float>> vector_any_float(const std::string& name, int64_t size);
  // An optional scalar (shape [] or [1], any float dtype); 0 when absent. Errors:
  // another shape, or a value that is not finite and positive.
  StatusOr<float> optional_positive_scalar(const std::string& name);

  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }
  std::optional<DType> dtype() const { return first_dtype_; }

 private:
  const ModelConfig& config_;
  const Checkpoint& ckpt_;
  std::optional<DType> first_dtype_;
  std::vector<std::unique_ptr<float[]>> owned_scales_;

  // A float tensor of one of `shapes` converted to f32 and checked (finite, >= min or > 0).
  StatusOr<const float*> scales(const std::string& name, const std::vector<std::vector<int64_t>>& shapes,
                                bool positive, const char* what);
};

}  // namespace pagoda
