// Each fused kernel of the CUDA backend against its CPU reference (backend/cpu/kernels),
// with an error bound chosen per op: inputs are bf16-exact, so the bounds cover
// f32 reduction order plus one bf16 rounding of the output (2^-8 relative).

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/backend/cuda/random_fill.h"
#include "pagoda/model/random_weights.h"
#include "pagoda/backend/cpu/kernels/rmsnorm.h"
#include "pagoda/backend/cpu/kernels/rope.h"
#include "pagoda/model/rope_frequencies.h"
#include "pagoda/backend/cpu/kernels/silu_mul.h"

namespace pagoda::cuda {
namespace {

using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;
using testing::worst_error_ratio;

constexpr double kBf16Rel = 1.0 / 128;  // one bf16 rounding is at most 2^-8 relative; margin x2

TEST(CudaOps, EmbeddingGatherCopiesRowsExactly) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t vocab = 50, hidden = 64;
  const std::vector<float> table = random_bf16_values(vocab * hidden, -1, 1, 1);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  DeviceBuffer d_table = to_device(to_bf16_bits(table));
  DeviceBuffer d_ids = to_device(ids);
  auto out = DeviceBuffer::allocate(ids.size() * hidden * 4);
  ASSERT_EQ(embedding_gather(d_table.as<bf16>(), d_ids.as<int32_t>(), 5, hidden, out->as<float>(), nullptr),
            cudaSuccess);
  const std::vector<float> got = to_host<float>(*out, ids.size() * hidden);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int32_t i = 0; i < hidden; ++i) ASSERT_EQ(got[t * hidden + i], table[ids[t] * hidden + i]) << t << "," << i;
}

TEST(CudaOps, RmsNormMatchesCpuIncludingRowGather) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t rows = 6, dim = 1000;  // not a multiple of the block size
  const std::vector<float> x = random_bf16_values(rows * dim, -3, 3, 2);
  const std::vector<float> w = random_bf16_values(dim, 0.5f, 1.5f, 3);
  std::vector<float> want(rows * dim);
  kernels::rmsnorm(x.data(), w.data(), want.data(), rows, dim, 1e-5f);

  DeviceBuffer d_x = to_device(x), d_w = to_device(w);
  auto out = DeviceBuffer::allocate(rows * dim * 2);
  ASSERT_EQ(rmsnorm(d_x.as<float>(), nullptr, d_w.as<float>(), out->as<bf16>(), rows, dim, 1e-5f, nullptr),
            cudaSuccess);
  EXPECT_LE(worst_error_ratio(from_bf16_bits(to_host<uint16_t>(*out, rows * dim)), want, 1e-3, kBf16Rel), 1.0);

  // Gather rows 4 and 1 only (the final norm before lm_head).
  const std::vector<int32_t> pick = {4, 1};
  DeviceBuffer d_pick = to_device(pick);
  ASSERT_EQ(rmsnorm(d_x.as<float>(), d_pick.as<int32_t>(), d_w.as<float>(), out->as<bf16>(), 2, dim, 1e-5f, nullptr),
            cudaSuccess);
  const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(*out, 2 * dim));
  std::vector<float> want_pick(want.begin() + 4 * dim, want.begin() + 5 * dim);
  want_pick.insert(want_pick.end(), want.begin() + 1 * dim, want.begin() + 2 * dim);
  EXPECT_LE(worst_error_ratio(got, want_pick, 1e-3, kBf16Rel), 1.0);
}

