// GPU sampling (backend/cuda/sampling.h) against the CPU sampler
// (engine/sampler.h) on the same rows: argmax and top-k = 1 exact, the chosen
// token's logprob within 1e-4, every drawn token inside the CPU's kept set,
// and the frequencies over many seeds matching the CPU's truncated
// distribution (chi-square with a bound a wrong temperature or a missing
// renormalisation fails), ties cut by id like the CPU, draws reproducible per
// (seed, step) whatever row of the batch they land in.

#include "pagoda/backend/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/engine/sampler.h"

namespace pagoda::cuda {
namespace {

using testing::to_device;
using testing::to_host;

struct GpuDraws {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Samples every row of `logits` [rows, vocab] with its params on the GPU.
GpuDraws sample_on_gpu(const std::vector<float>& logits, int32_t vocab, const std::vector<GpuSamplingParams>& params) {
  const int32_t rows = static_cast<int32_t>(params.size());
  DeviceBuffer d_logits = to_device(logits);
  DeviceBuffer d_params = to_device(params);
  auto d_tokens = DeviceBuffer::allocate(rows * sizeof(int32_t));
  auto d_logprobs = DeviceBuffer::allocate(rows * sizeof(float));
  EXPECT_TRUE(d_tokens.ok() && d_logprobs.ok());
  EXPECT_EQ(sample_rows(d_logits.as<float>(), rows, vocab, d_params.as<GpuSamplingParams>(), d_tokens->as<int32_t>(),
                        d_logprobs->as<float>(), nullptr),
            cudaSuccess);
  return {to_host<int32_t>(*d_tokens, rows), to_host<float>(*d_logprobs, rows)};
}

// One logits row repeated `rows` times with params differing only in seed.
GpuDraws sample_many(const std::vector<float>& row, GpuSamplingParams params, int32_t rows, uint64_t first_seed = 1) {
  std::vector<float> logits;
  logits.reserve(row.size() * rows);
  std::vector<GpuSamplingParams> all(rows, params);
  for (int32_t r = 0; r < rows; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    all[r].seed = first_seed + static_cast<uint64_t>(r);
  }
  return sample_on_gpu(logits, static_cast<int32_t>(row.size()), all);
}

engine::SamplingParams cpu_params(const GpuSamplingParams& p) {
  engine::SamplingParams s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  return s;
}

// The distribution the CPU sampler draws from, written out from its documented
// order (temperature -> min-p -> top-k -> top-p, ties by id) and cross-checked
// against engine::Sampler's own draws below. Zero outside the kept set.
std::vector<double> cpu_truncated_distribution(const std::vector<float>& row, const GpuSamplingParams& p) {
  const int32_t vocab = static_cast<int32_t>(row.size());
  const float max_logit = *std::max_element(row.begin(), row.end());
  const float inv_t = 1.0f / p.temperature;
  std::vector<double> probs(vocab);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += probs[i] = std::exp(static_cast<double>((row[i] - max_logit) * inv_t));
  for (double& q : probs) q /= sum;
  const double p_max = *std::max_element(probs.begin(), probs.end());
  for (double& q : probs)
    if (q < p.min_p * p_max) q = 0;
  std::vector<int32_t> order;
  for (int32_t i = 0; i < vocab; ++i)
    if (probs[i] > 0) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  if (p.top_k > 0 && static_cast<int32_t>(order.size()) > p.top_k) order.resize(p.top_k);
  double total = 0;
  for (int32_t t : order) total += probs[t];
  if (p.top_p < 1.0f) {
    double kept = 0;
    size_t keep = 0;
    while (keep < order.size()) {
      kept += probs[order[keep++]];
      if (kept >= p.top_p * total) break;
    }
    order.resize(keep);
  }
  std::vector<double> out(vocab, 0.0);
  double mass = 0;
  for (int32_t t : order) mass += probs[t];
  for (int32_t t : order) out[t] = probs[t] / mass;
  return out;
}

double raw_logprob(const std::vector<float>& row, int32_t token) {
  const float m = *std::max_element(row.begin(), row.end());
  double s = 0;
  for (float v : row) s += std::exp(static_cast<double>(v - m));
  return row[token] - (m + std::log(s));
}

// Llama-3-like row: vocab 128,256, a few strong tokens over a normal tail, in bf16.
std::vector<float> llama_like_row(uint32_t seed, int32_t vocab = 128256) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(vocab);
  for (float& v : row) v = round_to_bf16(normal(rng));
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  for (int i = 0; i < 8; ++i) row[id(rng)] = round_to_bf16(10.0f + i * 0.7f);
  return row;
}

TEST(GpuSampling, GreedyAndTopKOneMatchTheCpuArgmaxExactly) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t vocab = 128256;
  std::vector<float> logits;
  std::vector<GpuSamplingParams> params;
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 16; ++r) {
    rows.push_back(llama_like_row(100 + r));
    if (r == 3) rows.back()[77] = rows.back()[5000] = 99.0f;  // a tie: the lower id wins, like the CPU
    logits.insert(logits.end(), rows.back().begin(), rows.back().end());
    GpuSamplingParams p;
    p.temperature = r % 2 == 0 ? 0.0f : 0.8f;
    p.top_k = r % 2 == 0 ? 0 : 1;
    p.top_p = r % 4 == 1 ? 0.5f : 1.0f;
    p.seed = r;
    params.push_back(p);
  }
  const GpuDraws gpu = sample_on_gpu(logits, vocab, params);
  for (int r = 0; r < 16; ++r) {
    std::mt19937_64 rng(1);
    const engine::SampledToken cpu = engine::Sampler::sample(rows[r], cpu_params(params[r]), {}, rng);
    EXPECT_EQ(gpu.tokens[r], cpu.token) << "row " << r;
    EXPECT_NEAR(gpu.logprobs[r], cpu.logprob, 1e-4) << "row " << r;
  }
  EXPECT_EQ(gpu.tokens[3], 77);
}

