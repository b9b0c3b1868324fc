#pragma once
// Helpers for the CUDA backend tests: skip without a GPU, move host vectors to
// and from the device, bf16 on the host as pagoda's uint16_t bits.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/dtype.h"
#include "pagoda/runtime/forward_batch.h"

namespace pagoda::cuda::testing {

// Appends a sequence of `tokens` new tokens after `cached` cached ones (positions
// cached, cached + 1, ...) on `table`; all_logits asks for every new token's logits.
inline void append_sequence(ForwardBatch& b, const std::vector<int32_t>& tokens, int32_t cached,
                            std::vector<int32_t> table, bool all_logits) {
  SequenceSlice s;
  s.token_offset = b.num_tokens();
  s.num_new_tokens = static_cast<int32_t>(tokens.size());
  s.num_cached_tokens = cached;
  s.block_table = std::move(table);
  s.logits_for_all_new_tokens = all_logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    b.token_ids.push_back(tokens[i]);
    b.positions.push_back(cached + static_cast<int32_t>(i));
  }
  b.sequences.push_back(std::move(s));
}

// Microseconds per call over `reps` calls after 3 warm-up calls (CUDA events on the default stream).
template <typename F>
double time_us_per_call(F&& call, int reps) {
  for (int i = 0; i < 3; ++i) call();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) call();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / reps;
}

inline bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define PAGODA_SKIP_WITHOUT_GPU() \
  if (!::pagoda::cuda::testing::has_gpu()) GTEST_SKIP() << "no CUDA device"

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  auto buffer = DeviceBuffer::allocate(std::max<size_t>(host.size(), 1) * sizeof(T));
  EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(buffer->data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return std::move(buffer).value();
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device.data(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

// Uniform floats in [low, high) rounded to bf16, so CPU and GPU start from equal inputs.
inline std::vector<float> random_bf16_values(size_t n, float low, float high, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = round_to_bf16(dist(rng));
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
  return bits;
}

inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_to_f32(bits[i]);
  return v;
}

// Largest |a - b| / (abs_tol + rel_tol * |b|); <= 1 means within the bound.
inline double worst_error_ratio(const std::vector<float>& got, const std::vector<float>& want, double abs_tol,
                                double rel_tol) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double ratio = std::abs(static_cast<double>(got[i]) - want[i]) / (abs_tol + rel_tol * std::abs(want[i]));
    if (!(ratio <= worst)) worst = std::isnan(ratio) ? 1e30 : ratio;
  }
  return worst;
}

// Largest |a - b| over the largest |b|: the error as a fraction of the logit range (NaN: 1e30).
inline double relative_max_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    err = std::isnan(d) ? 1e30 : std::max(err, d);
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace pagoda::cuda::testing
