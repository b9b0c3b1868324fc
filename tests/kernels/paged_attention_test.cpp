// Paged attention against dense causal attention over contiguous per-sequence
// K/V. The pool is filled through kv_write at scattered block ids; sequences
// have odd lengths, lengths that are not a multiple of the block size, and
// cached prefixes that end mid-block; prefill chunks and decodes are mixed.

#include "pagoda/backend/cpu/kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/random_data.h"
#include "pagoda/backend/cpu/kernels/kv_write.h"

namespace pagoda::kernels {
namespace {

struct SeqSpec {
  int32_t cached;
  int32_t fresh;
};

struct Config {
  int32_t block_size, q_heads, kv_heads, head_dim, window;
};

void run_case(const Config& cfg, const std::vector<SeqSpec>& specs, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "block_size " << cfg.block_size << " heads " << cfg.q_heads << "/"
                                  << cfg.kv_heads << " d " << cfg.head_dim << " window " << cfg.window);
  const size_t D = cfg.head_dim, kv_row = size_t(cfg.kv_heads) * D, q_row = size_t(cfg.q_heads) * D;
  const int32_t num_blocks = 96;  // enough for block size 1
  std::vector<float> key_pool(size_t(num_blocks) * cfg.block_size * kv_row, 0.0f);
  std::vector<float> value_pool(key_pool.size(), 0.0f);
  PagedKvLayer layer{key_pool.data(), value_pool.data(), num_blocks, cfg.block_size, cfg.kv_heads, cfg.head_dim};

  // Distinct block ids, shuffled, shared out to the sequences.
  std::vector<int32_t> free_ids(num_blocks);
  std::iota(free_ids.begin(), free_ids.end(), 0);
  std::shuffle(free_ids.begin(), free_ids.end(), std::mt19937_64(seed));

  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<float>> keys, values;  // contiguous per sequence: [len, kv_heads, D]
  std::vector<PagedSequence> seqs;
  int32_t rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    const int32_t len = specs[s].cached + specs[s].fresh;
    const int32_t nb = (len + cfg.block_size - 1) / cfg.block_size;
    tables.emplace_back(free_ids.end() - nb, free_ids.end());
    free_ids.resize(free_ids.size() - nb);
    keys.push_back(testing::random_values(size_t(len) * kv_row, seed * 31 + s));
    values.push_back(testing::random_values(size_t(len) * kv_row, seed * 37 + s));
    seqs.push_back({rows, specs[s].fresh, specs[s].cached, {}, {}});
    rows += specs[s].fresh;
  }
  for (size_t s = 0; s < specs.size(); ++s) seqs[s].block_table = tables[s];

  // The cached prefix goes in first (as an earlier step would have written it)...
  for (size_t s = 0; s < specs.size(); ++s) {
    PagedSequence prefix{0, specs[s].cached, 0, tables[s]};
    if (specs[s].cached == 0) continue;
    const auto slots = plan_kv_slots({&prefix, 1}, cfg.block_size, size_t(specs[s].cached));
    kv_write(keys[s].data(), values[s].data(), slots, layer);
  }
  // ...then this step's tokens, all sequences at once, as the model does.
  std::vector<float> new_k(size_t(rows) * kv_row), new_v(new_k.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    std::copy_n(keys[s].data() + size_t(specs[s].cached) * kv_row, size_t(specs[s].fresh) * kv_row,
                new_k.data() + size_t(seqs[s].token_offset) * kv_row);
    std::copy_n(values[s].data() + size_t(specs[s].cached) * kv_row, size_t(specs[s].fresh) * kv_row,
                new_v.data() + size_t(seqs[s].token_offset) * kv_row);
  }
  kv_write(new_k.data(), new_v.data(), plan_kv_slots(seqs, cfg.block_size, size_t(rows)), layer);

