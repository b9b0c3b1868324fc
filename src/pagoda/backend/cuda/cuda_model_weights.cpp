#include "pagoda/backend/cuda/cuda_model_weights.h"

#include <cstring>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/random_fill.h"
#include "pagoda/model/fp8_matrix.h"
#include "pagoda/model/random_weights.h"
#include "pagoda/backend/cuda/progress_bar.h"
#include "pagoda/core/thread_pool.h"

namespace pagoda::cuda {

namespace {

struct Shapes {
  size_t hidden, qkv_rows, q_width, inter, vocab, head_dim;
  explicit Shapes(const ModelConfig& c)
      : hidden(c.hidden_size),
        qkv_rows(static_cast<size_t>(c.num_q_heads + 2 * c.num_kv_heads) * c.head_dim),
        q_width(static_cast<size_t>(c.num_q_heads) * c.head_dim),
        inter(c.intermediate_size),
        vocab(c.vocab_size),
        head_dim(c.head_dim) {}
  size_t layer_matrix_elements() const {
    return qkv_rows * hidden + hidden * q_width + 2 * inter * hidden + hidden * inter;
  }
};

}  // namespace

void matrix_to_bf16(const WeightMatrix& m, uint16_t* dst) {
  const size_t n = m.rows * m.cols;
  if (m.dtype == DType::kBF16) {
    std::memcpy(dst, m.data, n * sizeof(uint16_t));
    return;
  }
  ThreadPool::global().parallel_for(m.rows, [&](size_t begin, size_t end) {
    std::vector<float> row(m.cols);
    const size_t element_bytes = static_cast<size_t>(dtype_bits(m.dtype)) / 8;
    for (size_t r = begin; r < end; ++r) {
      // An FP8 checkpoint's weights run as bf16 on the GPU for now: dequantized with their scales.
      if (m.dtype == DType::kFP8E4M3) dequantize_fp8_rows(m, r, r + 1, row.data());
      else convert_to_f32(m.dtype, static_cast<const char*>(m.data) + r * m.cols * element_bytes, row.data(), m.cols);
      for (size_t c = 0; c < m.cols; ++c) dst[r * m.cols + c] = f32_to_bf16(row[c]);
    }
  });
}

size_t cuda_weight_bytes(const ModelConfig& config) {
  const Shapes s(config);
  // DeepSeek layers are CudaDeepseekWeights' (its own count and progress bar).
  size_t bytes = config.mla ? 0 : static_cast<size_t>(config.num_layers) * s.layer_matrix_elements() * 2;
  bytes += s.vocab * s.hidden * 2 * (config.tie_word_embeddings ? 1 : 2);
  return bytes;
}

StatusOr<void*> CudaModelWeights::allocate(size_t bytes) {
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(bytes));
  void* data = buffer.data();
  total_bytes_ += bytes;
  buffers_.push_back(std::move(buffer));
  return data;
}

