// MLA over the paged latent pool, absorbed form, against the decompressed
// attention DeepSeek defines (per-head K = [W_UK c, kr], V = W_UV c), on
// scattered blocks, a batch of a prefill chunk after cached tokens and a
// decode, f32 and quantized pools; plus the strided rope both pairings use.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"
#include "pagoda/backend/cpu/kernels/mla_attention.h"
#include "pagoda/backend/cpu/kernels/mla_latent_write.h"
#include "pagoda/backend/cpu/kernels/rope.h"
#include "pagoda/backend/cpu/kernels/rope_strided.h"
#include "pagoda/runtime/mla_fp8_layout.h"

namespace pagoda::kernels {
namespace {

constexpr int32_t kHeads = 3, kRank = 16, kRope = 8, kNope = 8, kV = 6, kBlock = 3, kBlocks = 12;
constexpr int32_t kDim = kRank + kRope;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One latent pool layer of kBlocks blocks in `dtype`, owning its memory. records:
// an MLA pool's fp8 records (runtime/mla_fp8_layout.h, what CpuKvPool makes for an
// fp8 latent pool) instead of kv_quant.h's codes + scale records.
struct LatentPool {
  explicit LatentPool(DType dtype, bool records = false)
      : data(static_cast<size_t>(kBlocks) * kBlock *
             (records ? static_cast<size_t>(mla_fp8_record_bytes(kRank, kRope)) : kv_head_bytes(kDim, dtype))),
        scales(static_cast<size_t>(kBlocks) * kBlock * kv_head_scale_bytes(kDim, dtype) + 4) {
    layer.key = data.data();
    layer.key_scales = kv_head_scale_bytes(kDim, dtype) > 0 && !records ? scales.data() : nullptr;
    layer.latent = records;
    layer.latent_rope_dim = records ? kRope : 0;
    layer.num_blocks = kBlocks;
    layer.block_size = kBlock;
    layer.num_kv_heads = 1;
    layer.head_dim = kDim;
    layer.key_dtype = dtype;
    layer.value_dtype = dtype;
  }
  std::vector<std::byte> data, scales;
  PagedKvLayer layer;
};

struct Case {
  std::vector<PagedSequence> sequences;
  std::vector<std::vector<int32_t>> tables;
  size_t num_tokens = 0;
};

// Sequence 0: 4 cached + a chunk of 3 new tokens; sequence 1: 6 cached + 1 decode token. Blocks scattered.
Case make_case() {
  Case c;
  c.tables = {{7, 2, 9}, {4, 11, 0}};
  c.sequences = {{0, 3, 4, c.tables[0]}, {3, 1, 6, c.tables[1]}};
  c.num_tokens = 4;
  return c;
}

struct Weights {
  std::vector<float> uk, uv;  // [heads, nope, rank], [heads, v, rank]
};

// The decompressed reference: every cached token expanded to per-head K and V.
std::vector<float> decompressed_attention(const std::vector<std::vector<float>>& latent_of_seq_pos, const Case& c,
                                          const std::vector<float>& q_nope, const std::vector<float>& q_pe,
                                          const Weights& w, float scale, size_t seq_first_vector[2]) {
  std::vector<float> out(c.num_tokens * kHeads * kV, 0.0f);
  for (size_t s = 0; s < c.sequences.size(); ++s) {
    const PagedSequence& seq = c.sequences[s];
    for (int32_t i = 0; i < seq.num_new_tokens; ++i) {
      const size_t row = static_cast<size_t>(seq.token_offset + i);
      const int32_t context = seq.num_cached_tokens + i + 1;
      for (int32_t h = 0; h < kHeads; ++h) {
        std::vector<double> scores(static_cast<size_t>(context));
        for (int32_t p = 0; p < context; ++p) {
          const std::vector<float>& cp = latent_of_seq_pos[seq_first_vector[s] + static_cast<size_t>(p)];
          double dot = 0;
          for (int32_t n = 0; n < kNope; ++n) {
            double k = 0;
            for (int32_t r = 0; r < kRank; ++r) k += w.uk[(h * kNope + n) * kRank + r] * cp[r];
            dot += q_nope[(row * kHeads + h) * kNope + n] * k;
          }
          for (int32_t r = 0; r < kRope; ++r) dot += q_pe[(row * kHeads + h) * kRope + r] * cp[kRank + r];
          scores[static_cast<size_t>(p)] = dot * scale;
        }
        const double max_score = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& x : scores) sum += (x = std::exp(x - max_score));
        for (int32_t p = 0; p < context; ++p) {
          const std::vector<float>& cp = latent_of_seq_pos[seq_first_vector[s] + static_cast<size_t>(p)];
          for (int32_t j = 0; j < kV; ++j) {
            double v = 0;
            for (int32_t r = 0; r < kRank; ++r) v += w.uv[(h * kV + j) * kRank + r] * cp[r];
            out[(row * kHeads + h) * kV + j] += static_cast<float>(scores[static_cast<size_t>(p)] / sum * v);
          }
        }
      }
    }
  }
  return out;
}

// Runs the absorbed path on `pool` and returns out [tokens, heads, v].
std::vector<float> absorbed_attention(const PagedKvLayer& layer, const Case& c, const std::vector<float>& q_nope,
                                      const std::vector<float>& q_pe, const Weights& w, float scale) {
  std::vector<float> q(c.num_tokens * kHeads * kDim);
  for (size_t t = 0; t < c.num_tokens; ++t)
    for (int32_t h = 0; h < kHeads; ++h) {
      float* dst = q.data() + (t * kHeads + h) * kDim;
      for (int32_t r = 0; r < kRank; ++r) {
        float acc = 0;
        for (int32_t n = 0; n < kNope; ++n) acc += w.uk[(h * kNope + n) * kRank + r] * q_nope[(t * kHeads + h) * kNope + n];
        dst[r] = acc;
      }
      std::copy_n(q_pe.data() + (t * kHeads + h) * kRope, kRope, dst + kRank);
    }
  std::vector<float> attended(c.num_tokens * kHeads * kRank);
  mla_paged_attention(q.data(), layer, c.sequences, {kHeads, kRank, scale}, attended.data());
  std::vector<float> out(c.num_tokens * kHeads * kV);
  for (size_t t = 0; t < c.num_tokens; ++t)
    for (int32_t h = 0; h < kHeads; ++h)
      for (int32_t j = 0; j < kV; ++j) {
        float acc = 0;
        for (int32_t r = 0; r < kRank; ++r) acc += w.uv[(h * kV + j) * kRank + r] * attended[(t * kHeads + h) * kRank + r];
        out[(t * kHeads + h) * kV + j] = acc;
      }
  return out;
}

void run(DType dtype, double tolerance, bool records = false) {
  std::mt19937 rng(42);
  const Case c = make_case();
  LatentPool pool(dtype, records);
  // Every position of both sequences (cached and new) written through mla_latent_write.
  std::vector<std::vector<float>> latent;  // as stored (dequantized for the reference)
  size_t first[2] = {0, 7};
  for (size_t s = 0; s < 2; ++s) {
    const PagedSequence& seq = c.sequences[s];
    const int32_t total = seq.num_cached_tokens + seq.num_new_tokens;
    for (int32_t p = 0; p < total; ++p) {
      std::vector<float> v = random_vector(kDim, rng);
      const int64_t slot = static_cast<int64_t>(seq.block_table[p / kBlock]) * kBlock + p % kBlock;
      mla_latent_write(v.data(), kDim, std::vector<int64_t>{slot}, pool.layer);
      std::vector<float> stored(kDim);
      if (records) {
        const size_t record_bytes = static_cast<size_t>(mla_fp8_record_bytes(kRank, kRope));
        mla_fp8_dequantize(reinterpret_cast<const uint8_t*>(pool.data.data()) + static_cast<size_t>(slot) * record_bytes,
                           kRank, kRope, stored.data());
        latent.push_back(stored);
        continue;
      }
      const size_t scale_bytes = kv_head_scale_bytes(kDim, dtype);
      dequantize_kv_vector(pool.data.data() + static_cast<size_t>(slot) * kv_head_bytes(kDim, dtype),
                           scale_bytes ? pool.scales.data() + kv_scale_vector(slot, 0, kBlock, 1) * scale_bytes : nullptr,
                           kDim, dtype, stored.data());
      latent.push_back(stored);
    }
  }
  Weights w{random_vector(kHeads * kNope * kRank, rng, 0.3f), random_vector(kHeads * kV * kRank, rng, 0.3f)};
  const std::vector<float> q_nope = random_vector(c.num_tokens * kHeads * kNope, rng);
  const std::vector<float> q_pe = random_vector(c.num_tokens * kHeads * kRope, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kNope + kRope));
  const auto expected = decompressed_attention(latent, c, q_nope, q_pe, w, scale, first);
  const auto actual = absorbed_attention(pool.layer, c, q_nope, q_pe, w, scale);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], tolerance) << "element " << i;
}