TEST(CudaOps, AddRmsNormUpdatesResidualAndNormalizes) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t rows = 3, dim = 4096;
  const std::vector<float> residual = random_bf16_values(rows * dim, -2, 2, 4);
  const std::vector<float> delta = random_bf16_values(rows * dim, -1, 1, 5);
  const std::vector<float> w = random_bf16_values(dim, 0.5f, 1.5f, 6);
  std::vector<float> sum(rows * dim), want(rows * dim);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + delta[i];
  kernels::rmsnorm(sum.data(), w.data(), want.data(), rows, dim, 1e-6f);

  DeviceBuffer d_res = to_device(residual), d_delta = to_device(to_bf16_bits(delta)), d_w = to_device(w);
  auto out = DeviceBuffer::allocate(rows * dim * 2);
  ASSERT_EQ(add_rmsnorm(d_res.as<float>(), d_delta.as<bf16>(), d_w.as<float>(), out->as<bf16>(), rows, dim, 1e-6f,
                        nullptr), cudaSuccess);
  EXPECT_EQ(to_host<float>(d_res, rows * dim), sum);  // f32 add of bf16-exact values is exact here
  EXPECT_LE(worst_error_ratio(from_bf16_bits(to_host<uint16_t>(*out, rows * dim)), want, 1e-3, kBf16Rel), 1.0);

  // add_residual alone.
  ASSERT_EQ(add_residual(d_res.as<float>(), d_delta.as<bf16>(), rows * dim, nullptr), cudaSuccess);
  const std::vector<float> twice = to_host<float>(d_res, rows * dim);
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_FLOAT_EQ(twice[i], sum[i] + delta[i]);
}

TEST(CudaOps, HeadRmsNormNormalizesEveryHeadOfAStridedSlice) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t tokens = 5, heads = 3, head_dim = 128, stride = 7 * head_dim;  // slice of a wider row
  const std::vector<float> x = random_bf16_values(tokens * stride, -4, 4, 7);
  const std::vector<float> w = random_bf16_values(head_dim, 0.5f, 1.5f, 8);
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_w = to_device(w);
  const int32_t col0 = 2 * head_dim;
  ASSERT_EQ(head_rmsnorm(d_x.as<bf16>() + col0, stride, tokens, heads, head_dim, d_w.as<float>(), 1e-6f, nullptr),
            cudaSuccess);
  const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(d_x, tokens * stride));
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t c = 0; c < stride; ++c) {
      const size_t i = static_cast<size_t>(t) * stride + c;
      if (c < col0 || c >= col0 + heads * head_dim) {
        ASSERT_EQ(got[i], x[i]) << "outside the slice changed at " << i;
      }
    }
    for (int32_t h = 0; h < heads; ++h) {
      const float* in = x.data() + static_cast<size_t>(t) * stride + col0 + h * head_dim;
      std::vector<float> want(head_dim);
      kernels::rmsnorm(in, w.data(), want.data(), 1, head_dim, 1e-6f);
      std::vector<float> head(got.begin() + (in - x.data()), got.begin() + (in - x.data()) + head_dim);
      EXPECT_LE(worst_error_ratio(head, want, 1e-3, kBf16Rel), 1.0) << "token " << t << " head " << h;
    }
  }
}

TEST(CudaOps, RopeMatchesCpuWithLlama3Scaling) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t tokens = 9, heads = 4, head_dim = 128, stride = 6 * head_dim;
  Llama3RopeScaling llama3;  // factor 8, original context 8192
  const std::vector<float> inv_freq = rope_inverse_frequencies(head_dim, 500000.0f, &llama3);
  const std::vector<int32_t> positions = {0, 1, 2, 17, 255, 1024, 8191, 40000, 131071};
  const std::vector<float> x = random_bf16_values(tokens * stride, -2, 2, 9);

  // CPU: contiguous [tokens, heads, head_dim] copy of the slice.
  const int32_t col0 = head_dim;
  std::vector<float> want(tokens * heads * head_dim);
  for (int32_t t = 0; t < tokens; ++t)
    std::copy_n(x.data() + static_cast<size_t>(t) * stride + col0, heads * head_dim,
                want.data() + static_cast<size_t>(t) * heads * head_dim);
  kernels::apply_rope(want.data(), positions.data(), tokens, heads, head_dim, inv_freq.data());

  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_pos = to_device(positions), d_freq = to_device(inv_freq);
  ASSERT_EQ(rope(d_x.as<bf16>() + col0, stride, d_pos.as<int32_t>(), tokens, heads, head_dim, d_freq.as<float>(),
                 nullptr), cudaSuccess);
  const std::vector<float> all = from_bf16_bits(to_host<uint16_t>(d_x, tokens * stride));
  std::vector<float> got(want.size());
  for (int32_t t = 0; t < tokens; ++t)
    std::copy_n(all.data() + static_cast<size_t>(t) * stride + col0, heads * head_dim,
                got.data() + static_cast<size_t>(t) * heads * head_dim);
  // Angles up to 1.3e5 rad: sincosf and std::sin agree to ~1e-7 relative of the angle's ulp.
  EXPECT_LE(worst_error_ratio(got, want, 2e-2, kBf16Rel), 1.0);
  EXPECT_EQ(all[0], x[0]) << "columns before the slice must not change";
}

