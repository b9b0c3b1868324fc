// FastAttention on mixed steps (label gpu): decodes first, then prompt chunks,
// as the scheduler orders them. Such a step runs as two launches (split-K
// decode for the leading one-token sequences, prefill for the rest from their
// first query row on); over a quantized pool the prefill launch reads a bf16
// scratch copy of the chunks' blocks (kv_dequantize_blocks). Each case is
// compared, sequence by sequence, with the backend's builtin kernel
// (paged_attention.cu, itself tested against the CPU reference for every KV
// dtype), which dequantizes the same codes to the same bf16 values.
//
// Cases: bf16 / fp8 / int8 / int4 pools, GQA 32/8 d=128 (wgmma prefill) and
// MHA 4/4 d=64 (mma.sync prefill), block sizes 16 and 8, scattered block
// tables, a cached prefix ending mid-block, two chunks sharing prefix blocks,
// and a one-token chunk after the prompts (it belongs to the prefill launch).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {
namespace {

using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;

struct MixedCase {
  std::string name;
  int32_t q_heads, kv_heads, head_dim, block_size;
  DType key, value;
};

std::string case_name(const ::testing::TestParamInfo<MixedCase>& info) { return info.param.name; }

// (new tokens, cached tokens) per sequence, in row order; sequences 4 and 5
// share their first prefix blocks.
const std::vector<std::pair<int32_t, int32_t>> kSteps = {
    {1, 300}, {1, 45}, {1, 17}, {1, 1}, {130, 0}, {60, 37}, {40, 64}, {20, 64}, {1, 9}};
constexpr size_t kSharedFrom = 6;  // sequences 6 and 7 share the blocks of their 64 cached positions

class FastAttentionMixed : public ::testing::TestWithParam<MixedCase> {};

TEST_P(FastAttentionMixed, MatchesBuiltinKernelPerSequence) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  const MixedCase& c = GetParam();
  const int32_t bs = c.block_size;
  std::mt19937 rng(1234);

