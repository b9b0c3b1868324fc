#include "pagoda/backend/cpu/kernels/rope.h"

#include <cmath>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

void apply_rope(float* x, const int32_t* positions, size_t num_tokens, size_t num_heads,
                size_t head_dim, const float* inv_freq) {
  const size_t half = head_dim / 2;
  ThreadPool::global().parallel_for(num_tokens, [&](size_t begin, size_t end) {
    std::vector<float> cos_table(half), sin_table(half);
    for (size_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (size_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];  // f32 product, as transformers does
        cos_table[i] = std::cos(angle);
        sin_table[i] = std::sin(angle);
      }
      for (size_t h = 0; h < num_heads; ++h) {
        float* v = x + (t * num_heads + h) * head_dim;
        for (size_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_table[i] - b * sin_table[i];
          v[i + half] = b * cos_table[i] + a * sin_table[i];
        }
      }
    }
  });
}

}  // namespace pagoda::kernels
