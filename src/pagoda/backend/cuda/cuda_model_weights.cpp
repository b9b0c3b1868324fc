#include "pagoda/backend/cuda/cuda_model_weights.h"

#include <algorithm>
#include <cstring>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
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

enum class Fp8Upload { kBf16, kChannel, kBlock128 };

// How stacked parts (q|k|v, gate|up, or one matrix) go to the GPU.
Fp8Upload fp8_upload_kind(std::initializer_list<const WeightMatrix*> parts, const Fp8UploadOptions& options) {
  bool any_fp8 = false, all_fp8 = true;
  for (const WeightMatrix* m : parts) {
    any_fp8 = any_fp8 || m->dtype == DType::kFP8E4M3;
    all_fp8 = all_fp8 && m->dtype == DType::kFP8E4M3;
  }
  if (!any_fp8) return options.quantize ? Fp8Upload::kChannel : Fp8Upload::kBf16;
  if (!all_fp8) return Fp8Upload::kBf16;  // an ignored part among quantized ones: all run bf16
  const Fp8MatrixScales& first = (*parts.begin())->fp8;
  bool channel = true, block = options.block128_supported;
  size_t index = 0;
  for (const WeightMatrix* m : parts) {
    const Fp8MatrixScales& s = m->fp8;
    if (s.activation != first.activation) return Fp8Upload::kBf16;
    channel = channel && s.layout != Fp8WeightScale::kBlock &&
              (s.activation == Fp8Activation::kDynamicToken || s.activation == Fp8Activation::kStaticTensor);
    const bool last = ++index == parts.size();
    block = block && s.layout == Fp8WeightScale::kBlock && s.block_rows == 128 && s.block_cols == 128 &&
            s.activation == Fp8Activation::kDynamicGroup && s.activation_group == 128 && (last || m->rows % 128 == 0);
  }
  if (channel) return Fp8Upload::kChannel;
  if (block) return Fp8Upload::kBlock128;
  return Fp8Upload::kBf16;
}

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

void CudaModelWeights::release(const void* data) {
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
    if (it->data() != data) continue;
    total_bytes_ -= it->bytes();
    buffers_.erase(it);
    return;
  }
}

StatusOr<void*> CudaModelWeights::allocate(size_t bytes) {
  PAGODA_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::allocate(bytes));
  void* data = buffer.data();
  total_bytes_ += bytes;
  buffers_.push_back(std::move(buffer));
  return data;
}

