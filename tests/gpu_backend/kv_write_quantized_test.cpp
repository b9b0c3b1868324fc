// Quantized KV on the CUDA backend: kv_write's codes and scale records equal the
// host reference of runtime/kv_quant.h bit for bit (fp8, int8, int4, K and V in
// different formats, head dims with a short int4 group, zero and constant
// vectors, large values, skipped padding slots); with a checkpoint's per-tensor
// fp8 scales (KvWriteFixedScales) they equal the CPU backend's kv_write with
// PagedKvLayer::key_fixed_scale / value_fixed_scale byte for byte, saturating
// values included; and the backend's own paged attention over a quantized pool
// matches the CPU attention over the dequantized values (rounded to bf16, as
// the kernel's shared-memory tiles).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../gpu/kv_quant_reference.h"
#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/rope_kv_write.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"
#include "pagoda/model/rope_frequencies.h"

namespace pagoda::cuda {
namespace {

using kernels::KvQuant;
using kernels::testing::dequantize_reference;
using kernels::testing::quantize_reference;
using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

DType dtype_of(KvQuant q) {
  switch (q) {
    case KvQuant::kFP8E4M3: return DType::kFP8E4M3;
    case KvQuant::kInt8: return DType::kInt8;
    case KvQuant::kInt4: return DType::kInt4;
    default: return DType::kBF16;
  }
}

size_t vector_bytes(int32_t head_dim, KvQuant q) {
  return q == KvQuant::kNone ? size_t(head_dim) * 2 : size_t(kernels::kv_head_data_bytes(head_dim, q));
}

// Record vector (kernels::kv_scale_vector) of data vector vec = slot * kv_heads + head.
size_t record_vector(size_t vec, int32_t block_size, int32_t kv_heads) {
  return size_t(kernels::kv_scale_vector(int64_t(vec / size_t(kv_heads)), int32_t(vec % size_t(kv_heads)), block_size,
                                         kv_heads));
}

// Downloads the codes and records of every vector of one pool (layer 0).
struct PoolBytes {
  std::vector<uint8_t> codes;
  std::vector<uint32_t> records;
};
PoolBytes download(const void* data, const void* scales, size_t vectors, int32_t head_dim, KvQuant q) {
  PoolBytes p;
  p.codes.resize(vectors * vector_bytes(head_dim, q));
  EXPECT_EQ(cudaMemcpy(p.codes.data(), data, p.codes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  p.records.resize(vectors * size_t(kernels::kv_scale_groups(head_dim, q)));
  if (!p.records.empty()) {
    EXPECT_EQ(cudaMemcpy(p.records.data(), scales, p.records.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return p;
}

struct WriteCase {
  KvQuant key, value;
  int32_t head_dim;
};

class KvWriteQuantizedTest : public ::testing::TestWithParam<WriteCase> {};

TEST_P(KvWriteQuantizedTest, CodesEqualTheReferenceQuantizer) {
  PAGODA_SKIP_WITHOUT_GPU();
  const WriteCase c = GetParam();
  const int32_t kv_heads = 3, block_size = 8, num_blocks = 6, D = c.head_dim, tokens = 9;
  const int32_t row_stride = (4 + 2 * kv_heads) * D;  // k and v are column slices of a qkv row
  std::vector<float> rows = random_bf16_values(size_t(tokens) * row_stride, -3, 3, 41 + D);
  // Edge vectors: token 0 head 0 all zeros, token 1 head 1 constant, token 2 large, token 3 tiny.
  for (int32_t kv = 0; kv < 2; ++kv) {
    const int32_t k_at = 4 * D + kv * kv_heads * D;
    std::fill_n(rows.begin() + 0 * row_stride + k_at, D, 0.0f);
    std::fill_n(rows.begin() + 1 * row_stride + k_at + D, D, round_to_bf16(0.7f));
    for (int32_t e = 0; e < D; ++e) {
      rows[2 * row_stride + k_at + e] = round_to_bf16(300.0f * std::sin(0.37f * e));
      rows[3 * row_stride + k_at + e] = round_to_bf16(1e-3f * std::cos(0.11f * e));
    }
  }
  // Scattered slots; token 5 is a padding row (skipped).
  const std::vector<int64_t> slots = {17, 3, 40, 8, 47, -1, 0, 25, 31};
  const KvPoolShape shape{1, num_blocks, block_size, kv_heads, D, dtype_of(c.key), dtype_of(c.value)};
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const DevicePagedKvLayer layer = (*pool)->layer(0);
  EXPECT_EQ(layer.key_dtype, c.key);
  EXPECT_EQ(layer.value_dtype, c.value);
  DeviceBuffer d_rows = to_device(to_bf16_bits(rows));
  DeviceBuffer d_slots = to_device(slots);
  const bf16* k = d_rows.as<bf16>() + 4 * D;
  ASSERT_EQ(kv_write(k, k + kv_heads * D, row_stride, d_slots.as<int64_t>(), tokens, layer, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const size_t vectors = size_t(num_blocks) * block_size * kv_heads;
  for (int32_t kv = 0; kv < 2; ++kv) {
    const KvQuant q = kv == 0 ? c.key : c.value;
    const PoolBytes got = kv == 0 ? download(layer.key, layer.key_scale, vectors, D, q)
                                  : download(layer.value, layer.value_scale, vectors, D, q);
    const size_t bytes = vector_bytes(D, q);
    const size_t groups = size_t(kernels::kv_scale_groups(D, q));
    std::vector<bool> written(vectors, false);
    for (int32_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int32_t h = 0; h < kv_heads; ++h) {
        const size_t vec = size_t(slots[t]) * kv_heads + h;
        written[vec] = true;
        const float* x = &rows[size_t(t) * row_stride + 4 * D + (kv * kv_heads + h) * D];
        if (q == KvQuant::kNone) {
          const std::vector<uint16_t> want = to_bf16_bits(std::vector<float>(x, x + D));
          ASSERT_EQ(std::memcmp(&got.codes[vec * bytes], want.data(), bytes), 0) << "bf16 token " << t;
          continue;
        }
        const kernels::testing::QuantizedVector want = quantize_reference(x, D, q);
        for (size_t i = 0; i < bytes; ++i)
          ASSERT_EQ(got.codes[vec * bytes + i], want.codes[i])
              << (kv == 0 ? "K" : "V") << " token " << t << " head " << h << " byte " << i;
        for (size_t g = 0; g < groups; ++g)
          ASSERT_EQ(got.records[record_vector(vec, block_size, kv_heads) * groups + g], want.records[g])
              << (kv == 0 ? "K" : "V") << " token " << t << " head " << h << " record " << g;
      }
    }
    for (size_t vec = 0; vec < vectors; ++vec) {
      if (written[vec]) continue;
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(got.codes[vec * bytes + i], 0) << "unwritten vector " << vec;
      for (size_t g = 0; g < groups; ++g)
        ASSERT_EQ(got.records[record_vector(vec, block_size, kv_heads) * groups + g], 0u) << "unwritten vector " << vec;
    }
  }
}

// rope_qk_kv_write (the fused rope + KV write of decode steps) leaves qkv, the contiguous q and both pools
// (codes and scale records) exactly as rope_qk followed by kv_write: bf16, fp8 (per-vector and a fixed
// per-tensor scale), int8 / int4 and mixed K / V formats, a padding slot, head dims 128, 64 and 40.
TEST(RopeQkKvWrite, EqualsRopeQkThenKvWriteBitForBit) {
  PAGODA_SKIP_WITHOUT_GPU();
  struct FusedCase {
    KvQuant key, value;
    int32_t head_dim;
    float fixed_scale;
  };
  for (const FusedCase c : {FusedCase{KvQuant::kNone, KvQuant::kNone, 128, 0.0f},
                            FusedCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 128, 0.0f},
                            FusedCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 128, 0.02f},
                            FusedCase{KvQuant::kInt8, KvQuant::kInt4, 64, 0.0f},
                            FusedCase{KvQuant::kInt4, KvQuant::kFP8E4M3, 40, 0.0f}}) {
    const std::string where = "K " + std::to_string(int(c.key)) + " V " + std::to_string(int(c.value)) + " D " +
                              std::to_string(c.head_dim) + " fixed " + std::to_string(c.fixed_scale);
    const int32_t q_heads = 4, kv_heads = 2, block_size = 8, num_blocks = 6, D = c.head_dim, tokens = 3;
    const int32_t row_stride = (q_heads + 2 * kv_heads) * D + 8;
    const std::vector<float> inv_freq = rope_inverse_frequencies(D, 10000.0f, nullptr);
    const std::vector<int32_t> positions = {5, 77, 1023};
    const std::vector<int64_t> slots = {17, -1, 40};  // token 1 is a padding row: rotated, not written
    const std::vector<uint16_t> rows = to_bf16_bits(random_bf16_values(size_t(tokens) * row_stride, -3, 3, 93 + D));
    const KvPoolShape shape{1, num_blocks, block_size, kv_heads, D, dtype_of(c.key), dtype_of(c.value)};
    auto pool_a = CudaKvPool::create(shape), pool_b = CudaKvPool::create(shape);
    ASSERT_TRUE(pool_a.ok() && pool_b.ok()) << where;
    const DevicePagedKvLayer a = (*pool_a)->layer(0), b = (*pool_b)->layer(0);
    DeviceBuffer d_a = to_device(rows), d_b = to_device(rows), d_pos = to_device(positions);
    DeviceBuffer d_slots = to_device(slots), d_freq = to_device(inv_freq);
    auto q_a = DeviceBuffer::allocate(size_t(tokens) * q_heads * D * 2);
    auto q_b = DeviceBuffer::allocate(size_t(tokens) * q_heads * D * 2);
    ASSERT_TRUE(q_a.ok() && q_b.ok());
    const KvWriteFixedScales fixed{c.key == KvQuant::kFP8E4M3 ? c.fixed_scale : 0.0f,
                                   c.value == KvQuant::kFP8E4M3 ? c.fixed_scale : 0.0f};
    bf16* qkv_a = d_a.as<bf16>();
    ASSERT_EQ(rope_qk(qkv_a, row_stride, d_pos.as<int32_t>(), tokens, q_heads, kv_heads, D, d_freq.as<float>(),
                      q_a->as<bf16>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(kv_write(qkv_a + q_heads * D, qkv_a + (q_heads + kv_heads) * D, row_stride, d_slots.as<int64_t>(), tokens,
                       a, fixed, nullptr),
              cudaSuccess);
    ASSERT_EQ(rope_qk_kv_write(d_b.as<bf16>(), row_stride, d_pos.as<int32_t>(), d_slots.as<int64_t>(), tokens, q_heads,
                               d_freq.as<float>(), q_b->as<bf16>(), b, fixed, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> rows_a = to_host<uint16_t>(d_a, rows.size()), rows_b = to_host<uint16_t>(d_b, rows.size());
    EXPECT_NE(rows_a, rows) << where << ": nothing was rotated";
    EXPECT_EQ(rows_b, rows_a) << where << ": qkv";
    EXPECT_EQ(to_host<uint16_t>(*q_b, size_t(tokens) * q_heads * D), to_host<uint16_t>(*q_a, size_t(tokens) * q_heads * D))
        << where << ": q_out";
    const size_t vectors = size_t(num_blocks) * block_size * kv_heads;
    for (int kv = 0; kv < 2; ++kv) {
      const KvQuant q = kv == 0 ? c.key : c.value;
      const PoolBytes want = kv == 0 ? download(a.key, a.key_scale, vectors, D, q) : download(a.value, a.value_scale, vectors, D, q);
      const PoolBytes got = kv == 0 ? download(b.key, b.key_scale, vectors, D, q) : download(b.value, b.value_scale, vectors, D, q);
      EXPECT_GT(std::count_if(want.codes.begin(), want.codes.end(), [](uint8_t x) { return x != 0; }), 0)
          << where << ": nothing was written";
      EXPECT_EQ(got.codes, want.codes) << where << (kv == 0 ? ": K codes" : ": V codes");
      EXPECT_EQ(got.records, want.records) << where << (kv == 0 ? ": K records" : ": V records");
    }
  }
  // Bad input is refused: head_dim off the warp's reach, a negative fixed scale.
  DevicePagedKvLayer wide{nullptr, nullptr, 1, 16, 1, 264};
  EXPECT_EQ(rope_qk_kv_write(nullptr, 8, nullptr, nullptr, 1, 1, nullptr, nullptr, wide, {}, nullptr),
            cudaErrorInvalidValue);
  DevicePagedKvLayer narrow{nullptr, nullptr, 1, 16, 1, 64};
  EXPECT_EQ(rope_qk_kv_write(nullptr, 8, nullptr, nullptr, 1, 1, nullptr, nullptr, narrow, {-1.0f, 0.0f}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Formats, KvWriteQuantizedTest,
                         ::testing::Values(WriteCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 128},
                                           WriteCase{KvQuant::kInt8, KvQuant::kInt8, 128},
                                           WriteCase{KvQuant::kInt4, KvQuant::kInt4, 128},
                                           WriteCase{KvQuant::kInt8, KvQuant::kInt4, 64},
                                           WriteCase{KvQuant::kFP8E4M3, KvQuant::kNone, 256},
                                           WriteCase{KvQuant::kInt4, KvQuant::kFP8E4M3, 40},  // short int4 group
                                           WriteCase{KvQuant::kNone, KvQuant::kInt8, 16}),
                         [](const auto& info) {
                           const WriteCase& c = info.param;
                           return "k" + std::to_string(int(c.key)) + "v" + std::to_string(int(c.value)) + "d" +
                                  std::to_string(c.head_dim);
                         });

// fp8 with per-tensor scales (a checkpoint's k_scale / v_scale): the GPU pool
// equals the CPU backend's kv_write over the same bf16 inputs with the same
// fixed scales, byte for byte (codes and scale records, unwritten vectors
// included). Scales whose inverse is inexact; values far past 448 x scale
// (saturating), subnormal codes, zero vectors (record = the fixed scale, not
// the per-vector path's 1), products that overflow f32 to inf (scale 1e-37);
// a fixed scale beside a per-vector fp8 pool, and one given to int8 / bf16
// pools, which ignore it as the CPU does.
struct FixedScaleCase {
  KvQuant key, value;
  float key_scale, value_scale;
  int32_t head_dim;
};

class KvWriteFixedScaleTest : public ::testing::TestWithParam<FixedScaleCase> {};

TEST_P(KvWriteFixedScaleTest, PoolEqualsTheCpuKvWriteWithTheSameScales) {
  PAGODA_SKIP_WITHOUT_GPU();
  const FixedScaleCase c = GetParam();
  const int32_t kv_heads = 2, block_size = 4, num_blocks = 5, D = c.head_dim, tokens = 8;
  const int32_t kv_width = kv_heads * D, row_stride = 2 * kv_width + 8;  // [k | v | unused] rows
  std::vector<float> rows = random_bf16_values(size_t(tokens) * row_stride, -3, 3, 17 + D);
  for (int32_t kv = 0; kv < 2; ++kv) {
    const int32_t at = kv * kv_width;
    std::fill_n(rows.begin() + 0 * row_stride + at, D, 0.0f);  // token 0 head 0: zeros
    for (int32_t e = 0; e < D; ++e) {
      rows[1 * row_stride + at + D + e] = round_to_bf16(300.0f * std::sin(0.37f * e));  // saturates
      rows[2 * row_stride + at + e] = round_to_bf16(1e-3f * std::cos(0.11f * e));       // subnormal codes
      rows[3 * row_stride + at + e] = round_to_bf16(-20.0f + 0.5f * e);                 // a ramp through +-448 x s
    }
  }
  const std::vector<int64_t> slots = {19, 2, 7, -1, 11, 0, 16, 5};  // token 3 is padding

  // The CPU backend's write: f32 [tokens, kv_heads, D] inputs, the same bf16 values.
  std::vector<float> cpu_k(size_t(tokens) * kv_width), cpu_v(cpu_k.size());
  for (int32_t t = 0; t < tokens; ++t) {
    std::copy_n(rows.begin() + size_t(t) * row_stride, kv_width, cpu_k.begin() + size_t(t) * kv_width);
    std::copy_n(rows.begin() + size_t(t) * row_stride + kv_width, kv_width, cpu_v.begin() + size_t(t) * kv_width);
  }
  const size_t vectors = size_t(num_blocks) * block_size * kv_heads;
  const DType key_dtype = dtype_of(c.key), value_dtype = dtype_of(c.value);
  std::vector<uint8_t> cpu_key(vectors * kernels::kv_head_bytes(D, key_dtype));
  std::vector<uint8_t> cpu_value(vectors * kernels::kv_head_bytes(D, value_dtype));
  std::vector<uint32_t> cpu_key_records(vectors * size_t(kernels::kv_scale_groups(D, c.key)));
  std::vector<uint32_t> cpu_value_records(vectors * size_t(kernels::kv_scale_groups(D, c.value)));
  kernels::PagedKvLayer cpu_layer{cpu_key.data(), cpu_value.data(), num_blocks, block_size, kv_heads, D};
  cpu_layer.key_dtype = key_dtype;
  cpu_layer.value_dtype = value_dtype;
  cpu_layer.key_scales = cpu_key_records.empty() ? nullptr : cpu_key_records.data();
  cpu_layer.value_scales = cpu_value_records.empty() ? nullptr : cpu_value_records.data();
  cpu_layer.key_fixed_scale = c.key_scale;
  cpu_layer.value_fixed_scale = c.value_scale;
  kernels::kv_write(cpu_k.data(), cpu_v.data(), slots, cpu_layer);

  const KvPoolShape shape{1, num_blocks, block_size, kv_heads, D, key_dtype, value_dtype};
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const DevicePagedKvLayer layer = (*pool)->layer(0);
  DeviceBuffer d_rows = to_device(to_bf16_bits(rows));
  DeviceBuffer d_slots = to_device(slots);
  ASSERT_EQ(kv_write(d_rows.as<bf16>(), d_rows.as<bf16>() + kv_width, row_stride, d_slots.as<int64_t>(), tokens,
                     layer, KvWriteFixedScales{c.key_scale, c.value_scale}, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  int32_t saturated = 0;  // fp8 codes at +-448 (0x7e / 0xfe), so the case really clips
  for (int32_t kv = 0; kv < 2; ++kv) {
    const KvQuant q = kv == 0 ? c.key : c.value;
    const float fixed = kv == 0 ? c.key_scale : c.value_scale;
    const PoolBytes got = kv == 0 ? download(layer.key, layer.key_scale, vectors, D, q)
                                  : download(layer.value, layer.value_scale, vectors, D, q);
    const std::vector<uint8_t>& want_codes = kv == 0 ? cpu_key : cpu_value;
    const std::vector<uint32_t>& want_records = kv == 0 ? cpu_key_records : cpu_value_records;
    const char* which = kv == 0 ? "K" : "V";
    ASSERT_EQ(got.codes.size(), want_codes.size()) << which;
    ASSERT_EQ(got.records.size(), want_records.size()) << which;
    const size_t bytes = vector_bytes(D, q);
    for (size_t i = 0; i < got.codes.size(); ++i)
      ASSERT_EQ(got.codes[i], want_codes[i]) << which << " vector " << i / bytes << " byte " << i % bytes;
    for (size_t i = 0; i < got.records.size(); ++i)
      ASSERT_EQ(got.records[i], want_records[i]) << which << " record " << i;
    if (q != KvQuant::kFP8E4M3 || fixed <= 0.0f) continue;
    // Every written fp8 vector records the fixed scale itself.
    uint32_t fixed_bits;
    std::memcpy(&fixed_bits, &fixed, 4);
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t h = 0; slots[t] >= 0 && h < kv_heads; ++h)
        ASSERT_EQ(got.records[record_vector(size_t(slots[t]) * kv_heads + h, block_size, kv_heads)], fixed_bits)
            << which << " token " << t;
    for (uint8_t code : got.codes) saturated += (code & 0x7f) == 0x7e;
  }
  EXPECT_GT(saturated, 0) << "no fp8 code saturated: the case does not test clipping";
}

INSTANTIATE_TEST_SUITE_P(
    Scales, KvWriteFixedScaleTest,
    ::testing::Values(FixedScaleCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 0.0371f, 0.0059f, 128},
                      FixedScaleCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 1e-37f, 3.0f, 64},  // inf products
                      FixedScaleCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 0.013f, 0.0f, 256},  // V per vector
                      FixedScaleCase{KvQuant::kFP8E4M3, KvQuant::kInt8, 0.21f, 0.5f, 40},  // int8 ignores it
                      FixedScaleCase{KvQuant::kFP8E4M3, KvQuant::kNone, 0.07f, 0.5f, 16},  // bf16 ignores it
                      FixedScaleCase{KvQuant::kInt4, KvQuant::kFP8E4M3, 0.5f, 0.0113f, 64}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(QuantizedKv, BadFixedScalesAreRejected) {
  // Checked before anything is launched: no device needed.
  DevicePagedKvLayer layer{nullptr, nullptr, 1, 16, 1, 64};
  layer.key_dtype = KvQuant::kFP8E4M3;
  for (float bad : {-0.5f, NAN, INFINITY}) {
    EXPECT_EQ(kv_write(nullptr, nullptr, 64, nullptr, 1, layer, KvWriteFixedScales{bad, 0.0f}, nullptr),
              cudaErrorInvalidValue)
        << bad;
    EXPECT_EQ(kv_write(nullptr, nullptr, 64, nullptr, 1, layer, KvWriteFixedScales{0.0f, bad}, nullptr),
              cudaErrorInvalidValue)
        << bad;
  }
}

// The backend kernel over a pool written by kv_write, against the CPU attention
// over the dequantized pool (downloaded and read back with the reference).
struct AttentionCase {
  KvQuant key, value;
  int32_t q_heads, kv_heads, head_dim;
};

class QuantizedPagedAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(QuantizedPagedAttentionTest, MatchesCpuAttentionOverDequantizedValues) {
  PAGODA_SKIP_WITHOUT_GPU();
  const AttentionCase c = GetParam();
  const int32_t block_size = 16, num_blocks = 40, D = c.head_dim;
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{37, 5}, {0, 20}, {200, 1}, {15, 1}};  // (cached, new)
  std::mt19937 rng(7);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int32_t stride = 16;
  std::vector<int32_t> block_tables(seqs.size() * stride, 0);
  std::vector<std::vector<int32_t>> tables;  // outlive cpu_seqs' spans
  std::vector<kernels::PagedSequence> cpu_seqs;
  std::vector<int64_t> slots;  // every position of every sequence, in order
  std::vector<int32_t> token_sequence, kv_begin, kv_end;
  size_t next = 0;
  int32_t offset = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [cached, fresh] = seqs[s];
    const int32_t blocks = (cached + fresh + block_size - 1) / block_size;
    std::copy_n(ids.begin() + next, blocks, block_tables.begin() + s * stride);
    tables.emplace_back(ids.begin() + next, ids.begin() + next + blocks);
    next += blocks;
    for (int32_t p = 0; p < cached + fresh; ++p)
      slots.push_back(int64_t{block_tables[s * stride + p / block_size]} * block_size + p % block_size);
    for (int32_t i = 0; i < fresh; ++i) {
      token_sequence.push_back(static_cast<int32_t>(s));
      kv_begin.push_back(0);
      kv_end.push_back(cached + i + 1);
    }
    offset += fresh;
  }
  for (size_t s = 0, first = 0; s < seqs.size(); first += seqs[s].second, ++s)
    cpu_seqs.push_back({static_cast<int32_t>(first), seqs[s].second, seqs[s].first, tables[s]});
  const int32_t T = offset, all = static_cast<int32_t>(slots.size());

  // Write every position's K/V through kv_write (quantizing), then read the pool back.
  const KvPoolShape shape{1, num_blocks, block_size, c.kv_heads, D, dtype_of(c.key), dtype_of(c.value)};
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const DevicePagedKvLayer layer = (*pool)->layer(0);
  const int32_t kv_width = c.kv_heads * D;
  const std::vector<float> kv_rows = random_bf16_values(size_t(all) * 2 * kv_width, -2, 2, 91);
  DeviceBuffer d_kv = to_device(to_bf16_bits(kv_rows)), d_slots = to_device(slots);
  ASSERT_EQ(kv_write(d_kv.as<bf16>(), d_kv.as<bf16>() + kv_width, 2 * kv_width, d_slots.as<int64_t>(), all, layer,
                     nullptr),
            cudaSuccess);
  const size_t vectors = size_t(num_blocks) * block_size * c.kv_heads;
  std::vector<float> key(vectors * D), value(vectors * D);
  for (int32_t kv = 0; kv < 2; ++kv) {
    const KvQuant q = kv == 0 ? c.key : c.value;
    const PoolBytes bytes = kv == 0 ? download(layer.key, layer.key_scale, vectors, D, q)
                                    : download(layer.value, layer.value_scale, vectors, D, q);
    std::vector<float>& out = kv == 0 ? key : value;
    const size_t vb = vector_bytes(D, q), groups = size_t(kernels::kv_scale_groups(D, q));
    for (size_t v = 0; v < vectors; ++v)
      for (int32_t i = 0; i < D; ++i)
        out[v * D + i] = q == KvQuant::kNone
                             ? bf16_to_f32(reinterpret_cast<const uint16_t*>(&bytes.codes[v * vb])[i])
                             : dequantize_reference(&bytes.codes[v * vb],
                                                    &bytes.records[record_vector(v, block_size, c.kv_heads) * groups],
                                                    D, q, i);
  }
  // The kernel keeps the dequantized tiles as bf16 in shared memory: the
  // reference reads the same rounded values. (Against the unrounded f32 values
  // the error is that of a bf16 KV cache: up to 1.36x the bound below at
  // (4e-3, 1/64), measured on the H200 and reproduced on the host.)
  for (float& x : key) x = round_to_bf16(x);
  for (float& x : value) x = round_to_bf16(x);

  const int32_t q_stride = c.q_heads * D;
  const std::vector<float> q = random_bf16_values(size_t(T) * q_stride, -2, 2, 92);
  const kernels::PagedKvLayer cpu_layer{key.data(), value.data(), num_blocks, block_size, c.kv_heads, D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> want(q.size());
  kernels::paged_attention(q.data(), cpu_layer, cpu_seqs, {c.q_heads, scale, 0}, want.data());

  DeviceBuffer d_q = to_device(to_bf16_bits(q));
  DeviceBuffer d_seq = to_device(token_sequence), d_begin = to_device(kv_begin), d_end = to_device(kv_end),
               d_tables = to_device(block_tables);
  auto out = DeviceBuffer::allocate(q.size() * 2);
  ASSERT_TRUE(out.ok());
  const DeviceAttentionPlan plan{d_seq.as<int32_t>(), d_begin.as<int32_t>(), d_end.as<int32_t>(),
                                 d_tables.as<int32_t>(), stride, T};
  ASSERT_EQ(paged_attention(d_q.as<bf16>(), q_stride, layer, plan, c.q_heads, scale, out->as<bf16>(), nullptr),
            cudaSuccess);
  const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(*out, q.size()));
  // The bf16 pool's bound (paged_attention_test.cpp): f32 softmax and
  // accumulation in another order, one bf16 rounding of the output.
  EXPECT_LE(worst_error_ratio(got, want, 2e-3, 1.0 / 128), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedPagedAttentionTest,
                         ::testing::Values(AttentionCase{KvQuant::kFP8E4M3, KvQuant::kFP8E4M3, 8, 2, 128},
                                           AttentionCase{KvQuant::kInt8, KvQuant::kInt8, 4, 4, 64},
                                           AttentionCase{KvQuant::kInt4, KvQuant::kInt4, 16, 1, 64},
                                           AttentionCase{KvQuant::kInt8, KvQuant::kInt4, 8, 2, 256},
                                           AttentionCase{KvQuant::kFP8E4M3, KvQuant::kNone, 4, 2, 16}),
                         [](const auto& info) {
                           const AttentionCase& c = info.param;
                           return "k" + std::to_string(int(c.key)) + "v" + std::to_string(int(c.value)) + "q" +
                                  std::to_string(c.q_heads) + "kv" + std::to_string(c.kv_heads) + "d" +
                                  std::to_string(c.head_dim);
                         });

TEST(QuantizedKv, MissingScalePoolsAreRejected) {
  PAGODA_SKIP_WITHOUT_GPU();
  DevicePagedKvLayer layer{nullptr, nullptr, 1, 16, 1, 64};
  layer.key_dtype = KvQuant::kInt8;
  EXPECT_EQ(kv_write(nullptr, nullptr, 64, nullptr, 1, layer, nullptr), cudaErrorInvalidValue);
  DeviceAttentionPlan plan;
  plan.num_tokens = 1;
  EXPECT_EQ(paged_attention(nullptr, 64, layer, plan, 1, 1.0f, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace pagoda::cuda
