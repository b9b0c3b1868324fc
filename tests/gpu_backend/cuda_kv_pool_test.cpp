// The GPU KV pool: shape checks, per-layer addressing, block copies in every
// layer, and sizing from free memory.

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
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
      bf16* base = static_cast<bf16*>(kv == 0 ? layer.key : layer.value);
      ASSERT_EQ(cudaMemcpy(base + 1 * block, pattern.data(), block * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  const std::vector<runtime::BlockCopy> copies = {{1, 4}, {1, 5}};
  ASSERT_TRUE((*pool)->copy_blocks(copies, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const DevicePagedKvLayer layer = (*pool)->layer(l);
    for (void* base : {layer.key, layer.value}) {
      std::vector<uint16_t> all(6 * block);
      ASSERT_EQ(cudaMemcpy(all.data(), base, all.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < block; ++i) {
        ASSERT_EQ(all[4 * block + i], all[1 * block + i]);
        ASSERT_EQ(all[5 * block + i], all[1 * block + i]);
        ASSERT_EQ(all[2 * block + i], 0u) << "an uninvolved block changed";
      }
    }
  }
  EXPECT_EQ((*pool)->copy_blocks(std::vector<runtime::BlockCopy>{{6, 0}}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->copy_blocks(std::vector<runtime::BlockCopy>{{0, -1}}, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(CudaKvPool, QuantizedPoolsHaveScalePoolsThatBlockCopiesCarry) {
  PAGODA_SKIP_WITHOUT_GPU();
  // K int8 (one record per vector), V int4 (two groups of 32 at head_dim 64).
  const KvPoolShape shape{2, 5, 4, 2, 64, DType::kInt8, DType::kInt4};
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const size_t key_block = 4 * 2 * 64, value_block = 4 * 2 * 32, key_scale_block = 4 * 2 * 4,
               value_scale_block = 4 * 2 * 8;
  EXPECT_GE((*pool)->total_bytes(), 2 * 5 * (key_block + value_block + key_scale_block + value_scale_block));
  EXPECT_EQ(shape.bytes_per_token(), 2u * 2 * (64 + 4 + 32 + 8));
  for (int32_t l = 0; l < 2; ++l) {
    const DevicePagedKvLayer layer = (*pool)->layer(l);
    EXPECT_EQ(layer.key_dtype, kernels::KvQuant::kInt8);
    EXPECT_EQ(layer.value_dtype, kernels::KvQuant::kInt4);
    ASSERT_NE(layer.key_scale, nullptr);
    ASSERT_NE(layer.value_scale, nullptr);
    // Four disjoint sub-pools, 256-byte aligned.
    for (const void* p : {layer.key, layer.value, layer.key_scale, layer.value_scale})
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    EXPECT_GE(static_cast<char*>(layer.value) - static_cast<char*>(layer.key), std::ptrdiff_t(5 * key_block));
    EXPECT_GE(static_cast<char*>(layer.key_scale) - static_cast<char*>(layer.value), std::ptrdiff_t(5 * value_block));
    EXPECT_GE(static_cast<char*>(layer.value_scale) - static_cast<char*>(layer.key_scale),
              std::ptrdiff_t(5 * key_scale_block));
    // A pattern in block 2 of every sub-pool.
    const std::pair<void*, size_t> subs[] = {{layer.key, key_block},
                                             {layer.value, value_block},
                                             {layer.key_scale, key_scale_block},
                                             {layer.value_scale, value_scale_block}};
    for (int i = 0; i < 4; ++i) {
      std::vector<uint8_t> pattern(subs[i].second);
      for (size_t b = 0; b < pattern.size(); ++b) pattern[b] = static_cast<uint8_t>(1 + l * 50 + i * 10 + b % 7);
      ASSERT_EQ(cudaMemcpy(static_cast<char*>(subs[i].first) + 2 * subs[i].second, pattern.data(), pattern.size(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ASSERT_TRUE((*pool)->copy_blocks(std::vector<runtime::BlockCopy>{{2, 4}}, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t l = 0; l < 2; ++l) {
    const DevicePagedKvLayer layer = (*pool)->layer(l);
    const std::pair<void*, size_t> subs[] = {{layer.key, key_block},
                                             {layer.value, value_block},
                                             {layer.key_scale, key_scale_block},
                                             {layer.value_scale, value_scale_block}};
    for (const auto& [base, block] : subs) {
      std::vector<uint8_t> all(5 * block);
      ASSERT_EQ(cudaMemcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t b = 0; b < block; ++b) {
        ASSERT_NE(all[2 * block + b], 0);
        ASSERT_EQ(all[4 * block + b], all[2 * block + b]) << "layer " << l;
        ASSERT_EQ(all[3 * block + b], 0) << "an uninvolved block changed";
      }
    }
  }
}

TEST(CudaKvPool, QuantizedSizingCountsScales) {
  PAGODA_SKIP_WITHOUT_GPU();
  KvPoolShape shape{32, 0, 16, 8, 128, DType::kFP8E4M3, DType::kFP8E4M3};
  auto fp8 = size_kv_pool_from_free_memory(shape, 0.9);
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  // (128 codes + 4-byte scale) x 8 heads x 2 (K, V) x 32 layers x 16 tokens.
  EXPECT_EQ(fp8->pool_bytes, static_cast<size_t>(fp8->num_blocks) * 132 * 8 * 2 * 32 * 16);
  EXPECT_NE(fp8->report.find("K fp8 / V fp8"), std::string::npos) << fp8->report;
  shape.key_dtype = shape.value_dtype = DType::kBF16;
  auto bf16 = size_kv_pool_from_free_memory(shape, 0.9);
  ASSERT_TRUE(bf16.ok());
  EXPECT_GT(fp8->num_blocks, bf16->num_blocks * 19 / 10);
  std::cout << "[ figure ] " << fp8->report << "\n";
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