// The kernel loops over a token's heads in passes of 256 / (head_dim / 2) heads: head counts that are not a
// multiple of a pass, head dims with odd halves and the largest (256, one head a pass) all rotate every head,
// at 37 tokens (the passes spread over CTAs, grid.y) and 100 (one CTA per token loops over the passes).
TEST(CudaOps, RopeCoversEveryHeadOfEveryToken) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (const int32_t tokens : {37, 100})
  for (const auto& [heads, head_dim] : {std::pair{40, 128}, std::pair{7, 80}, std::pair{3, 256}, std::pair{1, 64}}) {
    const int32_t stride = heads * head_dim + 16;
    const std::vector<float> inv_freq = rope_inverse_frequencies(head_dim, 10000.0f, nullptr);
    std::vector<int32_t> positions(tokens);
    for (int32_t t = 0; t < tokens; ++t) positions[t] = t * 53 + 1;
    const std::vector<float> x = random_bf16_values(tokens * stride, -2, 2, 23);
    std::vector<float> want(static_cast<size_t>(tokens) * heads * head_dim);
    for (int32_t t = 0; t < tokens; ++t)
      std::copy_n(x.data() + static_cast<size_t>(t) * stride, heads * head_dim,
                  want.data() + static_cast<size_t>(t) * heads * head_dim);
    kernels::apply_rope(want.data(), positions.data(), tokens, heads, head_dim, inv_freq.data());
    DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_pos = to_device(positions), d_freq = to_device(inv_freq);
    ASSERT_EQ(rope(d_x.as<bf16>(), stride, d_pos.as<int32_t>(), tokens, heads, head_dim, d_freq.as<float>(), nullptr),
              cudaSuccess);
    const std::vector<float> all = from_bf16_bits(to_host<uint16_t>(d_x, static_cast<size_t>(tokens) * stride));
    std::vector<float> got(want.size());
    for (int32_t t = 0; t < tokens; ++t) {
      std::copy_n(all.data() + static_cast<size_t>(t) * stride, heads * head_dim,
                  got.data() + static_cast<size_t>(t) * heads * head_dim);
      for (int32_t i = heads * head_dim; i < stride; ++i)
        ASSERT_EQ(all[static_cast<size_t>(t) * stride + i], x[static_cast<size_t>(t) * stride + i])
            << "columns past the heads must not change (heads " << heads << ", head_dim " << head_dim << ")";
    }
    EXPECT_LE(worst_error_ratio(got, want, 2e-2, kBf16Rel), 1.0) << "heads " << heads << ", head_dim " << head_dim
                                                                   << ", tokens " << tokens;
  }
}

