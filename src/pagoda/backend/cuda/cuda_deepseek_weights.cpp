#include "pagoda/backend/cuda/cuda_deepseek_weights.h"

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/cuda_model_weights.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/backend/cuda/progress_bar.h"
#include "pagoda/backend/cuda/random_fill.h"
#include "pagoda/model/random_weights.h"

namespace pagoda::cuda {

namespace {

using bf16 = __nv_bfloat16;

// The matrix dimensions of one DeepSeek layer.
struct Dims {
  size_t hidden, heads, qk, nope, v, rank, rope, q_rank, inter, experts, moe_inter, shared_inter;
  Dims(const ModelConfig& c)
      : hidden(c.hidden_size),
        heads(c.num_q_heads),
        qk(c.mla->qk_head_dim()),
        nope(c.mla->qk_nope_head_dim),
        v(c.mla->v_head_dim),
        rank(c.mla->kv_lora_rank),
        rope(c.mla->qk_rope_head_dim),
        q_rank(c.mla->q_lora_rank),
        inter(c.intermediate_size),
        experts(c.moe ? c.moe->num_experts : 0),
        moe_inter(c.moe ? c.moe->moe_intermediate_size : 0),
        shared_inter(c.moe ? c.moe->shared_intermediate_size() : 0) {}
};

bool is_moe_layer(const ModelConfig& c, int32_t layer) { return c.moe && c.moe->is_moe_layer(layer); }

size_t matrix_bytes(const WeightMatrix& m) { return m.rows * m.cols * 2; }

}  // namespace

StatusOr<void*> CudaDeepseekWeights::allocate(size_t bytes) {
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(std::max<size_t>(bytes, 16)));
  void* data = buffer.data();
  total_bytes_ += bytes;
  buffers_.push_back(std::move(buffer));
  return data;
}

StatusOr<CudaDeepseekWeights> CudaDeepseekWeights::upload(const ModelConfig& config, const ModelWeights& host,
                                                          bool show_progress) {
  if (!config.mla)
    return invalid_argument_error("CudaDeepseekWeights: {} is not an MLA config", config.architecture_name);
  const Dims d(config);
  CudaDeepseekWeights w;
  size_t total = 0;
  for (const LayerWeights& l : host.layers)
    for (const WeightMatrix* m : l.matrices()) total += matrix_bytes(*m);
  ProgressBar progress("loading DeepSeek layers to the GPU", total, show_progress);
  std::vector<uint16_t> staging;

  // Stacks matrices row-wise into bf16 at `device` (already allocated).
  auto copy_stacked = [&](std::initializer_list<const WeightMatrix*> parts, void* device) -> Status {
    size_t elements = 0;
    for (const WeightMatrix* m : parts) elements += m->rows * m->cols;
    staging.resize(elements);
    size_t offset = 0;
    for (const WeightMatrix* m : parts) {
      matrix_to_bf16(*m, staging.data() + offset);
      offset += m->rows * m->cols;
    }
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(device, staging.data(), elements * 2, cudaMemcpyHostToDevice));
    progress.advance(elements * 2);
    return ok_status();
  };
  auto matrix = [&](std::initializer_list<const WeightMatrix*> parts) -> StatusOr<bf16*> {
    size_t elements = 0;
    for (const WeightMatrix* m : parts) elements += m->rows * m->cols;
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(elements * 2));
    PAGODA_RETURN_IF_ERROR(copy_stacked(parts, device));
    return static_cast<bf16*>(device);
  };
  auto vector = [&](const std::vector<float>& v) -> StatusOr<float*> {
    if (v.empty()) return static_cast<float*>(nullptr);
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(v.size() * sizeof(float)));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(device, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return static_cast<float*>(device);
  };
  auto f32_matrix = [&](const WeightMatrix& m) -> StatusOr<float*> {
    std::vector<float> v(m.rows * m.cols);
    const size_t element_bytes = static_cast<size_t>(dtype_bits(m.dtype)) / 8;
    for (size_t r = 0; r < m.rows; ++r)
      convert_to_f32(m.dtype, static_cast<const char*>(m.data) + r * m.cols * element_bytes, v.data() + r * m.cols,
                     m.cols);
    return vector(v);
  };

  for (size_t i = 0; i < host.layers.size(); ++i) {
    const LayerWeights& l = host.layers[i];
    const MlaLayerWeights& a = l.mla;
    CudaDeepseekLayerWeights g;
    PAGODA_ASSIGN_OR_RETURN(g.input_norm, vector(l.input_norm));
    PAGODA_ASSIGN_OR_RETURN(g.post_attention_norm, vector(l.post_attention_norm));
    if (d.q_rank == 0) {
      PAGODA_ASSIGN_OR_RETURN(g.q_proj, matrix({&a.q_proj}));
    } else {
      PAGODA_ASSIGN_OR_RETURN(g.q_a_proj, matrix({&a.q_a_proj}));
      PAGODA_ASSIGN_OR_RETURN(g.q_a_bias, vector(a.q_a_bias));
      PAGODA_ASSIGN_OR_RETURN(g.q_a_norm, vector(a.q_a_norm));
      PAGODA_ASSIGN_OR_RETURN(g.q_b_proj, matrix({&a.q_b_proj}));
    }
    PAGODA_ASSIGN_OR_RETURN(g.kv_a_proj, matrix({&a.kv_a_proj}));
    PAGODA_ASSIGN_OR_RETURN(g.kv_a_bias, vector(a.kv_a_bias));
    PAGODA_ASSIGN_OR_RETURN(g.kv_a_norm, vector(a.kv_a_norm));
    PAGODA_ASSIGN_OR_RETURN(g.kv_b_proj, matrix({&a.kv_b_proj}));
    PAGODA_ASSIGN_OR_RETURN(g.o_proj, matrix({&l.o_proj}));
    PAGODA_ASSIGN_OR_RETURN(g.o_bias, vector(l.o_bias));
    if (!is_moe_layer(config, static_cast<int32_t>(i))) {
      PAGODA_ASSIGN_OR_RETURN(g.gate_up_proj, matrix({&l.gate_proj, &l.up_proj}));
      PAGODA_ASSIGN_OR_RETURN(g.down_proj, matrix({&l.down_proj}));
    } else {
      const MoeLayerWeights& m = l.moe;
      if (m.experts.size() != d.experts)
        return invalid_argument_error("layer {}: {} routed experts bound, config has {}", i, m.experts.size(),
                                      d.experts);
      PAGODA_ASSIGN_OR_RETURN(g.router, f32_matrix(m.router));
      PAGODA_ASSIGN_OR_RETURN(g.correction_bias, vector(m.score_correction_bias));
      const size_t gate_up = 2 * d.moe_inter * d.hidden, down = d.hidden * d.moe_inter;
      PAGODA_ASSIGN_OR_RETURN(void* experts_gate_up, w.allocate(d.experts * gate_up * 2));
      PAGODA_ASSIGN_OR_RETURN(void* experts_down, w.allocate(d.experts * down * 2));
      g.experts_gate_up = static_cast<bf16*>(experts_gate_up);
      g.experts_down = static_cast<bf16*>(experts_down);
      for (size_t e = 0; e < d.experts; ++e) {
        const ExpertWeights& x = m.experts[e];
        PAGODA_RETURN_IF_ERROR(copy_stacked({&x.gate_proj, &x.up_proj}, g.experts_gate_up + e * gate_up));
        PAGODA_RETURN_IF_ERROR(copy_stacked({&x.down_proj}, g.experts_down + e * down));
      }
      if (m.shared.gate_proj.data != nullptr) {
        PAGODA_ASSIGN_OR_RETURN(g.shared_gate_up, matrix({&m.shared.gate_proj, &m.shared.up_proj}));
        PAGODA_ASSIGN_OR_RETURN(g.shared_down, matrix({&m.shared.down_proj}));
      }
    }
    w.layers.push_back(g);
  }
  progress.finish();
  return w;
}

