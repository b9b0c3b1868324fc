#include "pagoda/backend/cpu/quantize_weights.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pagoda/backend/cpu/kernels/quant_dot.h"
#include "pagoda/backend/cpu/kernels/quant_panels.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/fp8_matrix.h"

namespace pagoda {

namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// Replaces m by its quantized copy (owned by `owned`).
void quantize_matrix(WeightMatrix& m, DType dtype, std::vector<std::unique_ptr<uint8_t[]>>& owned) {
  const size_t row_bytes = kernels::quantized_row_bytes(dtype, m.cols);
  // Rows start on a 64-byte line where row_bytes allows (the dot kernels read 64 bytes at a time).
  constexpr size_t kAlign = 64;
  auto out = std::make_unique<uint8_t[]>(m.rows * row_bytes + kAlign);
  const size_t elem_bytes = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  uint8_t* dst = out.get() + (kAlign - reinterpret_cast<uintptr_t>(out.get()) % kAlign) % kAlign;
  ThreadPool::global().parallel_for(m.rows, [&](size_t begin, size_t end) {
    std::vector<float> row(m.cols);
    for (size_t r = begin; r < end; ++r) {
      convert_to_f32(m.dtype, static_cast<const char*>(m.data) + r * m.cols * elem_bytes, row.data(), m.cols);
      kernels::quantize_weight_rows(dtype, row.data(), 1, m.cols, dst + r * row_bytes);
    }
  }, 64);
  if (kernels::quant_panels_enabled()) {  // four-row panels for the decode GEMV, in place
    const size_t panels = m.rows / kernels::kQuantPanelRows;
    ThreadPool::global().parallel_for(panels, [&](size_t begin, size_t end) {
      kernels::pack_quant_panels(dtype, dst + begin * kernels::kQuantPanelRows * row_bytes,
                                 (end - begin) * kernels::kQuantPanelRows, m.cols);
    }, 16);
    m.quant_panels = true;
  }
  m.dtype = dtype;
  m.data = dst;
  owned.push_back(std::move(out));
}

// Replaces m by its fp8 copy: one scale per output row (amax / 448), dynamic per-token activations.
void quantize_matrix_fp8(WeightMatrix& m, ModelWeights& w) {
  auto bytes = std::make_unique<uint8_t[]>(m.rows * m.cols);
  auto scales = std::make_unique<float[]>(m.rows);
  const size_t elem_bytes = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  ThreadPool::global().parallel_for(m.rows, [&](size_t begin, size_t end) {
    std::vector<float> row(m.cols);
    for (size_t r = begin; r < end; ++r) {
      convert_to_f32(m.dtype, static_cast<const char*>(m.data) + r * m.cols * elem_bytes, row.data(), m.cols);
      scales[r] = quantize_fp8_row(row.data(), m.cols, bytes.get() + r * m.cols);
    }
  }, 64);
  m.dtype = DType::kFP8E4M3;
  m.data = bytes.get();
  m.fp8 = Fp8MatrixScales{};
  m.fp8.layout = Fp8WeightScale::kChannel;
  m.fp8.scales = scales.get();
  m.fp8.activation = Fp8Activation::kDynamicToken;
  w.owned_quantized.push_back(std::move(bytes));
  w.owned_f32.push_back(std::move(scales));
}

}  // namespace

Fp8QuantConfig online_fp8_config() {
  Fp8QuantConfig c;
  c.format = Fp8Format::kOnline;
  c.weight_scale = Fp8WeightScale::kChannel;
  c.activation = Fp8Activation::kDynamicToken;
  c.ignore = {"lm_head"};
  return c;
}

Status quantize_model_weights(const ModelConfig& config, ModelWeights& w, DType dtype) {
  const std::string flag = "--quantization " + std::string(dtype_name(dtype));
  if (!kernels::is_quantized_weight(dtype) && dtype != DType::kFP8E4M3)
    return invalid_argument_error("--quantization {}: expected int8, int4 or fp8", dtype_name(dtype));
  if (w.quantization)
    return invalid_argument_error("{}: the weights are already quantized ({})", flag, dtype_name(*w.quantization));
  if (config.mla || config.moe)
    return unimplemented_error("{}: not supported for {} (MLA/MoE) models on the CPU yet; run without it",
                               flag, config.architecture_name);
  if (w.fp8)
    return invalid_argument_error("{}: the checkpoint is already quantized ({})", flag, w.fp8->describe());
  std::vector<WeightMatrix*> matrices;
  for (LayerWeights& l : w.layers)
    for (WeightMatrix* m : l.matrices()) matrices.push_back(m);
  // fp8 leaves lm_head as loaded (as vLLM's online fp8 does); int8/int4 quantize it.
  if (dtype != DType::kFP8E4M3) matrices.push_back(&w.lm_head);
  for (const WeightMatrix* m : matrices) {
    if (!is_float(m->dtype))
      return invalid_argument_error("{}: the checkpoint is already quantized (a weight matrix of dtype {}); "
                                    "--quantization needs f32, f16 or bf16 weights", flag, dtype_name(m->dtype));
  }
  // Random weights live in owned_f32: the copies replaced here are released below.
  std::vector<const void*> replaced;
  for (const WeightMatrix* m : matrices) replaced.push_back(m->data);
  for (WeightMatrix* m : matrices) {
    if (dtype == DType::kFP8E4M3) quantize_matrix_fp8(*m, w);
    else quantize_matrix(*m, m == &w.lm_head ? DType::kInt8 : dtype, w.owned_quantized);
  }
  w.quantization = dtype;
  if (dtype == DType::kFP8E4M3) w.fp8 = online_fp8_config();
  std::erase_if(w.owned_f32, [&](const std::unique_ptr<float[]>& p) {
    return p.get() != w.embed_tokens.data && p.get() != w.lm_head.data &&
           std::find(replaced.begin(), replaced.end(), p.get()) != replaced.end();
  });
  return ok_status();
}

}  // namespace pagoda