StatusOr<CudaModelWeights> CudaModelWeights::upload(const ModelConfig& config, const ModelWeights& host,
                                                    bool show_progress) {
  const Shapes s(config);
  CudaModelWeights w;
  ProgressBar progress("loading weights to the GPU", cuda_weight_bytes(config), show_progress);
  std::vector<uint16_t> staging;

  // Stacks matrices row-wise into one bf16 device matrix.
  auto upload_stacked = [&](std::initializer_list<const WeightMatrix*> parts) -> StatusOr<__nv_bfloat16*> {
    size_t elements = 0;
    for (const WeightMatrix* m : parts) elements += m->rows * m->cols;
    staging.resize(elements);
    size_t offset = 0;
    for (const WeightMatrix* m : parts) {
      matrix_to_bf16(*m, staging.data() + offset);
      offset += m->rows * m->cols;
    }
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(elements * 2));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(device, staging.data(), elements * 2, cudaMemcpyHostToDevice));
    progress.advance(elements * 2);
    return static_cast<__nv_bfloat16*>(device);
  };
  // Concatenates f32 vectors into one device vector; null when all are empty.
  auto upload_vectors = [&](std::initializer_list<const std::vector<float>*> parts) -> StatusOr<float*> {
    std::vector<float> joined;
    for (const std::vector<float>* v : parts) joined.insert(joined.end(), v->begin(), v->end());
    if (joined.empty()) return static_cast<float*>(nullptr);
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(joined.size() * sizeof(float)));
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(device, joined.data(), joined.size() * sizeof(float), cudaMemcpyHostToDevice));
    return static_cast<float*>(device);
  };

  PAGODA_ASSIGN_OR_RETURN(w.embed_tokens, upload_stacked({&host.embed_tokens}));
  if (config.tie_word_embeddings || host.lm_head.data == host.embed_tokens.data) {
    w.lm_head = w.embed_tokens;
  } else {
    PAGODA_ASSIGN_OR_RETURN(w.lm_head, upload_stacked({&host.lm_head}));
  }
  PAGODA_ASSIGN_OR_RETURN(w.final_norm, upload_vectors({&host.final_norm}));
  for (const LayerWeights& l : host.layers) {
    if (config.mla) break;  // DeepSeek layers: CudaDeepseekWeights
    CudaLayerWeights d;
    PAGODA_ASSIGN_OR_RETURN(d.qkv_proj, upload_stacked({&l.q_proj, &l.k_proj, &l.v_proj}));
    PAGODA_ASSIGN_OR_RETURN(d.o_proj, upload_stacked({&l.o_proj}));
    PAGODA_ASSIGN_OR_RETURN(d.gate_up_proj, upload_stacked({&l.gate_proj, &l.up_proj}));
    PAGODA_ASSIGN_OR_RETURN(d.down_proj, upload_stacked({&l.down_proj}));
    PAGODA_ASSIGN_OR_RETURN(d.input_norm, upload_vectors({&l.input_norm}));
    PAGODA_ASSIGN_OR_RETURN(d.post_attention_norm, upload_vectors({&l.post_attention_norm}));
    PAGODA_ASSIGN_OR_RETURN(d.q_norm, upload_vectors({&l.q_norm}));
    PAGODA_ASSIGN_OR_RETURN(d.k_norm, upload_vectors({&l.k_norm}));
    if (!l.q_bias.empty() || !l.k_bias.empty() || !l.v_bias.empty()) {
      // A missing part of the fused bias is zero.
      std::vector<float> q = l.q_bias, k = l.k_bias, v = l.v_bias;
      q.resize(s.q_width, 0.0f);
      k.resize(static_cast<size_t>(config.num_kv_heads) * s.head_dim, 0.0f);
      v.resize(static_cast<size_t>(config.num_kv_heads) * s.head_dim, 0.0f);
      PAGODA_ASSIGN_OR_RETURN(d.qkv_bias, upload_vectors({&q, &k, &v}));
    }
    PAGODA_ASSIGN_OR_RETURN(d.o_bias, upload_vectors({&l.o_bias}));
    if (!l.gate_bias.empty() || !l.up_bias.empty()) {
      std::vector<float> g = l.gate_bias, u = l.up_bias;
      g.resize(s.inter, 0.0f);
      u.resize(s.inter, 0.0f);
      PAGODA_ASSIGN_OR_RETURN(d.gate_up_bias, upload_vectors({&g, &u}));
    }
    PAGODA_ASSIGN_OR_RETURN(d.down_bias, upload_vectors({&l.down_bias}));
    d.k_scale = l.k_scale;
    d.v_scale = l.v_scale;
    w.layers.push_back(d);
  }
  progress.finish();
  return w;
}

