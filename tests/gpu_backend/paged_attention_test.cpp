// The backend's own paged attention kernel against kernels::paged_attention on
// the CPU, on a mixed batch: a prefill chunk after a cached prefix ending
// mid-block, a fresh prefill, decodes, a graph padding row; non-contiguous
// block tables; MHA, GQA, MQA (more query heads per KV head than one CTA
// serves), head_dim 64/128/256 and a sliding window. Bound: f32 softmax and
// accumulation in a different order, then one bf16 rounding of the output.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

struct AttentionCase {
  int32_t q_heads, kv_heads, head_dim, window;
};

class PagedAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(PagedAttentionTest, MatchesCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  const AttentionCase c = GetParam();
  const int32_t block_size = 16, num_blocks = 48, D = c.head_dim;
  struct Seq {
    int32_t cached, fresh;
  };
  const std::vector<Seq> seqs = {{37, 5}, {0, 20}, {100, 1}, {15, 1}, {0, 1}};
  std::mt19937 rng(31);
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  std::vector<std::vector<int32_t>> tables;
  std::vector<kernels::PagedSequence> cpu_seqs;
  int32_t offset = 0;
  size_t next_block = 0;
  for (const Seq& s : seqs) {
    const int32_t blocks = (s.cached + s.fresh + block_size - 1) / block_size;
    tables.emplace_back(free_blocks.begin() + next_block, free_blocks.begin() + next_block + blocks);
    next_block += blocks;
    offset += s.fresh;
  }
  offset = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    cpu_seqs.push_back({offset, seqs[i].fresh, seqs[i].cached, tables[i]});
    offset += seqs[i].fresh;
  }
  const int32_t T = offset;
  const int32_t padded_T = T + 1;  // one padding row (kv_end = 0) as in a graph bucket

  const size_t pool_elements = static_cast<size_t>(num_blocks) * block_size * c.kv_heads * D;
  std::vector<float> key = random_bf16_values(pool_elements, -1, 1, 32);
  std::vector<float> value = random_bf16_values(pool_elements, -1, 1, 33);
  const int32_t q_stride = (c.q_heads + 2 * c.kv_heads) * D;
  const std::vector<float> q_rows = random_bf16_values(static_cast<size_t>(padded_T) * q_stride, -1, 1, 34);

  // CPU reference on the bf16-exact values.
  std::vector<float> q(static_cast<size_t>(T) * c.q_heads * D);
  for (int32_t t = 0; t < T; ++t)
    std::copy_n(q_rows.data() + static_cast<size_t>(t) * q_stride, c.q_heads * D, q.data() + t * c.q_heads * D);
  const kernels::PagedKvLayer cpu_layer{key.data(), value.data(), num_blocks, block_size, c.kv_heads, D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> want(q.size());
  kernels::paged_attention(q.data(), cpu_layer, cpu_seqs, {c.q_heads, scale, c.window}, want.data());

  // GPU plan, built as CudaModel::plan does.
  const int32_t stride = 8;
  std::vector<int32_t> token_sequence(padded_T, 0), kv_begin(padded_T, 0), kv_end(padded_T, 0),
      block_tables(seqs.size() * stride, 0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    std::copy(tables[s].begin(), tables[s].end(), block_tables.begin() + s * stride);
    for (int32_t i = 0; i < seqs[s].fresh; ++i) {
      const int32_t t = cpu_seqs[s].token_offset + i, index = seqs[s].cached + i;
      token_sequence[t] = static_cast<int32_t>(s);
      kv_begin[t] = c.window > 0 ? std::max(0, index - c.window + 1) : 0;
      kv_end[t] = index + 1;
    }
  }
  DeviceBuffer d_key = to_device(to_bf16_bits(key)), d_value = to_device(to_bf16_bits(value));
  DeviceBuffer d_q = to_device(to_bf16_bits(q_rows));
  DeviceBuffer d_seq = to_device(token_sequence), d_begin = to_device(kv_begin), d_end = to_device(kv_end),
               d_tables = to_device(block_tables);
  auto out = DeviceBuffer::allocate(static_cast<size_t>(padded_T) * c.q_heads * D * 2);
  ASSERT_EQ(cudaMemset(out->data(), 0x7f, out->bytes()), cudaSuccess);  // garbage: padding must be zeroed
  const DevicePagedKvLayer layer{d_key.as<bf16>(), d_value.as<bf16>(), num_blocks, block_size, c.kv_heads, D};
  const DeviceAttentionPlan plan{d_seq.as<int32_t>(), d_begin.as<int32_t>(), d_end.as<int32_t>(),
                                 d_tables.as<int32_t>(), stride, padded_T};
  ASSERT_EQ(paged_attention(d_q.as<bf16>(), q_stride, layer, plan, c.q_heads, scale, out->as<bf16>(), nullptr),
            cudaSuccess);
  const std::vector<float> all = from_bf16_bits(to_host<uint16_t>(*out, static_cast<size_t>(padded_T) * c.q_heads * D));
  const std::vector<float> got(all.begin(), all.begin() + want.size());
  EXPECT_LE(worst_error_ratio(got, want, 2e-3, 1.0 / 128), 1.0);
  for (size_t i = want.size(); i < all.size(); ++i) ASSERT_EQ(all[i], 0.0f) << "padding row not zeroed";
}

INSTANTIATE_TEST_SUITE_P(Heads, PagedAttentionTest,
                         ::testing::Values(AttentionCase{8, 2, 128, 0},   // GQA (Llama-3-8B ratio)
                                           AttentionCase{4, 4, 64, 0},    // MHA
                                           AttentionCase{16, 1, 64, 0},   // MQA: two CTAs per KV head
                                           AttentionCase{4, 2, 256, 0},   // largest head_dim
                                           AttentionCase{8, 2, 128, 8}),  // sliding window
                         [](const auto& info) {
                           const AttentionCase& c = info.param;
                           return "q" + std::to_string(c.q_heads) + "kv" + std::to_string(c.kv_heads) + "d" +
                                  std::to_string(c.head_dim) + "w" + std::to_string(c.window);
                         });

TEST(PagedAttention, RejectsUnsupportedHeadDim) {
  PAGODA_SKIP_WITHOUT_GPU();
  const DevicePagedKvLayer layer{nullptr, nullptr, 1, 16, 1, 12};
  DeviceAttentionPlan plan;
  plan.num_tokens = 1;
  EXPECT_EQ(paged_attention(nullptr, 16, layer, plan, 1, 1.0f, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace pagoda::cuda