// rope_qk: q and k heads of qkv rows in one launch = rope over each, and the rotated q heads copied out
// contiguous, bit for bit; v and the columns past it untouched.
TEST(CudaOps, RopeQkEqualsTwoRopesAndWritesQContiguous) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t tokens = 3, q_heads = 4, kv_heads = 2, head_dim = 64;
  const int32_t stride = (q_heads + 2 * kv_heads) * head_dim + 8;
  const std::vector<float> inv_freq = rope_inverse_frequencies(head_dim, 10000.0f, nullptr);
  const std::vector<int32_t> positions = {5, 77, 1023};
  const std::vector<uint16_t> x = to_bf16_bits(random_bf16_values(tokens * stride, -2, 2, 19));
  DeviceBuffer d_pos = to_device(positions), d_freq = to_device(inv_freq);
  DeviceBuffer d_want = to_device(x), d_got = to_device(x);
  auto d_q = DeviceBuffer::allocate(static_cast<size_t>(tokens) * q_heads * head_dim * 2);
  ASSERT_TRUE(d_q.ok());
  bf16* want = d_want.as<bf16>();
  ASSERT_EQ(rope(want, stride, d_pos.as<int32_t>(), tokens, q_heads, head_dim, d_freq.as<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(rope(want + q_heads * head_dim, stride, d_pos.as<int32_t>(), tokens, kv_heads, head_dim,
                 d_freq.as<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(rope_qk(d_got.as<bf16>(), stride, d_pos.as<int32_t>(), tokens, q_heads, kv_heads, head_dim,
                    d_freq.as<float>(), d_q->as<bf16>(), nullptr),
            cudaSuccess);
  const std::vector<uint16_t> w = to_host<uint16_t>(d_want, x.size());
  const std::vector<uint16_t> g = to_host<uint16_t>(d_got, x.size());
  const std::vector<uint16_t> q = to_host<uint16_t>(*d_q, static_cast<size_t>(tokens) * q_heads * head_dim);
  EXPECT_EQ(g, w);
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t i = 0; i < q_heads * head_dim; ++i)
      ASSERT_EQ(q[static_cast<size_t>(t) * q_heads * head_dim + i], w[static_cast<size_t>(t) * stride + i])
          << "token " << t << " element " << i;
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t i = (q_heads + kv_heads) * head_dim; i < stride; ++i)
      ASSERT_EQ(g[static_cast<size_t>(t) * stride + i], x[static_cast<size_t>(t) * stride + i]) << "v must not change";
}

TEST(CudaOps, SiluMulMatchesCpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (int32_t inter : {14336, 7}) {  // vectorized and scalar paths
    const int32_t rows = 3;
    const std::vector<float> gate_up = random_bf16_values(rows * 2 * inter, -6, 6, 10);
    std::vector<float> gate(rows * inter), up(rows * inter), want(rows * inter);
    for (int32_t r = 0; r < rows; ++r)
      for (int32_t i = 0; i < inter; ++i) {
        gate[r * inter + i] = gate_up[static_cast<size_t>(r) * 2 * inter + i];
        up[r * inter + i] = gate_up[static_cast<size_t>(r) * 2 * inter + inter + i];
      }
    kernels::silu_mul(gate.data(), up.data(), want.data(), want.size());
    DeviceBuffer d_in = to_device(to_bf16_bits(gate_up));
    auto out = DeviceBuffer::allocate(rows * inter * 2);
    ASSERT_EQ(silu_mul(d_in.as<bf16>(), out->as<bf16>(), rows, inter, nullptr), cudaSuccess);
    EXPECT_LE(worst_error_ratio(from_bf16_bits(to_host<uint16_t>(*out, rows * inter)), want, 1e-4, kBf16Rel), 1.0)
        << "intermediate " << inter;
  }
}

TEST(CudaOps, AddBiasTouchesOnlyTheSlice) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t rows = 4, cols = 24, stride = 40;
  const std::vector<float> x = random_bf16_values(rows * stride, -1, 1, 11);
  const std::vector<float> bias = random_bf16_values(cols, -1, 1, 12);
  DeviceBuffer d_x = to_device(to_bf16_bits(x)), d_b = to_device(bias);
  ASSERT_EQ(add_bias(d_x.as<bf16>(), stride, rows, cols, d_b.as<float>(), nullptr), cudaSuccess);
  const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(d_x, rows * stride));
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t c = 0; c < stride; ++c) {
      const size_t i = static_cast<size_t>(r) * stride + c;
      const float want = c < cols ? round_to_bf16(x[i] + bias[c]) : x[i];
      ASSERT_EQ(got[i], want) << r << "," << c;
    }
}

