// The tiled (flash-style) paged attention against the per-position reference:
// the same pool, queries and sequences through both, outputs equal up to f32
// summation order. Covered: block sizes 16 / 3 / 1; every KV dtype the CPU
// attention reads (f32, f16, bf16, fp8, int8, int4, and K and V apart);
// MHA / GQA / MQA; head dims 64 and 40 (a tail of the 8-lane loops); causal
// prefill longer than one key tile (64) and one query block (16), a prefix hit
// ending mid-block, decodes (one-token units take their own path) over several
// tiles, sliding windows, per-head holes (eviction); and
// that paged_attention() itself takes the tiled path.

#include "pagoda/backend/cpu/kernels/paged_attention_tiled.h"

#include "pagoda/backend/cpu/kernels/cpu_features.h"
#include "pagoda/backend/cpu/kernels/decode_attention_tile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/random_data.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"

namespace pagoda::kernels {
namespace {

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

struct Spec {
  int32_t cached, fresh;
};

struct Case {
  int32_t block_size, q_heads, kv_heads, head_dim;
  DType key_dtype, value_dtype;
  int32_t window = 0;
  bool holes = false;
};

// Max |tiled - reference| over every output element (and checks that the reference is not trivial).
double max_difference(const Case& c, const std::vector<Spec>& specs, uint64_t seed) {
  const size_t kv_row = size_t(c.kv_heads) * c.head_dim, q_row = size_t(c.q_heads) * c.head_dim;
  int32_t positions = 0;
  for (const Spec& s : specs) positions += s.cached + s.fresh;
  const int32_t num_blocks = positions / c.block_size + int32_t(specs.size()) + 4;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  OwnedLayer pool(num_blocks, c.block_size, c.kv_heads, c.head_dim, c.key_dtype, c.value_dtype);

  std::vector<std::vector<int32_t>> tables;
  std::vector<PagedSequence> seqs, whole;
  int32_t rows = 0, all_rows = 0;
  for (const Spec& s : specs) {
    const int32_t nb = (s.cached + s.fresh + c.block_size - 1) / c.block_size;
    tables.emplace_back(ids.end() - nb, ids.end());
    ids.resize(ids.size() - nb);
    seqs.push_back({rows, s.fresh, s.cached, {}, {}});
    whole.push_back({all_rows, s.cached + s.fresh, 0, {}, {}});
    rows += s.fresh;
    all_rows += s.cached + s.fresh;
  }
  for (size_t s = 0; s < specs.size(); ++s) seqs[s].block_table = whole[s].block_table = tables[s];
  // Every position written once (K with an outlier channel, as real models have).
  auto k = testing::random_values(size_t(all_rows) * kv_row, seed + 1, -1.0f, 1.0f);
  for (size_t t = 0; t < size_t(all_rows) * c.kv_heads; ++t) k[t * c.head_dim + 3] *= 6.0f;
  const auto v = testing::random_values(size_t(all_rows) * kv_row, seed + 2, -2.0f, 2.0f);
  kv_write(k.data(), v.data(), plan_kv_slots(whole, c.block_size, size_t(all_rows)), pool.view);

  // Holes: head h kept the first 3 + 2h indices of a compacted region of 20 (every sequence here has
  // more cached tokens than that when holes are on).
  std::vector<int32_t> kept(size_t(c.kv_heads));
  for (int32_t h = 0; h < c.kv_heads; ++h) kept[size_t(h)] = 3 + 2 * h;
  if (c.holes) {
    for (PagedSequence& s : seqs) {
      s.eviction.head_kept = kept.data();
      s.eviction.compacted_length = 20;
    }
  }

  const auto q = testing::random_values(size_t(rows) * q_row, seed + 3, -2.0f, 2.0f);
  const PagedAttentionParams params{c.q_heads, 1.0f / std::sqrt(float(c.head_dim)), c.window};
  std::vector<float> tiled(q.size(), -1.0f), reference(q.size(), -2.0f), dispatched(q.size(), -3.0f);
  paged_attention_tiled(q.data(), pool.view, seqs, params, tiled.data());
  paged_attention_reference(q.data(), pool.view, seqs, params, reference.data());
  paged_attention(q.data(), pool.view, seqs, params, dispatched.data());
  double max_diff = 0.0, max_abs = 0.0;
  for (size_t i = 0; i < q.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(tiled[i]) - reference[i]));
    max_abs = std::max(max_abs, std::abs(double(reference[i])));
    EXPECT_EQ(tiled[i], dispatched[i]) << "paged_attention() did not take the tiled path, element " << i;
    if (tiled[i] != dispatched[i]) break;
  }
  EXPECT_GT(max_abs, 0.05) << "reference output is near zero: the comparison says nothing";
  return max_diff;
}

void run(const Case& c, const std::vector<Spec>& specs, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "block " << c.block_size << " heads " << c.q_heads << "/" << c.kv_heads
                                  << " d " << c.head_dim << " K " << dtype_name(c.key_dtype) << " V "
                                  << dtype_name(c.value_dtype) << " window " << c.window << " holes " << c.holes);
  EXPECT_LE(max_difference(c, specs, seed), 2e-5);
}

