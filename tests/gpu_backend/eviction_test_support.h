#pragma once
// Helpers shared by the token-eviction GPU tests (kv_eviction_gpu_test.cpp,
// kv_attention_mass_gpu_test.cpp, kv_eviction_model_gpu_test.cpp): the
// attention kernels' element type of a KV dtype, a pool layer's byte ranges
// next to a CPU pool layer's (to copy or compare them), the slots of a block
// table, random K / V written into a pool layer, CUDA-event timing.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cpu/kernels/paged_kv.h"
#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda::testing {

inline kernels::cuda::KvElement kv_element_of(DType dtype) {
  namespace kc = kernels::cuda;
  return dtype == DType::kBF16      ? kc::KvElement::kBF16
         : dtype == DType::kFP8E4M3 ? kc::KvElement::kFP8E4M3
         : dtype == DType::kInt8    ? kc::KvElement::kInt8
                                    : kc::KvElement::kInt4;
}

// One of a pool layer's four byte ranges (K codes, V codes, K scale records, V scale records) on the
// device and in a CPU pool layer of the same shape (host may be null: a device range alone).
struct PoolSegment {
  void* device = nullptr;
  std::byte* host = nullptr;
  size_t bytes = 0;
};

inline std::vector<PoolSegment> pool_segments(const DevicePagedKvLayer& d, const kernels::PagedKvLayer& h, DType k,
                                              DType v) {
  const size_t vectors = static_cast<size_t>(h.num_blocks) * h.block_size * h.num_kv_heads;
  return {{d.key, static_cast<std::byte*>(h.key), vectors * kernels::kv_head_bytes(h.head_dim, k)},
          {d.value, static_cast<std::byte*>(h.value), vectors * kernels::kv_head_bytes(h.head_dim, v)},
          {d.key_scale, static_cast<std::byte*>(h.key_scales), vectors * kernels::kv_head_scale_bytes(h.head_dim, k)},
          {d.value_scale, static_cast<std::byte*>(h.value_scales),
           vectors * kernels::kv_head_scale_bytes(h.head_dim, v)}};
}

// Copies every non-empty segment device -> host (the CPU pool gets the GPU pool's bytes).
inline void copy_segments_to_host(const std::vector<PoolSegment>& segments) {
  for (const PoolSegment& s : segments)
    if (s.bytes > 0) {
      ASSERT_EQ(cudaMemcpy(s.host, s.device, s.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
}

// Copies every non-empty segment host -> device.
inline void copy_segments_to_device(const std::vector<PoolSegment>& segments) {
  for (const PoolSegment& s : segments)
    if (s.bytes > 0) {
      ASSERT_EQ(cudaMemcpy(s.device, s.host, s.bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
}

// The pool slots of cache indices [0, length) of a block table.
inline std::vector<int64_t> slots_of(const std::vector<int32_t>& table, int32_t length, int32_t block_size) {
  std::vector<int64_t> slots(static_cast<size_t>(length));
  for (int32_t i = 0; i < length; ++i)
    slots[static_cast<size_t>(i)] =
        static_cast<int64_t>(table[static_cast<size_t>(i / block_size)]) * block_size + i % block_size;
  return slots;
}

// Writes one random bf16 K and V vector per (slot, KV head) through kv_write (a quantized layer
// quantizes them): K = k_scale x normal, V = normal, every K drawn before every V from `rng`.
inline void write_random_kv(const DevicePagedKvLayer& layer, const std::vector<int64_t>& slots, int32_t kv_heads,
                            int32_t head_dim, std::mt19937& rng, std::normal_distribution<float>& normal,
                            float k_scale) {
  const size_t kv_width = static_cast<size_t>(kv_heads) * head_dim;
  const size_t n = slots.size();
  std::vector<uint16_t> k(n * kv_width), v(n * kv_width);
  for (auto& x : k) x = f32_to_bf16(k_scale * normal(rng));
  for (auto& x : v) x = f32_to_bf16(normal(rng));
  const DeviceBuffer kd = to_device(k), vd = to_device(v), sd = to_device(slots);
  ASSERT_EQ(kv_write(kd.as<bf16>(), vd.as<bf16>(), static_cast<int64_t>(kv_width), sd.as<int64_t>(),
                     static_cast<int32_t>(n), layer, nullptr),
            cudaSuccess);
}

// Mean time of `reps` launches on the default stream after one warm-up, by CUDA events.
inline float time_ms(const std::function<void()>& launch, int reps) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  launch();  // warm-up
  cudaEventRecord(start, nullptr);
  for (int r = 0; r < reps; ++r) launch();
  cudaEventRecord(stop, nullptr);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / static_cast<float>(reps);
}

}  // namespace pagoda::cuda::testing
