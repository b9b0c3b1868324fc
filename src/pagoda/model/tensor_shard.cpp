#include "pagoda/model/tensor_shard.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pagoda {
namespace {

bool plain_float(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Rows [begin, begin + rows) of m, as a view. fp8 scales follow the rows: a
// per-channel scale vector is offset, a per-tensor scale stays, block scales
// start at the first row of blocks (the caller checked the alignment).
WeightMatrix row_slice(const WeightMatrix& m, size_t begin, size_t rows) {
  const size_t row_bytes = m.cols * static_cast<size_t>(dtype_bits(m.dtype) / 8);
  WeightMatrix out = m;
  out.data = static_cast<const char*>(m.data) + begin * row_bytes;
  out.rows = rows;
  if (m.dtype == DType::kFP8E4M3 && m.fp8.scales != nullptr) {
    if (m.fp8.layout == Fp8WeightScale::kChannel) out.fp8.scales = m.fp8.scales + begin;
    if (m.fp8.layout == Fp8WeightScale::kBlock)
      out.fp8.scales = m.fp8.scales + begin / static_cast<size_t>(m.fp8.block_rows) *
                                          ceil_div(m.cols, static_cast<size_t>(m.fp8.block_cols));
  }
  return out;
}

// Columns [begin, begin + cols) of m, copied into a buffer `owned` keeps. fp8
// scales: per-channel and per-tensor ones stay (every row is kept); block
// scales are copied for the rank's columns of blocks into `owned_scales`.
WeightMatrix column_slice(const WeightMatrix& m, size_t begin, size_t cols,
                          std::vector<std::unique_ptr<uint8_t[]>>& owned,
                          std::vector<std::unique_ptr<float[]>>& owned_scales) {
  const size_t elem = static_cast<size_t>(dtype_bits(m.dtype) / 8);
  auto copy = std::make_unique<uint8_t[]>(m.rows * cols * elem);
  for (size_t r = 0; r < m.rows; ++r)
    std::memcpy(copy.get() + r * cols * elem, static_cast<const uint8_t*>(m.data) + (r * m.cols + begin) * elem,
                cols * elem);
  WeightMatrix out = m;
  out.data = copy.get();
  out.cols = cols;
  owned.push_back(std::move(copy));
  if (m.dtype == DType::kFP8E4M3 && m.fp8.scales != nullptr && m.fp8.layout == Fp8WeightScale::kBlock) {
    const size_t br = static_cast<size_t>(m.fp8.block_rows), bc = static_cast<size_t>(m.fp8.block_cols);
    const size_t block_rows = ceil_div(m.rows, br), whole_cols = ceil_div(m.cols, bc), rank_cols = ceil_div(cols, bc);
    auto scales = std::make_unique<float[]>(block_rows * rank_cols);
    for (size_t r = 0; r < block_rows; ++r)
      std::memcpy(scales.get() + r * rank_cols, m.fp8.scales + r * whole_cols + begin / bc, rank_cols * sizeof(float));
    out.fp8.scales = scales.get();
    owned_scales.push_back(std::move(scales));
  }
  return out;
}

// An fp8 matrix's block scales and grouped activation scales must not straddle
// two ranks: the rank's rows (row_range) or columns start and end on their
// boundaries (the last block of the whole matrix may be partial).
Status check_fp8_split(const WeightMatrix& m, const std::string& name, bool columns, size_t begin, size_t n,
                       int32_t ranks) {
  const size_t extent = columns ? m.cols : m.rows;
  auto aligned = [&](size_t unit) {
    return unit == 0 || (begin % unit == 0 && ((begin + n) % unit == 0 || begin + n == extent));
  };
  if (m.dtype == DType::kFP8E4M3 && m.fp8.layout == Fp8WeightScale::kBlock) {
    const size_t unit = static_cast<size_t>(columns ? m.fp8.block_cols : m.fp8.block_rows);
    if (!aligned(unit))
      return invalid_argument_error(
          "--tensor-parallel-size {}: {} [{}, {}] has {}x{} fp8 scale blocks; a rank's {} [{}, {}) do not start and "
          "end on their {}-{} boundaries", ranks, name, m.rows, m.cols, m.fp8.block_rows, m.fp8.block_cols,
          columns ? "columns" : "rows", begin, begin + n, unit, columns ? "column" : "row");
  }
  if (columns && m.fp8.activation == Fp8Activation::kDynamicGroup &&
      !aligned(static_cast<size_t>(m.fp8.activation_group)))
    return invalid_argument_error(
        "--tensor-parallel-size {}: {} [{}, {}] quantizes its input in groups of {} columns; a rank's columns [{}, {}) "
        "do not start and end on them", ranks, name, m.rows, m.cols, m.fp8.activation_group, begin, begin + n);
  return ok_status();
}

std::vector<float> slice(const std::vector<float>& v, size_t begin, size_t n) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(begin),
                            v.begin() + static_cast<std::ptrdiff_t>(begin + n));
}