TEST(CudaOps, KvWriteStoresAtSlotsAndSkipsNegativeOnes) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t blocks = 6, block_size = 4, kv_heads = 2, head_dim = 16, tokens = 5;
  const int32_t kv_width = kv_heads * head_dim, stride = 3 * kv_width;  // [q | k | v] rows
  const std::vector<float> rows = random_bf16_values(tokens * stride, -1, 1, 13);
  const std::vector<int64_t> slots = {5, 23, -1, 0, 12};
  const size_t pool_elements = static_cast<size_t>(blocks) * block_size * kv_width;
  auto key = DeviceBuffer::allocate(pool_elements * 2), value = DeviceBuffer::allocate(pool_elements * 2);
  ASSERT_EQ(cudaMemset(key->data(), 0, pool_elements * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(value->data(), 0, pool_elements * 2), cudaSuccess);
  DeviceBuffer d_rows = to_device(to_bf16_bits(rows)), d_slots = to_device(slots);
  const DevicePagedKvLayer layer{key->as<bf16>(), value->as<bf16>(), blocks, block_size, kv_heads, head_dim};
  ASSERT_EQ(kv_write(d_rows.as<bf16>() + kv_width, d_rows.as<bf16>() + 2 * kv_width, stride, d_slots.as<int64_t>(),
                     tokens, layer, nullptr), cudaSuccess);
  const std::vector<float> k = from_bf16_bits(to_host<uint16_t>(*key, pool_elements));
  const std::vector<float> v = from_bf16_bits(to_host<uint16_t>(*value, pool_elements));
  std::vector<bool> written(blocks * block_size, false);
  for (int32_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (int32_t i = 0; i < kv_width; ++i) {
      ASSERT_EQ(k[slots[t] * kv_width + i], rows[t * stride + kv_width + i]);
      ASSERT_EQ(v[slots[t] * kv_width + i], rows[t * stride + 2 * kv_width + i]);
    }
  }
  for (int32_t s = 0; s < blocks * block_size; ++s) {
    if (written[s]) continue;
    for (int32_t i = 0; i < kv_width; ++i) ASSERT_EQ(k[s * kv_width + i], 0.0f) << "slot " << s << " was touched";
  }
}

TEST(CudaOps, ArgmaxPicksFirstMaximumAndIgnoresNan) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t cols = 128256;
  std::vector<float> logits = random_bf16_values(3 * cols, -5, 5, 14);
  logits[0 * cols + 77777] = 9.0f;
  logits[0 * cols + 99999] = 9.0f;  // tie: the first index wins
  logits[1 * cols + 5] = NAN;
  logits[1 * cols + 6] = 8.0f;
  logits[2 * cols + cols - 1] = 7.5f;
  DeviceBuffer d_logits = to_device(logits);
  auto out = DeviceBuffer::allocate(3 * 4);
  ASSERT_EQ(argmax_rows(d_logits.as<float>(), 3, cols, out->as<int32_t>(), nullptr), cudaSuccess);
  EXPECT_EQ(to_host<int32_t>(*out, 3), (std::vector<int32_t>{77777, 6, cols - 1}));
}

TEST(CudaOps, RandomFillIsTheHostRecipeRoundedToBf16) {
  // model/random_weights.h is evaluated on the host by the CPU backend: the GPU's values are the same
  // f32 numbers, rounded to bf16 (so --load-format random is one model on both devices).
  PAGODA_SKIP_WITHOUT_GPU();
  const int64_t n = 100003;
  const uint64_t stream = random_matrix_stream(7, RandomMatrix::kKProj, 3);
  auto d = DeviceBuffer::allocate(n * 2);
  ASSERT_EQ(fill_random_bf16(d->as<bf16>(), n, -kRandomWeightHalfWidth, kRandomWeightHalfWidth, stream, nullptr),
            cudaSuccess);
  const std::vector<uint16_t> got = to_host<uint16_t>(*d, n);
  std::vector<float> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    want[static_cast<size_t>(i)] =
        random_uniform_element(stream, static_cast<uint64_t>(i), -kRandomWeightHalfWidth, kRandomWeightHalfWidth);
  EXPECT_EQ(got, to_bf16_bits(want));
}

