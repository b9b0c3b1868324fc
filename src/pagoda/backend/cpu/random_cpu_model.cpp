#include "pagoda/backend/cpu/random_cpu_model.h"

#include <cmath>

#include "pagoda/core/thread_pool.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills owned f32 matrices; element i of matrix m depends only on (seed, m, i),
// so the result does not depend on the thread count.
class RandomMatrices {
 public:
  RandomMatrices(uint64_t seed, std::vector<std::unique_ptr<float[]>>& owned) : seed_(seed), owned_(owned) {}

  WeightMatrix make(int64_t rows, int64_t cols) {
    const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
    auto data = std::make_unique<float[]>(n);
    const uint64_t stream = splitmix64(seed_ ^ splitmix64(++index_));
    constexpr float kHalfWidth = 0.02f * 1.7320508f;  // uniform with standard deviation 0.02
    float* out = data.get();
    ThreadPool::global().parallel_for(n, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const double unit = static_cast<double>(splitmix64(stream + i) >> 11) * 0x1.0p-53;  // [0, 1)
        out[i] = static_cast<float>((2.0 * unit - 1.0) * kHalfWidth);
      }
    }, 1 << 16);
    WeightMatrix m{DType::kF32, data.get(), static_cast<size_t>(rows), static_cast<size_t>(cols)};
    owned_.push_back(std::move(data));
    return m;
  }

 private:
  uint64_t seed_;
  uint64_t index_ = 0;
  std::vector<std::unique_ptr<float[]>>& owned_;
};

std::vector<float> ones(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 1.0f); }
std::vector<float> zeros(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

}  // namespace

size_t random_cpu_weight_bytes(const ModelConfig& c) {
  const size_t hidden = c.hidden_size, inter = c.intermediate_size;
  const size_t q_out = static_cast<size_t>(c.num_q_heads) * c.head_dim;
  const size_t kv_out = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t per_layer = q_out * hidden * 2 + kv_out * hidden * 2 + inter * hidden * 3;
  const size_t embeddings = static_cast<size_t>(c.vocab_size) * hidden * (c.tie_word_embeddings ? 1 : 2);
  return (per_layer * static_cast<size_t>(c.num_layers) + embeddings) * sizeof(float);
}

StatusOr<std::unique_ptr<CpuModel>> make_random_cpu_model(const ModelConfig& c, uint64_t seed, size_t max_bytes) {
  if (c.mla)
    return unimplemented_error("--load-format random: random weights for {} (MLA + MoE) are not made on the CPU; "
                               "load a checkpoint", c.architecture_name);
  const size_t bytes = random_cpu_weight_bytes(c);
  if (bytes > max_bytes) {
    return resource_exhausted_error(
        "random f32 weights of this {} config need {} of memory (more than the {} the CPU path allows); "
        "use --device cuda, which makes bf16 weights on the GPU", c.architecture_name, format_bytes(bytes),
        format_bytes(max_bytes));
  }
  ModelWeights w;
  RandomMatrices random(seed, w.owned_f32);
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_out = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  w.embed_tokens = random.make(c.vocab_size, hidden);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (LayerWeights& l : w.layers) {
    l.input_norm = ones(hidden);
    l.post_attention_norm = ones(hidden);
    l.q_proj = random.make(q_out, hidden);
    l.k_proj = random.make(kv_out, hidden);
    l.v_proj = random.make(kv_out, hidden);
    l.o_proj = random.make(hidden, q_out);
    if (c.qkv_bias) {
      l.q_bias = zeros(q_out);
      l.k_bias = zeros(kv_out);
      l.v_bias = zeros(kv_out);
    }
    if (c.o_proj_bias) l.o_bias = zeros(hidden);
    if (c.qk_norm) {
      l.q_norm = ones(c.head_dim);
      l.k_norm = ones(c.head_dim);
    }
    l.gate_proj = random.make(inter, hidden);
    l.up_proj = random.make(inter, hidden);
    l.down_proj = random.make(hidden, inter);
    if (c.mlp_bias) {
      l.gate_bias = zeros(inter);
      l.up_bias = zeros(inter);
      l.down_bias = zeros(hidden);
    }
  }
  w.final_norm = ones(hidden);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : random.make(c.vocab_size, hidden);
  w.file_dtype = DType::kF32;
  w.upcast_to_f32 = false;
  return std::make_unique<CpuModel>(c, std::move(w));
}

}  // namespace pagoda