TEST(GpuSampling, DrawsStayInsideTheCpuKeptSetWithCorrectLogprobs) {
  PAGODA_SKIP_WITHOUT_GPU();
  struct Case {
    float temperature, top_p, min_p;
    int32_t top_k;
  };
  const Case cases[] = {{1.0f, 0.9f, 0.0f, 0}, {0.7f, 1.0f, 0.0f, 50}, {1.3f, 0.95f, 0.0f, 200},
                        {1.0f, 1.0f, 0.05f, 0}, {0.5f, 0.8f, 0.01f, 40}, {2.0f, 0.3f, 0.0f, 0}};
  for (int c = 0; c < 6; ++c) {
    const std::vector<float> row = llama_like_row(7 + c);
    GpuSamplingParams p{cases[c].temperature, cases[c].top_k, cases[c].top_p, cases[c].min_p, 0, 3};
    const std::vector<double> truth = cpu_truncated_distribution(row, p);
    // The reference is the CPU sampler's distribution: its draws stay inside it.
    std::mt19937_64 rng(5);
    for (int i = 0; i < 50; ++i) {
      const int32_t t = engine::Sampler::sample(row, cpu_params(p), {}, rng).token;
      ASSERT_GT(truth[t], 0.0) << "case " << c << ": reference disagrees with engine::Sampler on token " << t;
    }
    const GpuDraws gpu = sample_many(row, p, 512, 1000 * c);
    std::set<int32_t> distinct;
    for (size_t i = 0; i < gpu.tokens.size(); ++i) {
      const int32_t t = gpu.tokens[i];
      ASSERT_GE(t, 0);
      ASSERT_LT(t, static_cast<int32_t>(row.size()));
      EXPECT_GT(truth[t], 0.0) << "case " << c << ": token " << t << " is outside the CPU's kept set";
      EXPECT_NEAR(gpu.logprobs[i], raw_logprob(row, t), 1e-4) << "case " << c;
      distinct.insert(t);
    }
    EXPECT_GT(distinct.size(), 1u) << "case " << c << " never varied";
  }
}