TEST(CudaOps, RandomFillIsReproducibleBoundedAndCentered) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  auto a = DeviceBuffer::allocate(n * 2), b = DeviceBuffer::allocate(n * 2), c = DeviceBuffer::allocate(n * 2);
  ASSERT_EQ(fill_random_bf16(a->as<bf16>(), n, -0.5f, 0.5f, 42, nullptr), cudaSuccess);
  ASSERT_EQ(fill_random_bf16(b->as<bf16>(), n, -0.5f, 0.5f, 42, nullptr), cudaSuccess);
  ASSERT_EQ(fill_random_bf16(c->as<bf16>(), n, -0.5f, 0.5f, 43, nullptr), cudaSuccess);
  const std::vector<uint16_t> ha = to_host<uint16_t>(*a, n), hb = to_host<uint16_t>(*b, n), hc = to_host<uint16_t>(*c, n);
  EXPECT_EQ(ha, hb);
  EXPECT_NE(ha, hc);
  double sum = 0, sum_sq = 0;
  for (uint16_t bits : ha) {
    const float v = bf16_to_f32(bits);
    ASSERT_LE(std::abs(v), 0.5f);
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 0.5 / std::sqrt(3.0), 0.005);  // std of uniform[-a, a)
}

// The MoE expert GEMMs on device row ranges (mla_ops.h): experts with no rows,
// one row, several 64-row chunks; n past a 64-column tile; k several 128-wide
// steps plus a tail; rows outside every range left untouched. Against a double
// reference over the same bf16 inputs: f32 accumulation, one bf16 rounding.
TEST(CudaOps, MoeGroupedGemmMatchesReferenceOnDeviceRanges) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t n = 200, k = 296;
  const std::vector<int32_t> offsets = {0, 0, 1, 71, 201, 204, 204};  // experts of 0, 1, 70, 130, 3, 0 rows
  const int32_t experts = static_cast<int32_t>(offsets.size()) - 1, rows = offsets.back() + 5;  // 5 spare rows
  const std::vector<float> x = random_bf16_values(static_cast<size_t>(rows) * k, -1, 1, 21);
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(experts) * n * k, -1, 1, 22);
  DeviceBuffer d_x = to_device(to_bf16_bits(x));
  DeviceBuffer d_w = to_device(to_bf16_bits(w));
  DeviceBuffer d_offsets = to_device(offsets);
  const std::vector<uint16_t> sentinel(static_cast<size_t>(rows) * n, 0x7fc0);  // bf16 NaN
  DeviceBuffer d_y = to_device(sentinel);
  ASSERT_TRUE(moe_grouped_gemm_supported(n, k));
  EXPECT_FALSE(moe_grouped_gemm_supported(n, 1407));
  ASSERT_EQ(moe_grouped_gemm(d_offsets.as<int32_t>(), experts, d_x.as<bf16>(), d_w.as<bf16>(), n, k, d_y.as<bf16>(),
                             nullptr),
            cudaSuccess);
  const std::vector<float> got = from_bf16_bits(to_host<uint16_t>(d_y, static_cast<size_t>(rows) * n));
  std::vector<float> want(static_cast<size_t>(offsets.back()) * n);
  for (int32_t e = 0; e < experts; ++e)
    for (int32_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (int32_t c = 0; c < n; ++c) {
        double sum = 0;
        for (int32_t i = 0; i < k; ++i)
          sum += static_cast<double>(x[static_cast<size_t>(r) * k + i]) *
                 w[(static_cast<size_t>(e) * n + c) * k + i];
        want[static_cast<size_t>(r) * n + c] = static_cast<float>(sum);
      }
  const std::vector<float> covered(got.begin(), got.begin() + static_cast<ptrdiff_t>(want.size()));
  EXPECT_LE(worst_error_ratio(covered, want, 1e-2, kBf16Rel), 1.0);
  for (size_t i = want.size(); i < got.size(); ++i) ASSERT_TRUE(std::isnan(got[i])) << "row outside the ranges, " << i;
}

}  // namespace
}  // namespace pagoda::cuda