Status check_matrix(const WeightMatrix& m, size_t rows, size_t cols, const std::string& name, bool fp8_ok = false) {
  if (!plain_float(m.dtype) && !(fp8_ok && m.dtype == DType::kFP8E4M3))
    return unimplemented_error("tensor parallelism: {} is {}; sharding takes f32, f16 or bf16 weights{}", name,
                               dtype_name(m.dtype), fp8_ok ? " or an fp8 checkpoint's" : "");
  if (m.data == nullptr || m.rows != rows || m.cols != cols)
    return invalid_argument_error("tensor parallelism: {} is [{}, {}], the config implies [{}, {}]", name, m.rows,
                                  m.cols, rows, cols);
  return ok_status();
}

}  // namespace

Status check_tensor_parallel(const ModelConfig& c, int32_t n) {
  if (n < 1) return invalid_argument_error("--tensor-parallel-size {}: must be at least 1", n);
  if (n == 1) return ok_status();
  if (c.mla || c.moe)
    return unimplemented_error("--tensor-parallel-size {}: {} (multi-head latent attention / mixture of experts) "
                               "has no sharded forward yet; the llama family (Llama, Mistral, Qwen2, Qwen3) has",
                               n, c.architecture_name);
  if (c.num_q_heads % n != 0)
    return invalid_argument_error("--tensor-parallel-size {} does not divide the {} attention heads "
                                  "(num_attention_heads)", n, c.num_q_heads);
  if (c.num_kv_heads >= n && c.num_kv_heads % n != 0)
    return invalid_argument_error("--tensor-parallel-size {} does not divide the {} KV heads (num_key_value_heads)",
                                  n, c.num_kv_heads);
  if (c.num_kv_heads < n && n % c.num_kv_heads != 0)
    return invalid_argument_error("--tensor-parallel-size {}: with {} KV heads (num_key_value_heads, fewer than the "
                                  "ranks) the ranks must be a multiple of the KV heads, so that each rank's query "
                                  "heads share one replicated KV head", n, c.num_kv_heads);
  if (c.intermediate_size % n != 0)
    return invalid_argument_error("--tensor-parallel-size {} does not divide the intermediate size {} "
                                  "(intermediate_size)", n, c.intermediate_size);
  return ok_status();
}

TensorShard tensor_shard(const ModelConfig& c, int32_t rank, int32_t n) {
  TensorShard s;
  s.rank = rank;
  s.size = n;
  s.num_q_heads = c.num_q_heads / n;
  s.q_head_begin = rank * s.num_q_heads;
  if (c.num_kv_heads >= n) {
    s.num_kv_heads = c.num_kv_heads / n;
    s.kv_head_begin = rank * s.num_kv_heads;
  } else {
    s.num_kv_heads = 1;
    s.kv_head_begin = rank / (n / c.num_kv_heads);
  }
  s.intermediate_size = c.intermediate_size / n;
  s.intermediate_begin = rank * s.intermediate_size;
  s.vocab_chunk = (c.vocab_size + n - 1) / n;
  s.vocab_begin = std::min(c.vocab_size, rank * s.vocab_chunk);
  s.vocab_end = std::min(c.vocab_size, s.vocab_begin + s.vocab_chunk);
  return s;
}

ModelConfig shard_config(const ModelConfig& config, const TensorShard& shard) {
  ModelConfig c = config;
  c.num_q_heads = shard.num_q_heads;
  c.num_kv_heads = shard.num_kv_heads;
  c.intermediate_size = shard.intermediate_size;
  return c;
}