  // Block tables over a shuffled pool with spare blocks, shared prefix blocks for sequences 6 and 7.
  int32_t needed = 0;
  for (const auto& [n, cached] : kSteps) needed += (n + cached + bs - 1) / bs;
  const int32_t num_blocks = needed + 7;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ForwardBatch batch;
  size_t next = 0;
  std::vector<int32_t> shared_prefix;
  for (size_t i = 0; i < kSteps.size(); ++i) {
    const auto [n, cached] = kSteps[i];
    SequenceSlice s;
    s.token_offset = batch.num_tokens();
    s.num_new_tokens = n;
    s.num_cached_tokens = cached;
    const int32_t blocks = (n + cached + bs - 1) / bs;
    for (int32_t b = 0; b < blocks; ++b) {
      const bool shared = i == kSharedFrom + 1 && b < static_cast<int32_t>(shared_prefix.size()) && (b + 1) * bs <= cached;
      s.block_table.push_back(shared ? shared_prefix[static_cast<size_t>(b)] : ids[next++]);
    }
    if (i == kSharedFrom) shared_prefix.assign(s.block_table.begin(), s.block_table.begin() + cached / bs);
    for (int32_t t = 0; t < n; ++t) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(cached + t);
    }
    batch.sequences.push_back(std::move(s));
  }
  const int32_t tokens = batch.num_tokens();

  // The pool, every slot written with random K/V through kv_write (quantized there).
  const KvPoolShape shape{1, num_blocks, bs, c.kv_heads, c.head_dim, c.key, c.value};
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const DevicePagedKvLayer layer = (*pool)->layer(0);
  const int32_t slots_total = num_blocks * bs;
  const int64_t kv_width = int64_t{c.kv_heads} * c.head_dim;
  DeviceBuffer rows = to_device(to_bf16_bits(random_bf16_values(size_t(slots_total) * 2 * kv_width, -2.0f, 2.0f, 7)));
  std::vector<int64_t> slots(static_cast<size_t>(slots_total));
  std::iota(slots.begin(), slots.end(), int64_t{0});
  DeviceBuffer d_slots = to_device(slots);
  ASSERT_EQ(kv_write(rows.as<bf16>(), rows.as<bf16>() + kv_width, 2 * kv_width, d_slots.as<int64_t>(), slots_total,
                     layer, nullptr),
            cudaSuccess);

  const int64_t q_width = int64_t{c.q_heads} * c.head_dim;
  DeviceBuffer q = to_device(to_bf16_bits(random_bf16_values(size_t(tokens) * q_width, -2.0f, 2.0f, 11)));
  auto fast_out = DeviceBuffer::allocate(size_t(tokens) * q_width * 2);
  auto builtin_out = DeviceBuffer::allocate(size_t(tokens) * q_width * 2);
  ASSERT_TRUE(fast_out.ok() && builtin_out.ok());
  ASSERT_EQ(cudaMemset(fast_out->data(), 0xff, fast_out->bytes()), cudaSuccess);  // NaN until written

  ModelConfig config;
  config.num_q_heads = c.q_heads;
  config.num_kv_heads = c.kv_heads;
  config.head_dim = c.head_dim;
  FastAttention fast;
  fast.set_kv_dtypes(c.key, c.value);
  auto planned = fast.plan(config, batch, bs, num_blocks, nullptr);
  ASSERT_TRUE(planned.ok()) << planned.status().to_string();
  ASSERT_TRUE(*planned) << "the fast path refused a mixed step it supports";
  // Twice, as the model runs every layer: the scratch copy is redone per launch.
  for (int rep = 0; rep < 2; ++rep) {
    const Status ran = fast.run(layer, q.as<bf16>(), fast_out->as<bf16>(), nullptr);
    ASSERT_TRUE(ran.ok()) << ran.to_string();
  }

  // The builtin kernel's per-token plan.
  int32_t stride = 0;
  for (const SequenceSlice& s : batch.sequences) stride = std::max(stride, static_cast<int32_t>(s.block_table.size()));
  std::vector<int32_t> token_sequence, kv_begin, kv_end;
  std::vector<int32_t> tables(batch.sequences.size() * size_t(stride), 0);
  for (size_t si = 0; si < batch.sequences.size(); ++si) {
    const SequenceSlice& s = batch.sequences[si];
    std::copy(s.block_table.begin(), s.block_table.end(), tables.begin() + int64_t(si) * stride);
    for (int32_t t = 0; t < s.num_new_tokens; ++t) {
      token_sequence.push_back(static_cast<int32_t>(si));
      kv_begin.push_back(0);
      kv_end.push_back(s.num_cached_tokens + t + 1);
    }
  }
  DeviceBuffer d_seq = to_device(token_sequence), d_begin = to_device(kv_begin), d_end = to_device(kv_end),
               d_tables = to_device(tables);
  const DeviceAttentionPlan plan{d_seq.as<int32_t>(), d_begin.as<int32_t>(), d_end.as<int32_t>(),
                                 d_tables.as<int32_t>(), stride, tokens};
  ASSERT_EQ(paged_attention(q.as<bf16>(), q_width, layer, plan, c.q_heads,
                            1.0f / std::sqrt(static_cast<float>(c.head_dim)), builtin_out->as<bf16>(), nullptr),
            cudaSuccess);

  const std::vector<uint16_t> got = to_host<uint16_t>(*fast_out, size_t(tokens) * q_width);
  const std::vector<uint16_t> want = to_host<uint16_t>(*builtin_out, size_t(tokens) * q_width);
  for (const SequenceSlice& s : batch.sequences) {
    double err = 0, norm = 0;
    for (int64_t i = int64_t{s.token_offset} * q_width; i < int64_t{s.token_offset + s.num_new_tokens} * q_width; ++i) {
      const double g = bf16_to_f32(got[size_t(i)]), w = bf16_to_f32(want[size_t(i)]);
      err += std::isfinite(g) ? (g - w) * (g - w) : 1e30;
      norm += w * w;
    }
    // Both kernels see the same bf16 K/V; they differ by f32 summation order and
    // the fast prefill's bf16 P (about 2e-3 relative).
    EXPECT_LT(std::sqrt(err / std::max(norm, 1e-30)), 1e-2)
        << "sequence at row " << s.token_offset << " (" << s.num_new_tokens << " new, " << s.num_cached_tokens
        << " cached)";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pools, FastAttentionMixed,
    ::testing::Values(MixedCase{"bf16_gqa_d128_bs16", 32, 8, 128, 16, DType::kBF16, DType::kBF16},
                      MixedCase{"fp8_gqa_d128_bs16", 32, 8, 128, 16, DType::kFP8E4M3, DType::kFP8E4M3},
                      MixedCase{"int8_gqa_d128_bs16", 32, 8, 128, 16, DType::kInt8, DType::kInt8},
                      MixedCase{"int4_gqa_d128_bs16", 32, 8, 128, 16, DType::kInt4, DType::kInt4},
                      MixedCase{"k_int8_v_int4_gqa_d128_bs16", 32, 8, 128, 16, DType::kInt8, DType::kInt4},
                      MixedCase{"bf16_mha_d64_bs8", 4, 4, 64, 8, DType::kBF16, DType::kBF16},
                      MixedCase{"fp8_mha_d64_bs8", 4, 4, 64, 8, DType::kFP8E4M3, DType::kFP8E4M3}),
    case_name);

// K and V in formats the quantized decode kernel does not pair (fp8 keys, int4
// values): the step is refused without an error, so the model uses its builtin kernel.
TEST(FastAttentionMixedFallback, UnsupportedPairIsRefusedCleanly) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  ModelConfig config;
  config.num_q_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 128;
  ForwardBatch batch;
  for (int32_t i = 0; i < 2; ++i) {
    SequenceSlice s;
    s.token_offset = i;
    s.num_new_tokens = 1;
    s.num_cached_tokens = 20;
    s.block_table = {2 * i, 2 * i + 1};
    batch.token_ids.push_back(0);
    batch.positions.push_back(20);
    batch.sequences.push_back(s);
  }
  FastAttention fast;
  fast.set_kv_dtypes(DType::kFP8E4M3, DType::kInt4);
  auto planned = fast.plan(config, batch, 16, 4, nullptr);
  ASSERT_TRUE(planned.ok()) << planned.status().to_string();
  EXPECT_FALSE(*planned);
}

}  // namespace
}  // namespace pagoda::cuda