  const auto q = testing::random_values(size_t(rows) * q_row, seed + 5, -2.0f, 2.0f);
  std::vector<float> out(q.size(), -777.0f);
  const float scale = 1.0f / std::sqrt(float(D));
  paged_attention(q.data(), layer, seqs, PagedAttentionParams{cfg.q_heads, scale, cfg.window}, out.data());

  for (size_t s = 0; s < specs.size(); ++s)
    for (int32_t i = 0; i < specs[s].fresh; ++i) {
      const int32_t qi = specs[s].cached + i;
      const int32_t first = cfg.window > 0 ? std::max(0, qi - cfg.window + 1) : 0;
      const size_t row = size_t(seqs[s].token_offset + i);
      for (int32_t h = 0; h < cfg.q_heads; ++h) {
        const int32_t kh = h / (cfg.q_heads / cfg.kv_heads);
        std::vector<double> w;
        for (int32_t p = first; p <= qi; ++p) {
          double dot = 0;
          for (size_t d = 0; d < D; ++d) dot += double(q[row * q_row + h * D + d]) * keys[s][p * kv_row + kh * D + d];
          w.push_back(dot * scale);
        }
        const double mx = *std::max_element(w.begin(), w.end());
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (size_t d = 0; d < D; ++d) {
          double expected = 0;
          for (int32_t p = first; p <= qi; ++p) expected += w[p - first] / sum * values[s][p * kv_row + kh * D + d];
          ASSERT_NEAR(out[row * q_row + h * D + d], expected, 2e-5)
              << "seq " << s << " token " << i << " head " << h << " dim " << d;
        }
      }
    }
}

const std::vector<SeqSpec> kMixedBatch = {
    {0, 7},   // prefill from scratch, odd length
    {5, 1},   // decode after a prefix ending mid-block
    {17, 4},  // prefill chunk after a cached prefix
    {0, 1},   // one-token prompt
    {31, 1},  // long-ish decode
};

TEST(PagedAttentionTest, MatchesDenseAttention) {
  for (int32_t block_size : {1, 3, 16}) {
    run_case({block_size, 6, 2, 8, 0}, kMixedBatch, 1);    // GQA
    run_case({block_size, 4, 4, 12, 0}, kMixedBatch, 2);   // MHA
    run_case({block_size, 5, 1, 6, 0}, kMixedBatch, 3);    // MQA
  }
}

TEST(PagedAttentionTest, SlidingWindow) {
  run_case({3, 4, 2, 8, 4}, kMixedBatch, 4);
  run_case({16, 4, 2, 8, 1}, kMixedBatch, 5);
}

TEST(KvWriteTest, PlansSlotsThroughBlockTables) {
  const std::vector<int32_t> table = {9, 4, 6};
  // Block size 2: indices 3, 4, 5 live in block 4 (slot 1) and block 6 (slots 0, 1).
  PagedSequence seq{1, 3, 3, table};
  const auto slots = plan_kv_slots({&seq, 1}, 2, 5);
  EXPECT_EQ(slots, (std::vector<int64_t>{-1, 4 * 2 + 1, 6 * 2 + 0, 6 * 2 + 1, -1}));

  // kv_write puts rows at those slots and skips negative ones.
  std::vector<float> key_pool(10 * 2 * 3, 0.0f), value_pool(key_pool.size(), 0.0f);
  PagedKvLayer layer{key_pool.data(), value_pool.data(), 10, 2, 1, 3};
  const auto k = testing::random_values(5 * 3, 1), v = testing::random_values(5 * 3, 2);
  kv_write(k.data(), v.data(), slots, layer);
  for (size_t t = 1; t < 4; ++t)
    for (size_t d = 0; d < 3; ++d) {
      EXPECT_EQ(key_pool[slots[t] * 3 + d], k[t * 3 + d]);
      EXPECT_EQ(value_pool[slots[t] * 3 + d], v[t * 3 + d]);
    }
  size_t written = 0;
  for (float x : key_pool) written += x != 0.0f;
  EXPECT_EQ(written, 9u);
}

}  // namespace
}  // namespace pagoda::kernels
