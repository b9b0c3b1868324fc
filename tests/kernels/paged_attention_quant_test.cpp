// Paged attention over quantized K/V pools. The reference is dequantize-then-attend:
// the same tokens written through kv_write into the quantized pool, and their
// dequantized values written into an f32 pool; attention over both must agree to
// ~1e-6. Also checked: the quantized result stays near attention over the
// original f32 values (so the comparison above is not vacuous), K and V in
// different formats, block sizes 1 / 3 / 16, GQA, head dims 40 and 72.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/random_data.h"
#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"
#include "pagoda/backend/cpu/kernels/paged_attention.h"

namespace pagoda::kernels {
namespace {

// A pool of one layer in the given dtypes, owning its bytes.
struct OwnedLayer {
  std::vector<uint8_t> key, value, key_scales, value_scales;
  PagedKvLayer view;

  OwnedLayer(int32_t num_blocks, int32_t block_size, int32_t kv_heads, int32_t head_dim, DType k, DType v) {
    const size_t vectors = size_t(num_blocks) * block_size * kv_heads;
    key.assign(vectors * kv_head_bytes(head_dim, k), 0);
    value.assign(vectors * kv_head_bytes(head_dim, v), 0);
    key_scales.assign(vectors * kv_head_scale_bytes(head_dim, k), 0);
    value_scales.assign(vectors * kv_head_scale_bytes(head_dim, v), 0);
    view = PagedKvLayer{key.data(), value.data(), num_blocks, block_size, kv_heads, head_dim, k, v,
                        key_scales.empty() ? nullptr : key_scales.data(),
                        value_scales.empty() ? nullptr : value_scales.data()};
  }
};

// x quantized to dtype and read back, vector by vector (rows of [n, heads, head_dim]).
std::vector<float> dequantized(const std::vector<float>& x, int32_t head_dim, DType dtype) {
  std::vector<float> out(x.size());
  std::vector<uint8_t> data(kv_head_bytes(head_dim, dtype)), scales(kv_head_scale_bytes(head_dim, dtype) + 4);
  for (size_t off = 0; off < x.size(); off += head_dim) {
    quantize_kv_vector(x.data() + off, head_dim, dtype, data.data(), scales.data());
    dequantize_kv_vector(data.data(), scales.data(), head_dim, dtype, out.data() + off);
  }
  return out;
}

struct Case {
  int32_t block_size, q_heads, kv_heads, head_dim;
  DType key_dtype, value_dtype;
  double near_original;  // bound on |quantized - f32 original| attention outputs
};

void run_case(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "block " << c.block_size << " heads " << c.q_heads << "/" << c.kv_heads
                                  << " d " << c.head_dim << " K " << dtype_name(c.key_dtype) << " V "
                                  << dtype_name(c.value_dtype));
  const int32_t num_blocks = 80;
  const size_t kv_row = size_t(c.kv_heads) * c.head_dim, q_row = size_t(c.q_heads) * c.head_dim;
  // Two sequences: 21 cached + 4 new (prefill chunk after a prefix ending mid-block), 30 cached + 1 new (decode).
  const std::vector<std::pair<int32_t, int32_t>> specs = {{21, 4}, {30, 1}};
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(c.block_size * 7 + c.head_dim));

  OwnedLayer quant(num_blocks, c.block_size, c.kv_heads, c.head_dim, c.key_dtype, c.value_dtype);
  OwnedLayer reference(num_blocks, c.block_size, c.kv_heads, c.head_dim, DType::kF32, DType::kF32);
  OwnedLayer original(num_blocks, c.block_size, c.kv_heads, c.head_dim, DType::kF32, DType::kF32);

  std::vector<std::vector<int32_t>> tables;
  std::vector<PagedSequence> seqs;
  int32_t rows = 0;
  for (const auto& [cached, fresh] : specs) {
    const int32_t nb = (cached + fresh + c.block_size - 1) / c.block_size;
    tables.emplace_back(ids.end() - nb, ids.end());
    ids.resize(ids.size() - nb);
    seqs.push_back({rows, fresh, cached, {}, {}});
    rows += fresh;
  }
  for (size_t s = 0; s < specs.size(); ++s) seqs[s].block_table = tables[s];