StatusOr<CudaModelWeights> CudaModelWeights::upload(const ModelConfig& config, const ModelWeights& host,
                                                    bool show_progress, const Fp8UploadOptions& fp8_options) {
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
  // Stacked parts as e4m3 bytes with per-output-channel scales (a tensor scale repeated per row; f32/f16/bf16
  // parts quantized here with quantize_fp8_row) and, for static activations, the largest input scale.
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  // The staged fp8 bytes and scales into new device buffers of f.
  auto copy_fp8_staging = [&](CudaFp8Weight& f) -> Status {
    PAGODA_ASSIGN_OR_RETURN(void* data, w.allocate(bytes.size()));
    PAGODA_ASSIGN_OR_RETURN(void* s, w.allocate(scales.size() * sizeof(float)));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(s, scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice));
    f.data = static_cast<uint8_t*>(data);
    f.scales = static_cast<float*>(s);
    return ok_status();
  };
  auto upload_fp8_channel = [&](std::initializer_list<const WeightMatrix*> parts) -> StatusOr<CudaFp8Weight> {
    size_t rows = 0, cols = (*parts.begin())->cols;
    for (const WeightMatrix* m : parts) rows += m->rows;
    bytes.resize(rows * cols);
    scales.resize(rows);
    float input_scale = 0.0f;
    size_t r0 = 0;
    for (const WeightMatrix* m : parts) {
      if (m->dtype == DType::kFP8E4M3) {
        std::memcpy(bytes.data() + r0 * cols, m->data, m->rows * cols);
        for (size_t r = 0; r < m->rows; ++r)
          scales[r0 + r] = m->fp8.layout == Fp8WeightScale::kTensor ? m->fp8.scales[0] : m->fp8.scales[r];
        if (m->fp8.activation == Fp8Activation::kStaticTensor) input_scale = std::max(input_scale, m->fp8.input_scale);
      } else {
        const size_t element_bytes = static_cast<size_t>(dtype_bits(m->dtype)) / 8;
        ThreadPool::global().parallel_for(m->rows, [&](size_t begin, size_t end) {
          std::vector<float> f32(cols);
          for (size_t r = begin; r < end; ++r) {
            convert_to_f32(m->dtype, static_cast<const char*>(m->data) + r * cols * element_bytes, f32.data(), cols);
            scales[r0 + r] = quantize_fp8_row(f32.data(), cols, bytes.data() + (r0 + r) * cols);
          }
        });
      }
      r0 += m->rows;
    }
    CudaFp8Weight f;
    PAGODA_RETURN_IF_ERROR(copy_fp8_staging(f));
    if (input_scale > 0.0f) {
      PAGODA_ASSIGN_OR_RETURN(void* in, w.allocate(sizeof(float)));
      PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(in, &input_scale, sizeof(float), cudaMemcpyHostToDevice));
      f.input_scale = static_cast<float*>(in);
    }
    progress.advance(rows * cols * 2);
    return f;
  };
  // Stacked 128x128-block parts (every part but the last a whole number of row blocks): the bytes as they
  // are, the scales into Fp8Gemm::linear_block128's layout (row blocks of the stack, k-blocks padded to 4).
  auto upload_fp8_block = [&](std::initializer_list<const WeightMatrix*> parts) -> StatusOr<CudaFp8Weight> {
    size_t rows = 0;
    const size_t cols = (*parts.begin())->cols;
    for (const WeightMatrix* m : parts) rows += m->rows;
    const size_t groups = static_cast<size_t>(fp8_block_groups(static_cast<int32_t>(cols)));
    const size_t stride = static_cast<size_t>(fp8_block_weight_scale_stride(static_cast<int32_t>(cols)));
    bytes.resize(rows * cols);
    scales.assign((rows + 127) / 128 * stride, 0.0f);
    size_t r0 = 0;
    for (const WeightMatrix* m : parts) {
      std::memcpy(bytes.data() + r0 * cols, m->data, m->rows * cols);
      for (size_t rb = 0; rb < (m->rows + 127) / 128; ++rb)
        for (size_t g = 0; g < groups; ++g) scales[(r0 / 128 + rb) * stride + g] = m->fp8.scales[rb * groups + g];
      r0 += m->rows;
    }
    CudaFp8Weight f;
    f.block128 = true;
    PAGODA_RETURN_IF_ERROR(copy_fp8_staging(f));
    progress.advance(rows * cols * 2);
    return f;
  };
  // One projection: fp8 where fp8_upload_kind allows it, else bf16.
  auto upload_projection = [&](std::initializer_list<const WeightMatrix*> parts, __nv_bfloat16*& bf16,
                               CudaFp8Weight& fp8) -> Status {
    const Fp8Upload kind = fp8_upload_kind(parts, fp8_options);
    if (kind == Fp8Upload::kBf16) {
      PAGODA_ASSIGN_OR_RETURN(bf16, upload_stacked(parts));
      return ok_status();
    }
    if (kind == Fp8Upload::kChannel) {
      PAGODA_ASSIGN_OR_RETURN(fp8, upload_fp8_channel(parts));
    } else {
      PAGODA_ASSIGN_OR_RETURN(fp8, upload_fp8_block(parts));
    }
    ++w.fp8_projections_;
    return ok_status();
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
  if (fp8_options.lm_head && !config.mla) {
    const WeightMatrix& head = host.lm_head.data != nullptr ? host.lm_head : host.embed_tokens;
    const Fp8Upload kind = fp8_upload_kind({&head}, fp8_options);
    if (kind == Fp8Upload::kChannel) {
      PAGODA_ASSIGN_OR_RETURN(w.lm_head_fp8, upload_fp8_channel({&head}));
    } else if (kind == Fp8Upload::kBlock128) {
      PAGODA_ASSIGN_OR_RETURN(w.lm_head_fp8, upload_fp8_block({&head}));
    }
  }
  PAGODA_ASSIGN_OR_RETURN(w.final_norm, upload_vectors({&host.final_norm}));
  for (const LayerWeights& l : host.layers) {
    if (config.mla) break;  // DeepSeek layers: CudaDeepseekWeights
    CudaLayerWeights d;
    PAGODA_RETURN_IF_ERROR(upload_projection({&l.q_proj, &l.k_proj, &l.v_proj}, d.qkv_proj, d.qkv_fp8));
    PAGODA_RETURN_IF_ERROR(upload_projection({&l.o_proj}, d.o_proj, d.o_fp8));
    PAGODA_RETURN_IF_ERROR(upload_projection({&l.gate_proj, &l.up_proj}, d.gate_up_proj, d.gate_up_fp8));
    PAGODA_RETURN_IF_ERROR(upload_projection({&l.down_proj}, d.down_proj, d.down_fp8));
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

StatusOr<CudaModelWeights> CudaModelWeights::random(const ModelConfig& config, uint64_t seed, bool quantize_fp8,
                                                    bool fp8_lm_head) {
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
  if (quantize_fp8 && fp8_lm_head && !config.mla) {
    // Per output channel on the GPU, as the projections below; the bf16 lm_head stays.
    PAGODA_ASSIGN_OR_RETURN(void* data, w.allocate(s.vocab * s.hidden));
    PAGODA_ASSIGN_OR_RETURN(void* scales, w.allocate(s.vocab * sizeof(float)));
    w.lm_head_fp8.data = static_cast<uint8_t*>(data);
    w.lm_head_fp8.scales = static_cast<float*>(scales);
    PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_per_token(w.lm_head, static_cast<int32_t>(s.vocab),
                                                       static_cast<int32_t>(s.hidden), w.lm_head_fp8.data,
                                                       w.lm_head_fp8.scales, nullptr));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
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
    if (quantize_fp8) {
      // Per output channel, on the GPU (the per-token kernel over weight rows: amax / 448 per row).
      auto quantize = [&](__nv_bfloat16*& bf16, CudaFp8Weight& fp8, size_t rows, size_t cols) -> Status {
        PAGODA_ASSIGN_OR_RETURN(void* data, w.allocate(rows * cols));
        PAGODA_ASSIGN_OR_RETURN(void* scales, w.allocate(rows * sizeof(float)));
        fp8.data = static_cast<uint8_t*>(data);
        fp8.scales = static_cast<float*>(scales);
        PAGODA_CUDA_RETURN_IF_ERROR(quantize_fp8_per_token(bf16, static_cast<int32_t>(rows),
                                                           static_cast<int32_t>(cols), fp8.data, fp8.scales, nullptr));
        PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        w.release(bf16);
        bf16 = nullptr;
        ++w.fp8_projections_;
        return ok_status();
      };
      PAGODA_RETURN_IF_ERROR(quantize(d.qkv_proj, d.qkv_fp8, s.qkv_rows, s.hidden));
      PAGODA_RETURN_IF_ERROR(quantize(d.o_proj, d.o_fp8, s.hidden, s.q_width));
      PAGODA_RETURN_IF_ERROR(quantize(d.gate_up_proj, d.gate_up_fp8, 2 * s.inter, s.hidden));
      PAGODA_RETURN_IF_ERROR(quantize(d.down_proj, d.down_fp8, s.hidden, s.inter));
    }
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