StatusOr<CudaDeepseekWeights> CudaDeepseekWeights::random(const ModelConfig& config, uint64_t seed) {
  if (!config.mla)
    return invalid_argument_error("CudaDeepseekWeights: {} is not an MLA config", config.architecture_name);
  const Dims d(config);
  const MlaConfig& mla = *config.mla;
  CudaDeepseekWeights w;
  const float a = kRandomWeightHalfWidth;
  // Rows of matrix `kind` (drawn as layer `key`) at `dst`, as the CPU's RandomMatrices::make.
  auto fill = [&](bf16* dst, RandomMatrix kind, int32_t key, size_t rows, size_t cols) -> Status {
    PAGODA_CUDA_RETURN_IF_ERROR(fill_random_bf16(dst, static_cast<int64_t>(rows * cols), -a, a,
                                                 random_matrix_stream(seed, kind, key), nullptr));
    return ok_status();
  };
  auto matrix = [&](RandomMatrix kind, int32_t key, size_t rows, size_t cols) -> StatusOr<bf16*> {
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(rows * cols * 2));
    PAGODA_RETURN_IF_ERROR(fill(static_cast<bf16*>(device), kind, key, rows, cols));
    return static_cast<bf16*>(device);
  };
  auto stacked = [&](RandomMatrix first, RandomMatrix second, int32_t key, size_t rows, size_t cols)
      -> StatusOr<bf16*> {
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(2 * rows * cols * 2));
    auto* m = static_cast<bf16*>(device);
    PAGODA_RETURN_IF_ERROR(fill(m, first, key, rows, cols));
    PAGODA_RETURN_IF_ERROR(fill(m + rows * cols, second, key, rows, cols));
    return m;
  };
  auto constant = [&](size_t n, float value) -> StatusOr<float*> {
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(n * sizeof(float)));
    PAGODA_CUDA_RETURN_IF_ERROR(fill_constant(static_cast<float*>(device), static_cast<int64_t>(n), value, nullptr));
    return static_cast<float*>(device);
  };

  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    CudaDeepseekLayerWeights g;
    const size_t q_out = d.heads * d.qk;
    PAGODA_ASSIGN_OR_RETURN(g.input_norm, constant(d.hidden, 1.0f));
    PAGODA_ASSIGN_OR_RETURN(g.post_attention_norm, constant(d.hidden, 1.0f));
    if (d.q_rank == 0) {
      PAGODA_ASSIGN_OR_RETURN(g.q_proj, matrix(RandomMatrix::kQProj, layer, q_out, d.hidden));
    } else {
      PAGODA_ASSIGN_OR_RETURN(g.q_a_proj, matrix(RandomMatrix::kMlaQAProj, layer, d.q_rank, d.hidden));
      PAGODA_ASSIGN_OR_RETURN(g.q_a_norm, constant(d.q_rank, 1.0f));
      PAGODA_ASSIGN_OR_RETURN(g.q_b_proj, matrix(RandomMatrix::kMlaQBProj, layer, q_out, d.q_rank));
      if (mla.attention_bias) {
        PAGODA_ASSIGN_OR_RETURN(g.q_a_bias, constant(d.q_rank, 0.0f));
      }
    }
    PAGODA_ASSIGN_OR_RETURN(g.kv_a_proj, matrix(RandomMatrix::kMlaKvAProj, layer, d.rank + d.rope, d.hidden));
    if (mla.attention_bias) {
      PAGODA_ASSIGN_OR_RETURN(g.kv_a_bias, constant(d.rank + d.rope, 0.0f));
    }
    PAGODA_ASSIGN_OR_RETURN(g.kv_a_norm, constant(d.rank, 1.0f));
    PAGODA_ASSIGN_OR_RETURN(g.kv_b_proj, matrix(RandomMatrix::kMlaKvBProj, layer, d.heads * (d.nope + d.v), d.rank));
    PAGODA_ASSIGN_OR_RETURN(g.o_proj, matrix(RandomMatrix::kOProj, layer, d.hidden, d.heads * d.v));
    if (mla.attention_bias) {
      PAGODA_ASSIGN_OR_RETURN(g.o_bias, constant(d.hidden, 0.0f));
    }
    if (!is_moe_layer(config, layer)) {
      PAGODA_ASSIGN_OR_RETURN(g.gate_up_proj,
                              stacked(RandomMatrix::kGateProj, RandomMatrix::kUpProj, layer, d.inter, d.hidden));
      PAGODA_ASSIGN_OR_RETURN(g.down_proj, matrix(RandomMatrix::kDownProj, layer, d.hidden, d.inter));
    } else {
      PAGODA_ASSIGN_OR_RETURN(void* router, w.allocate(d.experts * d.hidden * sizeof(float)));
      g.router = static_cast<float*>(router);
      PAGODA_CUDA_RETURN_IF_ERROR(fill_random_f32(g.router, static_cast<int64_t>(d.experts * d.hidden), -a, a,
                                                  random_matrix_stream(seed, RandomMatrix::kMoeRouter, layer),
                                                  nullptr));
      if (config.moe->score_correction_bias) {
        PAGODA_ASSIGN_OR_RETURN(g.correction_bias, constant(d.experts, 0.0f));
      }
      const size_t gate_up = 2 * d.moe_inter * d.hidden, down = d.hidden * d.moe_inter;
      PAGODA_ASSIGN_OR_RETURN(void* experts_gate_up, w.allocate(d.experts * gate_up * 2));
      PAGODA_ASSIGN_OR_RETURN(void* experts_down, w.allocate(d.experts * down * 2));
      g.experts_gate_up = static_cast<bf16*>(experts_gate_up);
      g.experts_down = static_cast<bf16*>(experts_down);
      for (size_t e = 0; e < d.experts; ++e) {
        const int32_t key = random_expert_key(layer, static_cast<int32_t>(e));
        bf16* gu = g.experts_gate_up + e * gate_up;
        PAGODA_RETURN_IF_ERROR(fill(gu, RandomMatrix::kMoeExpertGate, key, d.moe_inter, d.hidden));
        PAGODA_RETURN_IF_ERROR(
            fill(gu + d.moe_inter * d.hidden, RandomMatrix::kMoeExpertUp, key, d.moe_inter, d.hidden));
        PAGODA_RETURN_IF_ERROR(
            fill(g.experts_down + e * down, RandomMatrix::kMoeExpertDown, key, d.hidden, d.moe_inter));
      }
      if (d.shared_inter > 0) {
        PAGODA_ASSIGN_OR_RETURN(g.shared_gate_up, stacked(RandomMatrix::kMoeSharedGate, RandomMatrix::kMoeSharedUp,
                                                          layer, d.shared_inter, d.hidden));
        PAGODA_ASSIGN_OR_RETURN(g.shared_down, matrix(RandomMatrix::kMoeSharedDown, layer, d.hidden, d.shared_inter));
      }
    }
    w.layers.push_back(g);
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return w;
}

}  // namespace pagoda::cuda
