// NCCL communicators on the GPUs present (one rank per GPU, all of them, so
// nranks = 1 on a single H200): all-reduce (f32, bf16), all-gather, broadcast
// and barrier give the host-computed results. Skips without a CUDA device.

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "pagoda/parallel/nccl_communicator.h"

namespace pagoda::parallel {
namespace {

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(NcclCommunicatorGpuTest, RejectsBadDeviceLists) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_FALSE(make_nccl_communicators({}).ok());
  EXPECT_FALSE(make_nccl_communicators({0, 0}).ok());
  auto missing = make_nccl_communicators({device_count()});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos) << missing.status().to_string();
}

TEST(NcclCommunicatorGpuTest, CollectivesMatchTheHostOnEveryGpu) {
  const int n = device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<int32_t> devices;
  for (int d = 0; d < n; ++d) devices.push_back(d);
  auto comms = make_nccl_communicators(devices);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  ASSERT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  constexpr size_t kCount = 1000;
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      NcclCommunicator& comm = *(*comms)[static_cast<size_t>(r)];
      auto fail = [&](const std::string& what) { errors[static_cast<size_t>(r)] += what + "; "; };
      cudaSetDevice(comm.device());
      float* d_data = nullptr;
      float* d_all = nullptr;
      cudaMalloc(&d_data, kCount * sizeof(float));
      cudaMalloc(&d_all, kCount * sizeof(float) * static_cast<size_t>(n));
      for (int round = 0; round < 20; ++round) {
        std::vector<float> host(kCount);
        for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>((i + static_cast<size_t>(r) + round) % 17);
        cudaMemcpy(d_data, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
        if (!comm.all_reduce_sum(d_data, kCount, DType::kF32).ok()) fail("all_reduce");
        cudaMemcpy(host.data(), d_data, kCount * sizeof(float), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < kCount; ++i) {
          float want = 0.0f;
          for (int q = 0; q < n; ++q) want += static_cast<float>((i + static_cast<size_t>(q) + round) % 17);
          if (host[i] != want) {
            fail("sum at " + std::to_string(i));
            break;
          }
        }
        if (!comm.all_gather(d_data, d_all, kCount, DType::kF32).ok()) fail("all_gather");
        std::vector<float> all(kCount * static_cast<size_t>(n));
        cudaMemcpy(all.data(), d_all, all.size() * sizeof(float), cudaMemcpyDeviceToHost);
        for (int q = 0; q < n; ++q)
          if (all[static_cast<size_t>(q) * kCount + 3] != host[3]) fail("gather");
        std::vector<uint16_t> bf(kCount, f32_to_bf16(static_cast<float>(r + 1)));
        uint16_t* d_bf = reinterpret_cast<uint16_t*>(d_data);
        cudaMemcpy(d_bf, bf.data(), kCount * 2, cudaMemcpyHostToDevice);
        if (!comm.broadcast(d_bf, kCount, DType::kBF16, 0).ok()) fail("broadcast");
        if (!comm.all_reduce_sum(d_bf, kCount, DType::kBF16).ok()) fail("bf16 all_reduce");
        cudaMemcpy(bf.data(), d_bf, kCount * 2, cudaMemcpyDeviceToHost);
        if (bf16_to_f32(bf[kCount - 1]) != static_cast<float>(n)) fail("bf16 value");
        if (!comm.barrier().ok()) fail("barrier");
      }
      cudaFree(d_data);
      cudaFree(d_all);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace pagoda::parallel