// Pearson chi-square of `counts` against `probs` (cells with expected < 5 pooled).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n, int* dof) {
  double chi = 0, pooled_expected = 0;
  int64_t pooled_count = 0;
  *dof = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    if (e < 5) {
      pooled_expected += e;
      pooled_count += counts[i];
      if (probs[i] == 0 && counts[i] > 0) return 1e30;  // outside the kept set
      continue;
    }
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*dof;
  }
  if (pooled_expected > 0) {
    chi += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / std::max(pooled_expected, 1.0);
    ++*dof;
  }
  return chi;
}

TEST(GpuSampling, FrequenciesOverSeedsMatchTheCpuTruncatedDistribution) {
  PAGODA_SKIP_WITHOUT_GPU();
  // A small vocabulary with a spread of probabilities, so 40,000 draws resolve
  // each kept token well: temperature, min-p, top-k and top-p all bite.
  const int32_t vocab = 300;
  std::vector<float> row(vocab);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (float& v : row) v = normal(rng);
  const GpuSamplingParams cases[] = {{0.7f, 0, 0.9f, 0.0f, 0, 0},
                                     {1.0f, 20, 1.0f, 0.0f, 0, 0},
                                     {1.5f, 50, 0.8f, 0.02f, 0, 0},
                                     {1.0f, 0, 1.0f, 0.0f, 0, 0}};
  const int32_t draws = 40000;
  for (int c = 0; c < 4; ++c) {
    const std::vector<double> truth = cpu_truncated_distribution(row, cases[c]);
    const GpuDraws gpu = sample_many(row, cases[c], draws, 1 + 100000 * c);
    std::vector<int64_t> counts(vocab, 0);
    for (int32_t t : gpu.tokens) ++counts[t];
    int dof = 0;
    const double chi = chi_square(counts, truth, draws, &dof);
    // p ~ 1e-6 tail of chi-square: mean dof, sd sqrt(2 dof).
    const double bound = dof + 5.0 * std::sqrt(2.0 * dof) + 10.0;
    EXPECT_LT(chi, bound) << "case " << c << ": chi-square " << chi << " with " << dof << " dof";
    double worst = 0;
    for (int32_t i = 0; i < vocab; ++i) worst = std::max(worst, std::abs(counts[i] / double(draws) - truth[i]));
    EXPECT_LT(worst, 0.012) << "case " << c;

    // The same test can fail: against the distribution at another temperature it must.
    GpuSamplingParams wrong = cases[c];
    wrong.temperature *= 1.3f;
    int wrong_dof = 0;
    EXPECT_GT(chi_square(counts, cpu_truncated_distribution(row, wrong), draws, &wrong_dof), bound) << "case " << c;
  }
}

TEST(GpuSampling, TiesAtTheThresholdsAreCutByTokenIdLikeTheCpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::vector<float> flat(64, 0.5f);
  // top-k 5 of 64 equal logits: ids 0..4; top-p 0.25: the first 16 ids.
  GpuSamplingParams k{1.0f, 5, 1.0f, 0.0f, 0, 0};
  GpuSamplingParams p{1.0f, 0, 0.25f, 0.0f, 0, 0};
  for (const auto& [params, kept] : {std::pair{k, 5}, std::pair{p, 16}}) {
    const std::vector<double> truth = cpu_truncated_distribution(flat, params);
    EXPECT_EQ(std::count_if(truth.begin(), truth.end(), [](double q) { return q > 0; }), kept);
    const GpuDraws gpu = sample_many(flat, params, 4000);
    std::set<int32_t> seen(gpu.tokens.begin(), gpu.tokens.end());
    EXPECT_EQ(static_cast<int32_t>(seen.size()), kept);
    EXPECT_EQ(*seen.rbegin(), kept - 1);
  }
}