StatusOr<CudaModelWeights> CudaModelWeights::random(const ModelConfig& config, uint64_t seed) {
  const Shapes s(config);
  CudaModelWeights w;
  // model/random_weights.h's matrices, as the CPU makes them: a stacked matrix
  // (q|k|v, gate|up) is filled part by part, each part from its own stream.
  const float a = kRandomWeightHalfWidth;
  struct Part {
    RandomMatrix kind;
    size_t rows;
  };
  auto random_matrix = [&](std::initializer_list<Part> parts, int32_t layer, size_t cols) -> StatusOr<__nv_bfloat16*> {
    size_t rows = 0;
    for (const Part& p : parts) rows += p.rows;
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(rows * cols * 2));
    auto* m = static_cast<__nv_bfloat16*>(device);
    size_t offset = 0;
    for (const Part& p : parts) {
      PAGODA_CUDA_RETURN_IF_ERROR(fill_random_bf16(m + offset, static_cast<int64_t>(p.rows * cols), -a, a,
                                                   random_matrix_stream(seed, p.kind, layer), nullptr));
      offset += p.rows * cols;
    }
    return m;
  };
  auto constant_vector = [&](size_t n, float value) -> StatusOr<float*> {
    PAGODA_ASSIGN_OR_RETURN(void* device, w.allocate(n * sizeof(float)));
    auto* v = static_cast<float*>(device);
    PAGODA_CUDA_RETURN_IF_ERROR(fill_constant(v, static_cast<int64_t>(n), value, nullptr));
    return v;
  };
  PAGODA_ASSIGN_OR_RETURN(w.embed_tokens, random_matrix({{RandomMatrix::kEmbedTokens, s.vocab}}, -1, s.hidden));
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    PAGODA_ASSIGN_OR_RETURN(w.lm_head, random_matrix({{RandomMatrix::kLmHead, s.vocab}}, -1, s.hidden));
  }
  PAGODA_ASSIGN_OR_RETURN(w.final_norm, constant_vector(s.hidden, 1.0f));
  for (int32_t layer = 0; layer < (config.mla ? 0 : config.num_layers); ++layer) {
    CudaLayerWeights d;
    const size_t kv_width = (s.qkv_rows - s.q_width) / 2;
    PAGODA_ASSIGN_OR_RETURN(d.qkv_proj, random_matrix({{RandomMatrix::kQProj, s.q_width},
                                                       {RandomMatrix::kKProj, kv_width},
                                                       {RandomMatrix::kVProj, kv_width}},
                                                      layer, s.hidden));
    PAGODA_ASSIGN_OR_RETURN(d.o_proj, random_matrix({{RandomMatrix::kOProj, s.hidden}}, layer, s.q_width));
    PAGODA_ASSIGN_OR_RETURN(d.gate_up_proj, random_matrix({{RandomMatrix::kGateProj, s.inter},
                                                           {RandomMatrix::kUpProj, s.inter}},
                                                          layer, s.hidden));
    PAGODA_ASSIGN_OR_RETURN(d.down_proj, random_matrix({{RandomMatrix::kDownProj, s.hidden}}, layer, s.inter));
    PAGODA_ASSIGN_OR_RETURN(d.input_norm, constant_vector(s.hidden, 1.0f));
    PAGODA_ASSIGN_OR_RETURN(d.post_attention_norm, constant_vector(s.hidden, 1.0f));
    if (config.qk_norm) {
      PAGODA_ASSIGN_OR_RETURN(d.q_norm, constant_vector(s.head_dim, 1.0f));
      PAGODA_ASSIGN_OR_RETURN(d.k_norm, constant_vector(s.head_dim, 1.0f));
    }
    if (config.qkv_bias) {
      PAGODA_ASSIGN_OR_RETURN(d.qkv_bias, constant_vector(s.qkv_rows, 0.0f));
    }
    if (config.o_proj_bias) {
      PAGODA_ASSIGN_OR_RETURN(d.o_bias, constant_vector(s.hidden, 0.0f));
    }
    if (config.mlp_bias) {
      PAGODA_ASSIGN_OR_RETURN(d.gate_up_bias, constant_vector(2 * s.inter, 0.0f));
      PAGODA_ASSIGN_OR_RETURN(d.down_bias, constant_vector(s.hidden, 0.0f));
    }
    w.layers.push_back(d);
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return w;
}

}  // namespace pagoda::cuda