TEST(MlaAttentionTest, AbsorbedEqualsDecompressedOnAnF32Pool) { run(DType::kF32, 5e-5); }
// Quantized pools: the reference reads the same stored (dequantized) values, so
// the bound is f32 rounding, not the quantization error.
TEST(MlaAttentionTest, AbsorbedEqualsDecompressedOnBf16Fp8AndInt8Pools) {
  for (DType d : {DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4}) {
    SCOPED_TRACE(dtype_name(d));
    run(d, 5e-5);
  }
}

TEST(MlaAttentionTest, AbsorbedEqualsDecompressedOnFp8LatentRecords) { run(DType::kFP8E4M3, 5e-5, true); }

TEST(MlaAttentionTest, LatentWriteStoresFp8RecordsAndSkipsNegativeSlots) {
  LatentPool pool(DType::kFP8E4M3, true);
  const size_t record_bytes = static_cast<size_t>(mla_fp8_record_bytes(kRank, kRope));
  ASSERT_EQ(record_bytes, 48u);  // 16 codes, one f32 scale, 8 bf16 rope values = 36, padded to 16
  std::mt19937 rng(3);
  std::vector<float> v = random_vector(2 * kDim, rng);
  mla_latent_write(v.data(), kDim, std::vector<int64_t>{-1, 5}, pool.layer);
  std::vector<uint8_t> expected(record_bytes, 0xee);
  mla_fp8_quantize(v.data() + kDim, kRank, kRope, expected.data());
  const auto* stored = reinterpret_cast<const uint8_t*>(pool.data.data());
  for (size_t i = 0; i < record_bytes; ++i) EXPECT_EQ(stored[5 * record_bytes + i], expected[i]) << "byte " << i;
  // The rope values are the bf16 rounding of the input, the latent within half an fp8 step of its group's scale.
  std::vector<float> back(kDim);
  mla_fp8_dequantize(stored + 5 * record_bytes, kRank, kRope, back.data());
  for (int32_t i = 0; i < kRope; ++i)
    EXPECT_EQ(back[static_cast<size_t>(kRank + i)], bf16_to_f32(f32_to_bf16(v[static_cast<size_t>(kDim + kRank + i)])));
  for (int32_t i = 0; i < kRank; ++i) {
    const float x = v[static_cast<size_t>(kDim + i)];
    EXPECT_NEAR(back[static_cast<size_t>(i)], x, std::abs(x) / 16 + 1e-6);
  }
  for (size_t i = 0; i < pool.data.size(); ++i)
    if (i / record_bytes != 5) EXPECT_EQ(pool.data[i], std::byte{0}) << "byte " << i;
}

