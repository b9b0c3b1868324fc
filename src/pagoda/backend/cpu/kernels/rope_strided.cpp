#include "pagoda/backend/cpu/kernels/rope_strided.h"

#include <cmath>
#include <vector>

#include "pagoda/core/thread_pool.h"

namespace pagoda::kernels {

void apply_rope_strided(float* x, const int32_t* positions, size_t num_tokens, size_t row_stride, size_t num_heads,
                        size_t head_stride, size_t dim, const float* inv_freq, RopePairing pairing, float scale) {
  const size_t half = dim / 2;
  ThreadPool::global().parallel_for(num_tokens, [&](size_t begin, size_t end) {
    std::vector<float> cos_table(half), sin_table(half);
    for (size_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (size_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_table[i] = std::cos(angle) * scale;
        sin_table[i] = std::sin(angle) * scale;
      }
      for (size_t h = 0; h < num_heads; ++h) {
        float* v = x + t * row_stride + h * head_stride;
        for (size_t i = 0; i < half; ++i) {
          const size_t first = pairing == RopePairing::kHalves ? i : 2 * i;
          const size_t second = pairing == RopePairing::kHalves ? i + half : 2 * i + 1;
          const float a = v[first], b = v[second];
          v[first] = a * cos_table[i] - b * sin_table[i];
          v[second] = b * cos_table[i] + a * sin_table[i];
        }
      }
    }
  }, 8);
}

}  // namespace pagoda::kernels
