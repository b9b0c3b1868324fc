#pragma once
// Shared pieces of the attention tests: random paged batches on the host, the
// float64 CPU reference, device buffers, and the relative L2 error.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/backend/cuda/attention/attention_plan.h"

namespace pagoda::kernels::cuda::testing {

// A step of the batch: (new tokens, cached tokens) per sequence.
struct SequenceShape {
  int32_t num_new = 1;
  int32_t num_cached = 0;
};

// A random paged batch: bf16 pool with every block filled (unused ones too),
// block tables scattered over a shuffled pool, random q.
struct PagedBatch {
  AttentionConfig config;
  std::vector<SequenceShape> shapes;
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<uint16_t> key, value;  // [num_blocks, block_size, kv_heads, head_dim] bf16
  std::vector<uint16_t> q;           // [num_tokens, q_heads, head_dim] bf16
  int32_t num_tokens = 0;

  std::vector<AttentionSequence> sequences() const {
    std::vector<AttentionSequence> out;
    for (size_t i = 0; i < shapes.size(); ++i)
      out.push_back({shapes[i].num_new, shapes[i].num_cached, block_tables[i]});
    return out;
  }
  int32_t max_length() const {
    int32_t m = 0;
    for (const auto& s : shapes) m = std::max(m, s.num_new + s.num_cached);
    return m;
  }
};

inline PagedBatch make_paged_batch(int32_t q_heads, int32_t kv_heads, int32_t head_dim,
                                   int32_t block_size, std::vector<SequenceShape> shapes,
                                   uint32_t seed) {
  std::mt19937 rng(seed);
  PagedBatch b;
  b.shapes = std::move(shapes);
  int32_t blocks_needed = 0;
  for (const auto& s : b.shapes) {
    blocks_needed += (s.num_new + s.num_cached + block_size - 1) / block_size;
    b.num_tokens += s.num_new;
  }
  const int32_t num_blocks = blocks_needed + blocks_needed / 2 + 3;  // spare blocks hold junk too
  b.config = AttentionConfig{q_heads, kv_heads, head_dim, block_size, num_blocks, 0.0f,
                             KvElement::kBF16};
  std::vector<int32_t> ids(num_blocks);
  for (int32_t i = 0; i < num_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  for (const auto& s : b.shapes) {
    const int32_t n = (s.num_new + s.num_cached + block_size - 1) / block_size;
    b.block_tables.emplace_back(ids.begin() + next, ids.begin() + next + n);
    next += n;
  }
  // q and k wide enough that softmax is far from uniform; never zeros.
  std::uniform_real_distribution<float> wide(-2.0f, 2.0f), unit(-1.0f, 1.0f);
  const size_t pool = size_t(num_blocks) * block_size * kv_heads * head_dim;
  b.key.resize(pool);
  b.value.resize(pool);
  for (auto& x : b.key) x = f32_to_bf16(wide(rng));
  for (auto& x : b.value) x = f32_to_bf16(unit(rng));
  b.q.resize(size_t(b.num_tokens) * q_heads * head_dim);
  for (auto& x : b.q) x = f32_to_bf16(wide(rng));
  return b;
}

inline std::vector<float> bf16_to_floats(const std::vector<uint16_t>& bf16) {
  std::vector<float> out(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) out[i] = bf16_to_f32(bf16[i]);
  return out;
}

// float64 causal attention of the batch's queries over float K / V pools laid
// out as the batch's (e.g. dequantized values); returns [num_tokens, q_heads, head_dim].
inline std::vector<double> reference_attention(const PagedBatch& b, const std::vector<float>& key,
                                               const std::vector<float>& value) {
  const auto& c = b.config;
  const double scale = 1.0 / std::sqrt(double(c.head_dim));
  const int32_t group = c.num_q_heads / c.num_kv_heads;
  std::vector<double> out(size_t(b.num_tokens) * c.num_q_heads * c.head_dim);
  int32_t row = 0;
  std::vector<double> scores;
  for (size_t i = 0; i < b.shapes.size(); ++i) {
    for (int32_t j = 0; j < b.shapes[i].num_new; ++j, ++row) {
      const int32_t position = b.shapes[i].num_cached + j;
      for (int32_t h = 0; h < c.num_q_heads; ++h) {
        const int32_t kvh = h / group;
        const uint16_t* qv = &b.q[(size_t(row) * c.num_q_heads + h) * c.head_dim];
        auto at = [&](int32_t p) {
          const size_t block = size_t(b.block_tables[i][p / c.block_size]);
          return ((block * c.block_size + p % c.block_size) * c.num_kv_heads + kvh) * c.head_dim;
        };
        scores.assign(position + 1, 0.0);
        double mx = -1e300;
        for (int32_t p = 0; p <= position; ++p) {
          const size_t k = at(p);
          double dot = 0;
          for (int32_t e = 0; e < c.head_dim; ++e) dot += double(bf16_to_f32(qv[e])) * key[k + e];
          scores[p] = dot * scale;
          mx = std::max(mx, scores[p]);
        }
        double sum = 0;
        for (auto& s : scores) sum += (s = std::exp(s - mx));
        double* o = &out[(size_t(row) * c.num_q_heads + h) * c.head_dim];
        for (int32_t p = 0; p <= position; ++p) {
          const size_t v = at(p);
          for (int32_t e = 0; e < c.head_dim; ++e) o[e] += scores[p] / sum * value[v + e];
        }
      }
    }
  }
  return out;
}

// The same over the batch's own bf16 pools.
inline std::vector<double> reference_attention(const PagedBatch& b) {
  return reference_attention(b, bf16_to_floats(b.key), bf16_to_floats(b.value));
}

// ||got - want|| / ||want||; any NaN or Inf in got gives +inf.
inline double relative_l2(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_f32(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  bool ok() const { return bytes_ == 0 || ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace pagoda::kernels::cuda::testing
