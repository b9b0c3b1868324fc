#include "pagoda/backend/cpu/quantize_weights.h"

#include <algorithm>
#include <vector>

#include "pagoda/backend/cpu/kernels/quant_dot.h"
#include "pagoda/core/thread_pool.h"

namespace pagoda {

namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// Replaces m by its quantized copy (owned by `owned`).
void quantize_matrix(WeightMatrix& m, DType dtype, std::vector<std::unique_ptr<uint8_t[]>>& owned) {
  const size_t row_bytes = kernels::quantized_row_bytes(dtype, m.cols);
  auto out = std::make_unique<uint8_t[]>(m.rows * row_bytes);
  const size_t elem_bytes = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  uint8_t* dst = out.get();
  ThreadPool::global().parallel_for(m.rows, [&](size_t begin, size_t end) {
    std::vector<float> row(m.cols);
    for (size_t r = begin; r < end; ++r) {
      convert_to_f32(m.dtype, static_cast<const char*>(m.data) + r * m.cols * elem_bytes, row.data(), m.cols);
      kernels::quantize_weight_rows(dtype, row.data(), 1, m.cols, dst + r * row_bytes);
    }
  }, 64);
  m.dtype = dtype;
  m.data = out.get();
  owned.push_back(std::move(out));
}

}  // namespace

Status quantize_model_weights(const ModelConfig& config, ModelWeights& w, DType dtype) {
  const std::string flag = "--quantization " + std::string(dtype_name(dtype));
  if (!kernels::is_quantized_weight(dtype))
    return invalid_argument_error("--quantization {}: expected int8 or int4", dtype_name(dtype));
  if (w.quantization)
    return invalid_argument_error("{}: the weights are already quantized ({})", flag, dtype_name(*w.quantization));
  if (config.mla || config.moe)
    return unimplemented_error("{}: not supported for {} (MLA/MoE) models on the CPU yet; run without it",
                               flag, config.architecture_name);
  std::vector<WeightMatrix*> matrices;
  for (LayerWeights& l : w.layers)
    for (WeightMatrix* m : l.matrices()) matrices.push_back(m);
  matrices.push_back(&w.lm_head);
  for (const WeightMatrix* m : matrices) {
    if (!is_float(m->dtype))
      return invalid_argument_error("{}: the checkpoint is already quantized (a weight matrix of dtype {}); "
                                    "--quantization needs f32, f16 or bf16 weights", flag, dtype_name(m->dtype));
  }
  for (WeightMatrix* m : matrices)
    quantize_matrix(*m, m == &w.lm_head ? DType::kInt8 : dtype, w.owned_quantized);
  w.quantization = dtype;
  // Random weights live in owned_f32: keep only what is still referenced (the embedding table).
  std::erase_if(w.owned_f32, [&](const std::unique_ptr<float[]>& p) { return p.get() != w.embed_tokens.data; });
  return ok_status();
}

}  // namespace pagoda
