// The L2 prefetch (backend/cuda/l2_prefetch.h): its launch contract, and that it does what the decode step
// uses it for: a weight-streaming GEMV over weights the L2 was asked to load runs faster than over the same
// weights cold (both modes), with the same output bits.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/backend/cuda/l2_prefetch.h"

namespace pagoda::cuda {
namespace {

TEST(L2Prefetch, RefusesMisalignedAndSkipsEmptyRanges) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto buffer = DeviceBuffer::allocate(1 << 20);
  ASSERT_TRUE(buffer.ok());
  const char* p = buffer->as<char>();
  EXPECT_EQ(prefetch_l2(p + 8, 4096, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(prefetch_l2(p + 8, 4096, nullptr, L2PrefetchMode::kLines), cudaErrorInvalidValue);
  EXPECT_EQ(prefetch_l2(p, 0, nullptr), cudaSuccess);
  EXPECT_EQ(prefetch_l2(p, 15, nullptr), cudaSuccess);  // rounds down to nothing
  EXPECT_EQ(prefetch_l2(p, (1 << 20) - 8, nullptr), cudaSuccess);  // the last 8 bytes are left out
  EXPECT_EQ(prefetch_l2(p, 1 << 20, nullptr, L2PrefetchMode::kLines), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// One GEMV call's time in us (events around it alone).
double gemv_us(const __nv_bfloat16* x, const __nv_bfloat16* w, int32_t n, int32_t k, __nv_bfloat16* y) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  EXPECT_EQ(gemv_bf16(x, 1, w, n, k, y, false, nullptr), cudaSuccess);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms;
}

// 16 MiB of bf16 weights (2,048 x 4,096), the L2 emptied by a 256 MiB memset before every call; "warm" calls
// follow prefetch_l2 of the weights (and 1 ms for its loads to land). Medians of 9 calls each.
TEST(L2PrefetchSpeed, GemvFindsPrefetchedWeightsFaster) {
  PAGODA_SKIP_WITHOUT_GPU();
  constexpr int32_t n = 2048, k = 4096;
  const size_t weight_bytes = static_cast<size_t>(n) * k * 2;
  auto w = DeviceBuffer::allocate(weight_bytes);
  auto x = DeviceBuffer::allocate(static_cast<size_t>(k) * 2);
  auto y = DeviceBuffer::allocate(static_cast<size_t>(n) * 2);
  auto flush = DeviceBuffer::allocate(size_t{256} << 20);
  ASSERT_TRUE(w.ok() && x.ok() && y.ok() && flush.ok());
  const std::vector<uint16_t> ones(static_cast<size_t>(k), 0x3c00);  // bf16 1/128 (0x3c00)
  ASSERT_EQ(cudaMemcpy(x->data(), ones.data(), x->bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(w->data(), 0x3c, weight_bytes), cudaSuccess);
  auto run = [&](bool prefetch, L2PrefetchMode mode, std::vector<uint16_t>* out) {
    std::vector<double> times;
    for (int i = 0; i < 9; ++i) {
      EXPECT_EQ(cudaMemset(flush->data(), i, flush->bytes()), cudaSuccess);
      if (prefetch) {
        EXPECT_EQ(prefetch_l2(w->data(), weight_bytes, nullptr, mode), cudaSuccess);
      }
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      times.push_back(gemv_us(x->as<__nv_bfloat16>(), w->as<__nv_bfloat16>(), n, k, y->as<__nv_bfloat16>()));
    }
    out->resize(static_cast<size_t>(n));
    EXPECT_EQ(cudaMemcpy(out->data(), y->data(), y->bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  std::vector<uint16_t> cold_out, bulk_out, lines_out;
  const double cold = run(false, L2PrefetchMode::kBulk, &cold_out);
  const double bulk = run(true, L2PrefetchMode::kBulk, &bulk_out);
  const double lines = run(true, L2PrefetchMode::kLines, &lines_out);
  std::printf("[ figure ] GEMV 2048 x 4096 bf16 (16 MiB), median us: cold %.2f (%.0f GB/s), after bulk prefetch "
              "%.2f (%.0f GB/s), after line prefetch %.2f (%.0f GB/s)\n",
              cold, weight_bytes / cold / 1e3, bulk, weight_bytes / bulk / 1e3, lines, weight_bytes / lines / 1e3);
  EXPECT_EQ(cold_out, bulk_out);
  EXPECT_EQ(cold_out, lines_out);
  EXPECT_LT(bulk, 0.85 * cold);
  EXPECT_LT(lines, 0.85 * cold);
}

}  // namespace
}  // namespace pagoda::cuda