  // Every position of every sequence written in one kv_write per pool: K with an outlier channel
  // (what makes K harder to quantize than V in real models).
  std::vector<PagedSequence> all;
  int32_t all_rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    all.push_back({all_rows, specs[s].first + specs[s].second, 0, tables[s], {}});
    all_rows += specs[s].first + specs[s].second;
  }
  auto k = testing::random_values(size_t(all_rows) * kv_row, 1000 + c.head_dim, -1.0f, 1.0f);
  for (size_t t = 0; t < size_t(all_rows) * c.kv_heads; ++t) k[t * c.head_dim + 5] *= 8.0f;
  const auto v = testing::random_values(size_t(all_rows) * kv_row, 2000 + c.head_dim, -2.0f, 2.0f);
  const auto slots = plan_kv_slots(all, c.block_size, size_t(all_rows));
  kv_write(k.data(), v.data(), slots, quant.view);
  kv_write(k.data(), v.data(), slots, original.view);
  const auto k_deq = dequantized(k, c.head_dim, c.key_dtype);
  const auto v_deq = dequantized(v, c.head_dim, c.value_dtype);
  kv_write(k_deq.data(), v_deq.data(), slots, reference.view);

  const auto q = testing::random_values(size_t(rows) * q_row, 77, -2.0f, 2.0f);
  const PagedAttentionParams params{c.q_heads, 1.0f / std::sqrt(float(c.head_dim)), 0};
  std::vector<float> out_quant(q.size(), -1.0f), out_ref(q.size(), -2.0f), out_orig(q.size(), -3.0f);
  paged_attention(q.data(), quant.view, seqs, params, out_quant.data());
  paged_attention(q.data(), reference.view, seqs, params, out_ref.data());
  paged_attention(q.data(), original.view, seqs, params, out_orig.data());

  double max_vs_ref = 0, max_vs_orig = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    max_vs_ref = std::max(max_vs_ref, std::abs(double(out_quant[i]) - out_ref[i]));
    max_vs_orig = std::max(max_vs_orig, std::abs(double(out_quant[i]) - out_orig[i]));
  }
  EXPECT_LE(max_vs_ref, 1e-6);
  EXPECT_LE(max_vs_orig, c.near_original);
  if (c.key_dtype != DType::kF32 || c.value_dtype != DType::kF32) {
    EXPECT_GT(max_vs_orig, 0.0) << "nothing was quantized?";
  }
}

TEST(PagedAttentionQuantTest, MatchesAttentionOverDequantizedValues) {
  for (int32_t block_size : {1, 3, 16}) {
    run_case({block_size, 4, 2, 32, DType::kFP8E4M3, DType::kFP8E4M3, 0.1});
    run_case({block_size, 4, 2, 32, DType::kInt8, DType::kInt8, 0.05});
    run_case({block_size, 4, 2, 32, DType::kInt4, DType::kInt4, 0.5});
    run_case({block_size, 4, 2, 32, DType::kBF16, DType::kBF16, 0.05});
  }
  run_case({3, 4, 2, 40, DType::kInt8, DType::kInt4, 0.5});   // K and V apart; short int4 group
  run_case({16, 6, 2, 72, DType::kInt4, DType::kFP8E4M3, 0.5});
  run_case({16, 2, 2, 72, DType::kF32, DType::kInt8, 0.05});  // MHA, only V quantized
  run_case({1, 8, 1, 40, DType::kFP8E4M3, DType::kF16, 0.1});  // MQA
  run_case({16, 4, 2, 32, DType::kF32, DType::kF32, 0.0});    // the f32 path is untouched
}

TEST(PagedAttentionQuantTest, KvWriteStoresTheCodesOfKvQuantize) {
  // The pool holds exactly what quantize_kv_vector writes, at the slot's offsets.
  const int32_t head_dim = 40, heads = 2, block_size = 3, blocks = 4;
  OwnedLayer pool(blocks, block_size, heads, head_dim, DType::kInt4, DType::kInt8);
  const auto k = testing::random_values(size_t(heads) * head_dim, 5);
  const auto v = testing::random_values(size_t(heads) * head_dim, 6);
  const std::vector<int64_t> slot = {2 * block_size + 1};  // block 2, slot 1
  kv_write(k.data(), v.data(), slot, pool.view);
  for (int32_t h = 0; h < heads; ++h) {
    const size_t vec = size_t(slot[0]) * heads + h;
    std::vector<uint8_t> data(kv_head_bytes(head_dim, DType::kInt4)), scales(kv_head_scale_bytes(head_dim, DType::kInt4));
    quantize_kv_vector(k.data() + h * head_dim, head_dim, DType::kInt4, data.data(), scales.data());
    EXPECT_TRUE(std::equal(data.begin(), data.end(), pool.key.begin() + vec * data.size()));
    const size_t record_vec = size_t(kv_scale_vector(slot[0], h, block_size, heads));
    EXPECT_TRUE(std::equal(scales.begin(), scales.end(), pool.key_scales.begin() + record_vec * scales.size()));
  }
  // Nothing else was touched.
  const size_t written = (size_t(slot[0]) * heads) * kv_head_bytes(head_dim, DType::kInt4);
  EXPECT_TRUE(std::all_of(pool.key.begin(), pool.key.begin() + written, [](uint8_t b) { return b == 0; }));
  const size_t end = written + heads * kv_head_bytes(head_dim, DType::kInt4);
  EXPECT_TRUE(std::all_of(pool.key.begin() + end, pool.key.end(), [](uint8_t b) { return b == 0; }));
}

}  // namespace
}  // namespace pagoda::kernels