TEST(GpuSampling, DrawsAreReproduciblePerSeedAndStepWhateverTheRow) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::vector<float> row = llama_like_row(3, 4096);
  GpuSamplingParams p{1.0f, 0, 0.95f, 0.0f, 42, 0};
  // Batch A: (42, step 0..7) in rows 0..7. Batch B: the same keys reversed, among other rows.
  std::vector<float> a_logits, b_logits;
  std::vector<GpuSamplingParams> a, b;
  for (int s = 0; s < 8; ++s) {
    a_logits.insert(a_logits.end(), row.begin(), row.end());
    p.step = s;
    a.push_back(p);
  }
  for (int s = 7; s >= 0; --s) {
    GpuSamplingParams other{1.0f, 0, 1.0f, 0.0f, 7, 123};
    b_logits.insert(b_logits.end(), row.begin(), row.end());
    b.push_back(other);
    b_logits.insert(b_logits.end(), row.begin(), row.end());
    p.step = s;
    b.push_back(p);
  }
  const GpuDraws ga = sample_on_gpu(a_logits, 4096, a), gb = sample_on_gpu(b_logits, 4096, b);
  std::set<int32_t> distinct;
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(ga.tokens[s], gb.tokens[2 * (7 - s) + 1]) << "step " << s;
    distinct.insert(ga.tokens[s]);
  }
  EXPECT_GT(distinct.size(), 1u) << "every step drew the same token";
  // The generator: uniform, distinct per key.
  double mean = 0;
  for (int i = 0; i < 100000; ++i) mean += sampling_uniform(9, i / 100, i % 100);
  EXPECT_NEAR(mean / 100000, 0.5, 0.005);
  EXPECT_NE(sampling_uniform(1, 0, 0), sampling_uniform(2, 0, 0));
  EXPECT_NE(sampling_uniform(1, 0, 0), sampling_uniform(1, 1, 0));
}

TEST(GpuSampling, AVocabularyNotAMultipleOfFourTakesTheScalarLoadsToTheSameResult) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::vector<float> row = llama_like_row(21, 1003);
  for (const GpuSamplingParams& p : {GpuSamplingParams{0.0f, 0, 1.0f, 0.0f, 0, 0},
                                     GpuSamplingParams{1.0f, 10, 0.9f, 0.0f, 0, 0}}) {
    const std::vector<double> truth = cpu_truncated_distribution(row, p.temperature > 0 ? p : GpuSamplingParams{
                                                                     1.0f, 1, 1.0f, 0.0f, 0, 0});
    const GpuDraws gpu = sample_many(row, p, 256);
    for (size_t i = 0; i < gpu.tokens.size(); ++i) {
      EXPECT_GT(truth[gpu.tokens[i]], 0.0) << "token " << gpu.tokens[i];
      EXPECT_NEAR(gpu.logprobs[i], raw_logprob(row, gpu.tokens[i]), 1e-4);
    }
  }
}

TEST(GpuSampling, RowsWithoutFiniteLogitsFallBackToArgmax) {
  PAGODA_SKIP_WITHOUT_GPU();
  std::vector<float> row(1000, -INFINITY);
  std::vector<float> nan_row(1000, NAN);
  nan_row[10] = 1.0f;
  std::vector<float> logits = row;
  logits.insert(logits.end(), nan_row.begin(), nan_row.end());
  GpuSamplingParams p{1.0f, 10, 0.9f, 0.1f, 1, 1};
  const GpuDraws gpu = sample_on_gpu(logits, 1000, {p, p});
  EXPECT_EQ(gpu.tokens[0], 0);
  EXPECT_TRUE(std::isinf(gpu.logprobs[0]) && gpu.logprobs[0] < 0);
  EXPECT_EQ(gpu.tokens[1], 10);  // NaN is -inf: the only finite logit is certain
  EXPECT_NEAR(gpu.logprobs[1], 0.0f, 1e-6);
}

}  // namespace
}  // namespace pagoda::cuda
