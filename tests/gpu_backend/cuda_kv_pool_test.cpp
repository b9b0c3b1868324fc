// The GPU KV pool: shape checks, per-layer addressing, block copies in every
// layer, and sizing from free memory.

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"

namespace pagoda::cuda {
namespace {

TEST(CudaKvPool, RejectsBadShapes) {
  PAGODA_SKIP_WITHOUT_GPU();
  EXPECT_EQ(CudaKvPool::create(KvPoolShape{2, 4, 16, 2, 12, DType::kBF16, DType::kBF16}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaKvPool::create(KvPoolShape{2, 0, 16, 2, 64, DType::kBF16, DType::kBF16}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaKvPool::create(KvPoolShape{2, 4, 16, 2, 64, DType::kF32, DType::kF32}).status().code(),
            StatusCode::kUnimplemented);
}

TEST(CudaKvPool, CopyBlocksCopiesKeysAndValuesOfEveryLayer) {
  PAGODA_SKIP_WITHOUT_GPU();
  const KvPoolShape shape{3, 6, 4, 2, 8, DType::kBF16, DType::kBF16};
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const size_t block = shape.elements_per_block();
  EXPECT_EQ((*pool)->total_bytes(), 2u * 3 * 6 * block * 2);
  // Distinct pattern per (layer, K/V) in block 1.
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const DevicePagedKvLayer layer = (*pool)->layer(l);
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<uint16_t> pattern(block);
      for (size_t i = 0; i < block; ++i) pattern[i] = f32_to_bf16(static_cast<float>(l * 100 + kv * 50 + i % 37));
      bf16* base = kv == 0 ? layer.key : layer.value;
      ASSERT_EQ(cudaMemcpy(base + 1 * block, pattern.data(), block * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  const std::vector<kv::BlockCopy> copies = {{1, 4}, {1, 5}};
  ASSERT_TRUE((*pool)->copy_blocks(copies, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const DevicePagedKvLayer layer = (*pool)->layer(l);
    for (bf16* base : {layer.key, layer.value}) {
      std::vector<uint16_t> all(6 * block);
      ASSERT_EQ(cudaMemcpy(all.data(), base, all.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < block; ++i) {
        ASSERT_EQ(all[4 * block + i], all[1 * block + i]);
        ASSERT_EQ(all[5 * block + i], all[1 * block + i]);
        ASSERT_EQ(all[2 * block + i], 0u) << "an uninvolved block changed";
      }
    }
  }
  EXPECT_EQ((*pool)->copy_blocks(std::vector<kv::BlockCopy>{{6, 0}}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->copy_blocks(std::vector<kv::BlockCopy>{{0, -1}}, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(CudaKvPool, SizingFromFreeMemory) {
  PAGODA_SKIP_WITHOUT_GPU();
  const KvPoolShape llama3_8b{32, 0, 16, 8, 128, DType::kBF16, DType::kBF16};
  EXPECT_EQ(size_kv_pool_from_free_memory(llama3_8b, 0.0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(size_kv_pool_from_free_memory(llama3_8b, 1.5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(size_kv_pool_from_free_memory(llama3_8b, 0.0001).status().code(), StatusCode::kResourceExhausted);
  auto sizing = size_kv_pool_from_free_memory(llama3_8b, 0.9);
  ASSERT_TRUE(sizing.ok()) << sizing.status().to_string();
  // 128 KiB per token for the Llama-3-8B shape, 2 MiB per block of 16.
  EXPECT_EQ(sizing->pool_bytes, static_cast<size_t>(sizing->num_blocks) * (2u << 20));
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_LE(sizing->pool_bytes, free_bytes);
  std::cout << "[ figure ] " << sizing->report << "\n";
}

}  // namespace
}  // namespace pagoda::cuda