// A causal prefill of 150 tokens (3 key tiles, 10 query blocks), a prefix hit (37 cached, ending mid-block,
// 29 new), a decode over 100 cached tokens and a one-token prefill, in one batch.
const std::vector<Spec> kMixed = {{0, 150}, {37, 29}, {100, 1}, {0, 1}};

TEST(PagedAttentionTiledTest, EqualsReferenceForEveryKvDtypeAndBlockSize) {
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4};
  for (int32_t block_size : {16, 3, 1}) {
    for (DType dtype : dtypes) run({block_size, 8, 2, 64, dtype, dtype}, kMixed, 11 + block_size);
  }
  run({3, 8, 2, 64, DType::kInt8, DType::kInt4}, kMixed, 5);  // K and V apart
  run({16, 4, 4, 40, DType::kFP8E4M3, DType::kF16}, kMixed, 6);  // MHA, head dim with a tail
  run({1, 6, 1, 40, DType::kF32, DType::kInt8}, kMixed, 7);  // MQA
}

TEST(PagedAttentionTiledTest, EqualsReferenceOnPrefixHitsDecodesAndLongPrefills) {
  for (int32_t block_size : {16, 3, 1}) {
    run({block_size, 8, 2, 64, DType::kF32, DType::kF32}, {{64, 64}}, 21);   // prefix hit on a tile boundary
    run({block_size, 8, 2, 64, DType::kF32, DType::kF32}, {{65, 17}}, 22);   // just past a boundary
    run({block_size, 8, 2, 64, DType::kBF16, DType::kBF16}, {{0, 200}}, 23); // prefill only
    run({block_size, 8, 2, 64, DType::kF16, DType::kF16}, {{130, 1}, {63, 1}, {1, 1}}, 24);  // decodes
    // Decodes over several key tiles (the one-token path reads keys in place): f32 and a quantized pool,
    // a window that starts mid-tile, and MHA with a head-dim tail.
    run({block_size, 8, 2, 64, DType::kF32, DType::kF32}, {{300, 1}, {64, 1}, {127, 1}}, 25);
    run({block_size, 8, 2, 64, DType::kInt8, DType::kInt4}, {{300, 1}, {200, 1}}, 26);
    run({block_size, 8, 2, 64, DType::kF32, DType::kF32, 70}, {{300, 1}, {65, 1}}, 27);
    run({block_size, 4, 4, 40, DType::kF32, DType::kBF16}, {{190, 1}}, 28);
    // Five query rows per KV head (four scored together, one alone) and a head dim of 36 (a 4-element tail).
    run({block_size, 10, 2, 36, DType::kF32, DType::kF32}, {{150, 1}, {3, 1}}, 29);
    // The in-place 16-bit decode tiles (decode_attention_tile.h): head dims 64 and 128, groups of 4, 5 and 1,
    // K and V in different 16-bit dtypes, a window, and decodes longer than a few tiles.
    run({block_size, 8, 2, 128, DType::kBF16, DType::kBF16}, {{300, 1}, {64, 1}}, 41);
    run({block_size, 10, 2, 64, DType::kF16, DType::kBF16}, {{257, 1}, {5, 1}}, 42);
    run({block_size, 4, 4, 64, DType::kBF16, DType::kF16, 70}, {{200, 1}}, 43);
    run({block_size, 8, 2, 128, DType::kF32, DType::kF16}, {{129, 1}}, 44);
  }
}

TEST(PagedAttentionTiledTest, InPlaceDecodeTilesRunWhereTheCpuHasAvx2) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  EXPECT_EQ(decode_tile_supported(DType::kF16, DType::kF16, 64), avx2);
  EXPECT_EQ(decode_tile_supported(DType::kF32, DType::kBF16, 128), avx2);
  EXPECT_FALSE(decode_tile_supported(DType::kF16, DType::kF16, 40));   // head dim not a multiple of 32
  EXPECT_FALSE(decode_tile_supported(DType::kBF16, DType::kF16, 48));
  EXPECT_FALSE(decode_tile_supported(DType::kInt8, DType::kF16, 64));  // quantized pools: dequantized per key
}

TEST(PagedAttentionTiledTest, EqualsReferenceWithSlidingWindowsAndHoles) {
  for (int32_t block_size : {16, 3, 1}) {
    for (int32_t window : {1, 5, 64, 70}) run({block_size, 8, 2, 64, DType::kF32, DType::kF32, window}, kMixed, 31);
    run({block_size, 8, 2, 64, DType::kF16, DType::kF16, 5, true}, {{40, 1}, {90, 1}}, 34);  // in place, holes
    run({block_size, 8, 2, 64, DType::kInt8, DType::kInt8, 0, true}, {{40, 90}, {25, 1}}, 32);
    run({block_size, 8, 2, 64, DType::kF32, DType::kF32, 9, true}, {{30, 40}}, 33);
  }
}

}  // namespace
}  // namespace pagoda::kernels
