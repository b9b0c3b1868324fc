#pragma once
// Seeded random test data; never zero (a zero would hide a missed element).

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace pagoda::testing {

inline std::vector<float> random_values(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = dist(rng);
    while (std::abs(x) < 1e-3f);
  }
  return v;
}

}  // namespace pagoda::testing