TEST(MlaAttentionTest, LatentWriteSkipsNegativeSlotsAndStoresFp8WithOneScalePerToken) {
  LatentPool pool(DType::kFP8E4M3);
  std::vector<float> v(2 * kDim);
  for (int32_t i = 0; i < 2 * kDim; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i % 7) - 3.0f;
  mla_latent_write(v.data(), kDim, std::vector<int64_t>{-1, 5}, pool.layer);
  std::vector<float> back(kDim);
  dequantize_kv_vector(pool.data.data() + 5 * kDim, pool.scales.data() + kv_scale_vector(5, 0, kBlock, 1) * 4, kDim,
                       DType::kFP8E4M3, back.data());
  // e4m3 keeps 3 mantissa bits: within 1/16 of each value.
  for (int32_t i = 0; i < kDim; ++i) {
    const float x = v[static_cast<size_t>(kDim + i)];
    EXPECT_NEAR(back[static_cast<size_t>(i)], x, std::abs(x) / 16 + 1e-6);
  }
  // Only slot 5 was written: every other byte of the pool is still zero.
  for (size_t i = 0; i < pool.data.size(); ++i)
    if (i / kDim != 5) EXPECT_EQ(pool.data[i], std::byte{0}) << "byte " << i;
}

TEST(RopeStridedTest, HalvesOnWholeHeadsEqualApplyRope) {
  std::mt19937 rng(7);
  const size_t tokens = 3, heads = 2, dim = 8;
  std::vector<float> x = random_vector(tokens * heads * dim, rng), y = x;
  const std::vector<int32_t> positions = {0, 5, 17};
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  apply_rope(x.data(), positions.data(), tokens, heads, dim, inv_freq.data());
  apply_rope_strided(y.data(), positions.data(), tokens, heads * dim, heads, dim, dim, inv_freq.data(),
                     RopePairing::kHalves, 1.0f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(x[i], y[i]);
}

TEST(RopeStridedTest, InterleavedIsHalvesOnDeinterleavedValuesAndScaled) {
  std::mt19937 rng(8);
  const size_t dim = 8;
  const std::vector<float> v = random_vector(dim, rng);
  std::vector<float> interleaved = v, halves(dim);
  for (size_t i = 0; i < dim / 2; ++i) {  // transformers' de-interleave: evens, then odds
    halves[i] = v[2 * i];
    halves[i + dim / 2] = v[2 * i + 1];
  }
  const int32_t position = 9;
  const std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f, 0.002f};
  // The rope part sits after 3 other values, as q_pe follows q_nope in a head.
  std::vector<float> row(3 + dim);
  std::copy(interleaved.begin(), interleaved.end(), row.begin() + 3);
  apply_rope_strided(row.data() + 3, &position, 1, row.size(), 1, 0, dim, inv_freq.data(), RopePairing::kInterleaved,
                     1.5f);
  apply_rope_strided(halves.data(), &position, 1, dim, 1, 0, dim, inv_freq.data(), RopePairing::kHalves, 1.5f);
  for (size_t i = 0; i < dim / 2; ++i) {
    EXPECT_FLOAT_EQ(row[3 + 2 * i], halves[i]);
    EXPECT_FLOAT_EQ(row[3 + 2 * i + 1], halves[i + dim / 2]);
  }
}

}  // namespace
}  // namespace pagoda::kernels