StatusOr<ModelWeights> shard_model_weights(const ModelConfig& c, std::shared_ptr<const ModelWeights> whole,
                                           const TensorShard& s) {
  if (!whole) return invalid_argument_error("tensor parallelism: no weights to shard");
  const ModelWeights& w = *whole;
  if (w.quantization)
    return unimplemented_error("tensor parallelism: quantized weights (--quantization) are not sharded; each rank "
                               "quantizes its own shard");
  if (w.layers.size() != static_cast<size_t>(c.num_layers))
    return invalid_argument_error("tensor parallelism: {} layers bound, the config has {}", w.layers.size(),
                                  c.num_layers);
  const size_t D = static_cast<size_t>(c.head_dim), H = static_cast<size_t>(c.hidden_size);
  const size_t V = static_cast<size_t>(c.vocab_size), I = static_cast<size_t>(c.intermediate_size);
  const size_t q_out = static_cast<size_t>(c.num_q_heads) * D, kv_out = static_cast<size_t>(c.num_kv_heads) * D;
  const size_t q0 = static_cast<size_t>(s.q_head_begin) * D, qn = static_cast<size_t>(s.num_q_heads) * D;
  const size_t kv0 = static_cast<size_t>(s.kv_head_begin) * D, kvn = static_cast<size_t>(s.num_kv_heads) * D;
  const size_t i0 = static_cast<size_t>(s.intermediate_begin), in = static_cast<size_t>(s.intermediate_size);
  const size_t v0 = static_cast<size_t>(s.vocab_begin), vn = static_cast<size_t>(s.vocab_end - s.vocab_begin);

  ModelWeights out;
  PAGODA_RETURN_IF_ERROR(check_matrix(w.embed_tokens, V, H, "model.embed_tokens.weight"));
  PAGODA_RETURN_IF_ERROR(check_matrix(w.lm_head, V, H, "lm_head.weight"));
  out.embed_tokens = row_slice(w.embed_tokens, v0, vn);
  out.lm_head = row_slice(w.lm_head, v0, vn);
  out.final_norm = w.final_norm;
  out.layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& a = w.layers[l];
    LayerWeights& b = out.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // An fp8 checkpoint's matrices are sliced with their scales (row_slice, column_slice).
    const bool fp8 = w.fp8.has_value();
    const std::string q = p + "self_attn.q_proj.weight", k = p + "self_attn.k_proj.weight";
    const std::string v = p + "self_attn.v_proj.weight", o = p + "self_attn.o_proj.weight";
    const std::string gate = p + "mlp.gate_proj.weight", up = p + "mlp.up_proj.weight";
    const std::string down = p + "mlp.down_proj.weight";
    PAGODA_RETURN_IF_ERROR(check_matrix(a.q_proj, q_out, H, q, fp8));
    PAGODA_RETURN_IF_ERROR(check_matrix(a.k_proj, kv_out, H, k, fp8));
    PAGODA_RETURN_IF_ERROR(check_matrix(a.v_proj, kv_out, H, v, fp8));
    PAGODA_RETURN_IF_ERROR(check_matrix(a.o_proj, H, q_out, o, fp8));
    PAGODA_RETURN_IF_ERROR(check_matrix(a.gate_proj, I, H, gate, fp8));
    PAGODA_RETURN_IF_ERROR(check_matrix(a.up_proj, I, H, up, fp8));
    PAGODA_RETURN_IF_ERROR(check_matrix(a.down_proj, H, I, down, fp8));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.q_proj, q, false, q0, qn, s.size));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.k_proj, k, false, kv0, kvn, s.size));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.v_proj, v, false, kv0, kvn, s.size));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.o_proj, o, true, q0, qn, s.size));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.gate_proj, gate, false, i0, in, s.size));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.up_proj, up, false, i0, in, s.size));
    PAGODA_RETURN_IF_ERROR(check_fp8_split(a.down_proj, down, true, i0, in, s.size));
    b.q_proj = row_slice(a.q_proj, q0, qn);
    b.k_proj = row_slice(a.k_proj, kv0, kvn);
    b.v_proj = row_slice(a.v_proj, kv0, kvn);
    b.o_proj = column_slice(a.o_proj, q0, qn, out.owned_slices, out.owned_f32);
    b.gate_proj = row_slice(a.gate_proj, i0, in);
    b.up_proj = row_slice(a.up_proj, i0, in);
    b.down_proj = column_slice(a.down_proj, i0, in, out.owned_slices, out.owned_f32);
    b.input_norm = a.input_norm;
    b.post_attention_norm = a.post_attention_norm;
    b.q_norm = a.q_norm;
    b.k_norm = a.k_norm;
    b.q_bias = slice(a.q_bias, q0, qn);
    b.k_bias = slice(a.k_bias, kv0, kvn);
    b.v_bias = slice(a.v_bias, kv0, kvn);
    b.gate_bias = slice(a.gate_bias, i0, in);
    b.up_bias = slice(a.up_bias, i0, in);
    if (s.rank == 0) {
      b.o_bias = a.o_bias;
      b.down_bias = a.down_bias;
    }
    b.k_scale = a.k_scale;
    b.v_scale = a.v_scale;
  }
  out.fp8 = w.fp8;
  out.file_dtype = w.file_dtype;
  out.upcast_to_f32 = w.upcast_to_f32;
  out.checkpoint = w.checkpoint;
  out.whole = std::move(whole);
  return out;
}

}  // namespace pagoda
