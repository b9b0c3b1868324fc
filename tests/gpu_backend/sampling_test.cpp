// GPU sampling (backend/cuda/sampling.h) against the CPU sampler
// (engine/sampler.h) on the same rows: argmax and top-k = 1 exact, the chosen
// token's logprob within 1e-4, every drawn token inside the CPU's kept set,
// and the frequencies over many seeds matching the CPU's truncated
// distribution (chi-square with a bound a wrong temperature or a missing
// renormalisation fails), ties cut by id like the CPU, draws reproducible per
// (seed, step) whatever row of the batch they land in.
//
// Thresholds: the kernel reports the cuts it sampled under
// (sample_rows_with_cuts); on adversarial rows (many ties, one dominant token,
// top-p close to 1, top-k = 1, vocabularies that are not a multiple of the
// block or of 4, -inf and NaN logits, a cold temperature) the set they keep
// must be the CPU's, up to tokens decided within float rounding. A CPU
// emulation of the kernel's radix select (same arithmetic, sampling_select.h)
// runs the same cases without a GPU, so the algorithm is checked in every build.

#include "pagoda/backend/cuda/sampling.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/sampling_select.h"
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

// ---- Thresholds: the kernel's cuts against the CPU's kept set ----

namespace sel = sampling_select;

uint32_t key_of(float logit) { return sel::order_key(sel::clean_logit(logit)); }

// The tokens the cuts keep (1) or drop (0).
std::vector<char> kept_by_cuts(const std::vector<float>& row, const GpuSamplingCuts& c) {
  std::vector<char> kept(row.size());
  for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
    const uint32_t key = key_of(row[i]);
    kept[i] = sel::passes({c.min_p_key, INT_MAX}, key, i) && sel::passes({c.top_k_key, c.top_k_id}, key, i) &&
              sel::passes({c.top_p_key, c.top_p_id}, key, i);
  }
  return kept;
}

// The CPU sampler's candidates, written out from engine::Sampler (temperature
// -> min-p -> top-k, sorted best first with ties by id) with the cumulative
// mass top-p walks; kept = how many of them top-p keeps. Greedy and all -inf
// rows keep the argmax.
struct CpuKeep {
  std::vector<int32_t> order;
  std::vector<double> cumulative;  // cumulative[j]: mass of order[0..j]
  std::vector<double> probs;       // normalized, before min-p
  double p_max = 0, target = 0;
  size_t kept = 0;
};
CpuKeep cpu_keep(const std::vector<float>& raw, const GpuSamplingParams& p) {
  std::vector<float> row(raw);
  for (float& v : row) v = std::isnan(v) ? -INFINITY : v;  // the GPU's documented NaN rule
  const int32_t vocab = static_cast<int32_t>(row.size());
  CpuKeep out;
  const int32_t argmax = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  if (p.temperature == 0.0f || row[argmax] == -INFINITY) {
    out.order = {argmax};
    out.kept = 1;
    return out;
  }
  const float inv_t = 1.0f / p.temperature;
  out.probs.resize(vocab);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += out.probs[i] = std::exp(static_cast<double>((row[i] - row[argmax]) * inv_t));
  for (double& q : out.probs) q /= sum;
  out.p_max = *std::max_element(out.probs.begin(), out.probs.end());
  std::vector<double> probs = out.probs;
  if (p.min_p > 0.0f)
    for (double& q : probs)
      if (q < p.min_p * out.p_max) q = 0;
  for (int32_t i = 0; i < vocab; ++i)
    if (probs[i] > 0) out.order.push_back(i);
  std::sort(out.order.begin(), out.order.end(),
            [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  if (p.top_k > 0 && static_cast<int32_t>(out.order.size()) > p.top_k) out.order.resize(p.top_k);
  double kept = 0, total = 0;
  for (int32_t t : out.order) total += probs[t];
  for (int32_t t : out.order) out.cumulative.push_back(kept += probs[t]);
  out.target = p.top_p * total;
  out.kept = out.order.size();
  if (p.top_p < 1.0f) {
    for (size_t j = 0; j < out.order.size(); ++j) {
      if (out.cumulative[j] >= out.target) {
        out.kept = j + 1;
        break;
      }
    }
  }
  return out;
}

// "" when `kept` is the CPU's kept set, or differs from it only in tokens whose
// fate is decided within float rounding (the kernel weighs tokens with expf,
// the CPU with exp in double): a weight within 1e-6 of min-p, or a top-p
// boundary whose cumulative mass is within 1e-6 of the target. Otherwise the
// first disagreement, described.
std::string compare_with_cpu(const std::vector<float>& row, const GpuSamplingParams& p, const std::vector<char>& kept) {
  const CpuKeep cpu = cpu_keep(row, p);
  std::vector<int32_t> position(row.size(), -1);
  for (size_t j = 0; j < cpu.order.size(); ++j) position[cpu.order[j]] = static_cast<int32_t>(j);
  const double total = cpu.cumulative.empty() ? 0.0 : cpu.cumulative.back();
  auto near_target = [&](int32_t j) {
    return j >= 0 && j < static_cast<int32_t>(cpu.cumulative.size()) &&
           std::abs(cpu.cumulative[j] - cpu.target) <= 1e-6 * total;
  };
  size_t borderline = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
    const int32_t j = position[i];
    const bool cpu_kept = j >= 0 && static_cast<size_t>(j) < cpu.kept;
    if (cpu_kept == static_cast<bool>(kept[i])) continue;
    const bool rounding_top_p = p.top_p < 1.0f && j >= 0 && (near_target(j) || near_target(j - 1));
    const bool rounding_min_p = p.min_p > 0.0f && !cpu.probs.empty() &&
                                std::abs(cpu.probs[i] / cpu.p_max - p.min_p) <= 1e-6;
    if (rounding_top_p || rounding_min_p) {
      ++borderline;
      continue;
    }
    std::ostringstream why;
    why << "token " << i << " (logit " << row[i] << ", CPU rank " << j << ") is " << (kept[i] ? "kept" : "dropped")
        << " but the CPU " << (cpu_kept ? "keeps" : "drops") << " it; CPU keeps " << cpu.kept << ", GPU "
        << std::count(kept.begin(), kept.end(), 1);
    return why.str();
  }
  if (borderline > 1) return "more than one token decided within rounding: " + std::to_string(borderline);
  return "";
}

// The kernel's threshold algorithm run serially on the host: the same keys,
// fixed-point masses, skip floor and radix levels as sampling.cu, histograms
// as plain arrays. `use_skip_floor` off histograms every survivor.
GpuSamplingCuts emulate_cuts(const std::vector<float>& row, const GpuSamplingParams& p, bool use_skip_floor = true) {
  const int32_t vocab = static_cast<int32_t>(row.size());
  std::vector<float> v(vocab);
  std::vector<uint32_t> key(vocab);
  int32_t max_id = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    v[i] = sel::clean_logit(row[i]);
    key[i] = sel::order_key(v[i]);
    if (v[i] > v[max_id]) max_id = i;
  }
  const float max_value = v[max_id];
  if (!(p.temperature > 0.0f) || p.top_k == 1 || max_value == -INFINITY)
    return {key[max_id], key[max_id], max_id + 1, 0u, 0};
  const float inv_t = 1.0f / p.temperature;
  auto weight = [&](float x) { return std::exp((x - max_value) * inv_t); };  // float: expf
  uint32_t fails = sel::order_key(-INFINITY), holds = key[max_id];
  while (holds - fails > 1) {
    const uint32_t mid = fails + (holds - fails) / 2;
    const double w = std::exp(static_cast<double>((sel::key_value(mid) - max_value) * inv_t));
    (w > 0.0 && w >= static_cast<double>(p.min_p) ? holds : fails) = mid;
  }
  const sel::KeyCut base{holds, INT_MAX};
  sel::KeyCut top_k{0u, 0}, top_p{0u, 0};
  struct Found {
    uint32_t key;
    uint64_t above, at;
  };
  auto select = [&](uint64_t target, const std::function<uint64_t(int32_t)>& measure) {
    uint32_t prefix = 0;
    uint64_t above = 0, at = 0;
    for (int level = 0; level < sel::kNumRadixLevels; ++level) {
      const sel::RadixLevel radix = sel::radix_level(level);
      std::vector<uint64_t> hist(size_t{1} << radix.bits, 0);
      for (int32_t i = 0; i < vocab; ++i) {
        if (level > 0 && (key[i] >> (radix.shift + radix.bits)) != prefix) continue;
        hist[(key[i] >> radix.shift) & (hist.size() - 1)] += measure(i);
      }
      const int b = sel::find_crossing_bucket(hist.data(), static_cast<int>(hist.size()), target, above);
      EXPECT_GE(b, 0) << "target " << target << " never reached";
      if (b < 0) return Found{0u, 0, 0};
      at = hist[b];
      prefix = (prefix << radix.bits) | static_cast<uint32_t>(b);
    }
    return Found{prefix, above, at};
  };
  auto id_after_nth = [&](uint64_t need, const std::function<bool(int32_t)>& match) {
    uint64_t seen = 0;
    for (int32_t i = 0; i < vocab; ++i)
      if (match(i) && ++seen == need) return i + 1;
    return INT_MAX;
  };
  if (p.top_k > 1 && p.top_k < vocab) {
    const uint64_t k = static_cast<uint64_t>(p.top_k);
    const Found t = select(k, [](int32_t) { return uint64_t{1}; });
    top_k = {t.key, INT_MAX};
    if (t.above + t.at > k) top_k.id = id_after_nth(k - t.above, [&](int32_t i) { return key[i] == t.key; });
  }
  auto survives_k = [&](int32_t i) { return sel::passes(base, key[i], i) && sel::passes(top_k, key[i], i); };
  if (p.top_p < 1.0f) {
    const int shift = sel::mass_shift(vocab);
    const double scale = static_cast<double>(uint64_t{1} << shift);
    auto mass = [&](float x) { return sel::to_fixed_mass(weight(x), scale); };
    const uint64_t floor = use_skip_floor ? sel::top_p_skip_floor(p.top_p, shift, vocab) : 0;
    uint64_t total = 0;
    for (int32_t i = 0; i < vocab; ++i)
      if (survives_k(i)) total += mass(v[i]);
    const uint64_t target = sel::top_p_target(total, p.top_p);
    const Found t = select(target, [&](int32_t i) -> uint64_t {
      if (!survives_k(i)) return 0;
      const uint64_t m = mass(v[i]);
      return m >= floor ? m : 0;
    });
    top_p = {t.key, INT_MAX};
    const uint64_t q = mass(sel::key_value(t.key));
    if (q > 0 && sel::tied_tokens_needed(target, t.above, q) < t.at / q) {
      top_p.id = id_after_nth(sel::tied_tokens_needed(target, t.above, q),
                              [&](int32_t i) { return key[i] == t.key && survives_k(i); });
    }
  }
  return {base.key, top_k.key, top_k.id, top_p.key, top_p.id};
}

struct ThresholdCase {
  std::string name;
  std::vector<float> row;
  GpuSamplingParams params;
};

std::vector<float> normal_row(uint32_t seed, int32_t vocab, float sd, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> row(vocab);
  for (float& x : row) x = bf16 ? round_to_bf16(normal(rng)) : normal(rng);
  return row;
}

std::vector<ThresholdCase> threshold_cases() {
  std::vector<ThresholdCase> cases;
  auto add = [&](std::string name, std::vector<float> row, float t, int32_t k, float top_p, float min_p) {
    cases.push_back({std::move(name), std::move(row), GpuSamplingParams{t, k, top_p, min_p, 1, 0}});
  };
  const std::vector<float> llama = llama_like_row(31);  // bf16: many ties
  add("bf16 ties, top-p 0.9", llama, 1.0f, 0, 0.9f, 0.0f);
  add("bf16 ties, top-k 50 + top-p 0.8, T 0.7", llama, 0.7f, 50, 0.8f, 0.0f);
  add("bf16 ties, min-p 0.05 + top-p 0.95, T 1.3", llama, 1.3f, 0, 0.95f, 0.05f);
  add("bf16 ties, top-k 1000", llama, 1.0f, 1000, 1.0f, 0.0f);
  add("bf16 ties, top-p just below 1", llama, 1.0f, 0, std::nextafter(1.0f, 0.0f), 0.0f);
  add("bf16 ties, top-p 0.99999", llama, 1.0f, 0, 0.99999f, 0.0f);
  add("bf16 ties, top-k 1 (argmax)", llama, 1.0f, 1, 0.9f, 0.0f);
  const std::vector<float> flat(1001, 0.25f);  // every token tied; vocab not a multiple of 4
  add("flat, top-p 0.37", flat, 1.0f, 0, 0.37f, 0.0f);
  add("flat, top-k 7", flat, 1.0f, 7, 1.0f, 0.0f);
  add("flat, top-k 7 + top-p 0.5", flat, 1.0f, 7, 0.5f, 0.0f);
  add("flat, top-p 0.001", flat, 1.0f, 0, 0.001f, 0.0f);
  std::vector<float> dominant = normal_row(5, 128256, 1.0f, false);
  dominant[777] = 40.0f;
  add("one dominant token, top-p 0.9", dominant, 1.0f, 0, 0.9f, 0.0f);
  add("one dominant token, top-k 20 + min-p 0.1", dominant, 1.0f, 20, 1.0f, 0.1f);
  std::vector<float> tied_max = normal_row(6, 4096, 1.0f, true);
  tied_max[4000] = tied_max[17] = tied_max[900] = 9.0f;
  add("tied maxima, top-k 1", tied_max, 0.8f, 1, 1.0f, 0.0f);
  add("tied maxima, top-k 2", tied_max, 0.8f, 2, 1.0f, 0.0f);
  add("tied maxima, greedy", tied_max, 0.0f, 0, 1.0f, 0.0f);
  std::vector<float> holes = normal_row(7, 5003, 2.0f, true);
  for (size_t i = 0; i < holes.size(); ++i) {
    if (i % 2 == 0) holes[i] = -INFINITY;
    if (i % 7 == 3) holes[i] = NAN;
  }
  add("-inf and NaN logits, top-k 20 + top-p 0.9", holes, 1.0f, 20, 0.9f, 0.0f);
  add("-inf and NaN logits, top-k 4000 (more than the finite ones)", holes, 1.0f, 4000, 1.0f, 0.0f);
  add("cold temperature (most weights underflow), top-p 0.9", llama, 0.05f, 0, 0.9f, 0.0f);
  add("cold temperature (most weights underflow), top-k 3000", llama, 0.05f, 3000, 1.0f, 0.0f);
  std::vector<float> steps(4099);
  for (size_t i = 0; i < steps.size(); ++i) steps[i] = static_cast<float>((i * 7) % 4);  // four tied groups
  add("four tied groups, top-p 0.6", steps, 1.0f, 0, 0.6f, 0.0f);
  add("four tied groups, top-p 0.999", steps, 1.0f, 0, 0.999f, 0.0f);
  add("four tied groups, top-k 4098 (vocab - 1)", steps, 1.0f, 4098, 1.0f, 0.0f);
  add("four tied groups, top-k above vocab", steps, 1.0f, 5000, 0.5f, 0.0f);
  add("four tied groups, min-p 1", steps, 1.0f, 0, 1.0f, 1.0f);
  std::vector<float> negative = normal_row(8, 3000, 3.0f, true);
  for (float& x : negative) x = x - 60.0f;
  add("negative logits only, top-p 0.5", negative, 1.0f, 0, 0.5f, 0.0f);
  add("large odd vocab 200003, top-p 0.9 + min-p 0.001", normal_row(9, 200003, 2.0f, true), 1.0f, 0, 0.9f, 0.001f);
  add("bench row (normal sd 2, f32), top-p 0.9", normal_row(10, 128256, 2.0f, false), 1.0f, 0, 0.9f, 0.0f);
  add("bench row (normal sd 2, f32), top-k 50 + top-p 0.9", normal_row(11, 128256, 2.0f, false), 1.0f, 50, 0.9f,
      0.0f);
  add("tiny vocab 3, top-p 0.5", {1.0f, 3.0f, 2.0f}, 1.0f, 0, 0.5f, 0.0f);
  return cases;
}

TEST(SamplingSelect, TopPTargetIsTheExactCeilingOfTotalTimesTopP) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t total = rng() >> 24;  // < 2^40: total * top_p is exact in long double
    const float top_p = std::uniform_real_distribution<float>(1e-6f, 1.0f)(rng);
    const long double exact = std::ceil(static_cast<long double>(total) * static_cast<long double>(top_p));
    ASSERT_EQ(sel::top_p_target(total, top_p), std::max<uint64_t>(1, static_cast<uint64_t>(exact)))
        << total << " * " << top_p;
  }
  const uint64_t big = uint64_t{128256} << 47;
  EXPECT_EQ(sel::top_p_target(big, 0.5f), big / 2);
  EXPECT_EQ(sel::top_p_target(big, std::nextafter(1.0f, 0.0f)), big - (big >> 24));
  EXPECT_EQ(sel::top_p_target(0, 0.9f), 1u);  // at least one token
}

TEST(SamplingSelect, FixedPointMassOfAWholeRowCannotOverflow) {
  for (int32_t vocab : {1, 2, 3, 1000, 4096, 128256, 131072, 200003, 262144}) {
    const int shift = sel::mass_shift(vocab);
    const unsigned __int128 worst = static_cast<unsigned __int128>(vocab) << shift;  // every weight 1
    EXPECT_LT(worst, static_cast<unsigned __int128>(1) << 64) << vocab;
    EXPECT_GE(worst * 2, static_cast<unsigned __int128>(1) << 64) << vocab << ": scale not as fine as it could be";
  }
  const double scale = static_cast<double>(uint64_t{1} << 47);
  EXPECT_EQ(sel::to_fixed_mass(1.0f, scale), uint64_t{1} << 47);
  EXPECT_EQ(sel::to_fixed_mass(0.0f, scale), 0u);
  EXPECT_LE(sel::to_fixed_mass(0.25f, scale), sel::to_fixed_mass(std::nextafter(0.25f, 1.0f), scale));
}

TEST(SamplingSelect, KeysOrderLikeTheLogits) {
  const float values[] = {-INFINITY, -1e30f, -2.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 0.5f, 3.0f, 1e30f};
  for (size_t i = 0; i + 1 < std::size(values); ++i) {
    EXPECT_LE(key_of(values[i]), key_of(values[i + 1])) << values[i];
    EXPECT_EQ(sel::key_value(key_of(values[i])), sel::clean_logit(values[i]));
  }
  EXPECT_EQ(key_of(-0.0f), key_of(0.0f));
  EXPECT_EQ(key_of(NAN), key_of(-INFINITY));
}

TEST(SamplingSelect, TheSkipFloorNeverMovesTheTopPThreshold) {
  for (uint32_t seed = 0; seed < 12; ++seed) {
    const std::vector<float> row = normal_row(100 + seed, 20000 + static_cast<int32_t>(seed), 1.0f + seed, seed % 2);
    const float top_p = 0.5f + 0.04f * static_cast<float>(seed);
    const GpuSamplingParams p{0.5f + 0.2f * seed, 0, top_p, 0.0f, 1, 0};
    const GpuSamplingCuts with = emulate_cuts(row, p, true), without = emulate_cuts(row, p, false);
    EXPECT_EQ(with.top_p_key, without.top_p_key) << "seed " << seed;
    EXPECT_EQ(with.top_p_id, without.top_p_id) << "seed " << seed;
    EXPECT_GT(sel::top_p_skip_floor(top_p, sel::mass_shift(20000), 20000), 0u);
  }
}

TEST(SamplingSelect, TheCpuReferenceIsTheSamplersKeptSet) {
  // cpu_keep must describe engine::Sampler: its kept set equals the truncated
  // distribution above, and the sampler's draws never leave it.
  for (const ThresholdCase& c : threshold_cases()) {
    if (c.params.temperature == 0.0f || c.row.size() > 5000) continue;
    bool finite = std::any_of(c.row.begin(), c.row.end(), [](float x) { return std::isfinite(x); });
    bool has_nan = std::any_of(c.row.begin(), c.row.end(), [](float x) { return std::isnan(x); });
    if (!finite || has_nan) continue;  // the CPU sampler has no NaN rule; the GPU maps NaN to -inf
    const CpuKeep cpu = cpu_keep(c.row, c.params);
    std::vector<char> kept(c.row.size(), 0);
    for (size_t j = 0; j < cpu.kept; ++j) kept[cpu.order[j]] = 1;
    if (c.params.top_k != 1) {
      const std::vector<double> truth = cpu_truncated_distribution(c.row, c.params);
      for (size_t i = 0; i < c.row.size(); ++i) ASSERT_EQ(kept[i], truth[i] > 0) << c.name << " token " << i;
    }
    std::mt19937_64 rng(3);
    for (int draw = 0; draw < 40; ++draw) {
      const int32_t t = engine::Sampler::sample(c.row, cpu_params(c.params), {}, rng).token;
      ASSERT_TRUE(kept[t]) << c.name << ": engine::Sampler drew " << t;
    }
  }
}

TEST(SamplingSelect, TheEmulatedRadixSelectKeepsTheCpuSetOnAdversarialRows) {
  for (const ThresholdCase& c : threshold_cases()) {
    const std::vector<char> kept = kept_by_cuts(c.row, emulate_cuts(c.row, c.params));
    EXPECT_EQ(compare_with_cpu(c.row, c.params, kept), "") << c.name;
  }
}

TEST(GpuSampling, ThresholdsKeepTheCpuSetOnAdversarialRows) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (const ThresholdCase& c : threshold_cases()) {
    const int32_t vocab = static_cast<int32_t>(c.row.size());
    // Two rows of the same logits: cuts must agree bit for bit (no order-dependent sums).
    std::vector<float> logits(c.row);
    logits.insert(logits.end(), c.row.begin(), c.row.end());
    GpuSamplingParams second = c.params;
    second.seed = 99;
    const std::vector<GpuSamplingParams> params = {c.params, second};
    DeviceBuffer d_logits = to_device(logits), d_params = to_device(params);
    auto d_tokens = DeviceBuffer::allocate(2 * sizeof(int32_t));
    auto d_logprobs = DeviceBuffer::allocate(2 * sizeof(float));
    auto d_cuts = DeviceBuffer::allocate(2 * sizeof(GpuSamplingCuts));
    ASSERT_TRUE(d_tokens.ok() && d_logprobs.ok() && d_cuts.ok());
    ASSERT_EQ(sample_rows_with_cuts(d_logits.as<float>(), 2, vocab, d_params.as<GpuSamplingParams>(),
                                    d_tokens->as<int32_t>(), d_logprobs->as<float>(), d_cuts->as<GpuSamplingCuts>(),
                                    nullptr),
              cudaSuccess);
    const std::vector<GpuSamplingCuts> cuts = to_host<GpuSamplingCuts>(*d_cuts, 2);
    const std::vector<int32_t> tokens = to_host<int32_t>(*d_tokens, 2);
    const std::vector<float> logprobs = to_host<float>(*d_logprobs, 2);
    const std::vector<char> kept = kept_by_cuts(c.row, cuts[0]);
    EXPECT_EQ(compare_with_cpu(c.row, c.params, kept), "") << c.name;
    EXPECT_EQ(kept_by_cuts(c.row, cuts[1]), kept) << c.name << ": same logits, other cuts";
    for (int r = 0; r < 2; ++r) {
      ASSERT_GE(tokens[r], 0);
      ASSERT_LT(tokens[r], vocab);
      EXPECT_TRUE(kept[tokens[r]]) << c.name << ": drew " << tokens[r] << " outside its own cuts";
    }
    if (std::isfinite(logprobs[0])) {
      std::vector<float> cleaned(c.row);
      for (float& x : cleaned) x = std::isnan(x) ? -INFINITY : x;
      EXPECT_NEAR(logprobs[0], raw_logprob(cleaned, tokens[0]), 1e-4) << c.name;
    }
    // The GPU's cuts and the emulation's keep the same set (their keys may differ
    // between tokens' values, where no token lies).
    EXPECT_EQ(kept_by_cuts(c.row, emulate_cuts(c.row, c.params)), kept) << c.name << ": emulation disagrees";
  }
}

TEST(GpuSampling, ABatchOfBenchRowsKeepsTheCpuSetsInEveryRow) {
  PAGODA_SKIP_WITHOUT_GPU();
  // 64 rows of 128,256 (the bench's shape, f32 and bf16), mixed params in one launch.
  const int32_t rows = 64, vocab = 128256;
  std::vector<float> logits;
  std::vector<std::vector<float>> row_of;
  std::vector<GpuSamplingParams> params;
  const GpuSamplingParams kinds[] = {{1.0f, 0, 0.9f, 0.0f, 0, 0}, {0.8f, 50, 0.9f, 0.0f, 0, 0},
                                     {1.0f, 0, 1.0f, 0.0f, 0, 0}, {1.2f, 0, 0.95f, 0.02f, 0, 0},
                                     {0.0f, 0, 1.0f, 0.0f, 0, 0}, {1.0f, 40, 1.0f, 0.0f, 0, 0}};
  for (int32_t r = 0; r < rows; ++r) {
    row_of.push_back(normal_row(500 + r, vocab, 2.0f, r % 2 == 1));
    logits.insert(logits.end(), row_of.back().begin(), row_of.back().end());
    GpuSamplingParams p = kinds[r % std::size(kinds)];
    p.seed = r;
    params.push_back(p);
  }
  DeviceBuffer d_logits = to_device(logits), d_params = to_device(params);
  auto d_tokens = DeviceBuffer::allocate(rows * sizeof(int32_t));
  auto d_logprobs = DeviceBuffer::allocate(rows * sizeof(float));
  auto d_cuts = DeviceBuffer::allocate(rows * sizeof(GpuSamplingCuts));
  ASSERT_TRUE(d_tokens.ok() && d_logprobs.ok() && d_cuts.ok());
  ASSERT_EQ(sample_rows_with_cuts(d_logits.as<float>(), rows, vocab, d_params.as<GpuSamplingParams>(),
                                  d_tokens->as<int32_t>(), d_logprobs->as<float>(), d_cuts->as<GpuSamplingCuts>(),
                                  nullptr),
            cudaSuccess);
  const std::vector<GpuSamplingCuts> cuts = to_host<GpuSamplingCuts>(*d_cuts, rows);
  const std::vector<int32_t> tokens = to_host<int32_t>(*d_tokens, rows);
  for (int32_t r = 0; r < rows; ++r) {
    const std::vector<char> kept = kept_by_cuts(row_of[r], cuts[r]);
    EXPECT_EQ(compare_with_cpu(row_of[r], params[r], kept), "") << "row " << r;
    EXPECT_TRUE(kept[tokens[r]]) << "row " << r;
  }
}

TEST(GpuSampling, PlainSampleRowsDrawsWhatTheCutsVersionDraws) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::vector<float> row = llama_like_row(44, 8192);
  const GpuSamplingParams p{1.0f, 30, 0.9f, 0.0f, 5, 6};
  const GpuDraws plain = sample_on_gpu(row, 8192, {p});
  DeviceBuffer d_logits = to_device(row), d_params = to_device(std::vector<GpuSamplingParams>{p});
  auto d_tokens = DeviceBuffer::allocate(sizeof(int32_t));
  auto d_logprobs = DeviceBuffer::allocate(sizeof(float));
  ASSERT_TRUE(d_tokens.ok() && d_logprobs.ok());
  ASSERT_EQ(sample_rows_with_cuts(d_logits.as<float>(), 1, 8192, d_params.as<GpuSamplingParams>(),
                                  d_tokens->as<int32_t>(), d_logprobs->as<float>(), nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(to_host<int32_t>(*d_tokens, 1)[0], plain.tokens[0]);
}



// Structured outputs: apply_token_masks makes the masked rows' disallowed logits -inf exactly as
// the CPU's apply_token_mask does, leaves the other rows alone, and the sampler then draws the
// CPU's greedy token with the masked distribution's logprob, and only allowed tokens otherwise.
TEST(GpuSampling, TokenMasksMatchTheCpuMaskAndKeepDrawsInsideTheSet) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t vocab = 128256, rows = 9;
  const size_t words = (vocab + 63) / 64;
  std::vector<float> logits;
  std::vector<std::vector<float>> raw;
  std::vector<GpuSamplingParams> params(rows);
  for (int32_t r = 0; r < rows; ++r) {
    raw.push_back(llama_like_row(300 + r, vocab));
    logits.insert(logits.end(), raw.back().begin(), raw.back().end());
    params[r].temperature = r % 2 == 0 ? 0.0f : 1.0f;
    params[r].seed = 11 + r;
  }
  // Rows 1, 4, 7 masked: ~5% of the vocabulary, one token only, everything but the argmax.
  std::mt19937 rng(5);
  std::vector<int32_t> masked_rows = {1, 4, 7};
  std::vector<uint64_t> masks(masked_rows.size() * words, 0);
  auto allow = [&](size_t k, int32_t t) { masks[k * words + (static_cast<size_t>(t) >> 6)] |= uint64_t{1} << (t & 63); };
  for (int32_t t = 0; t < vocab; ++t)
    if (rng() % 20 == 0) allow(0, t);
  allow(1, 4242);
  const int32_t argmax7 = static_cast<int32_t>(std::max_element(raw[7].begin(), raw[7].end()) - raw[7].begin());
  for (int32_t t = 0; t < vocab; ++t)
    if (t != argmax7) allow(2, t);
  DeviceBuffer d_logits = to_device(logits);
  DeviceBuffer d_rows = to_device(masked_rows);
  DeviceBuffer d_masks = to_device(masks);
  ASSERT_EQ(apply_token_masks(d_logits.as<float>(), vocab, d_rows.as<int32_t>(), d_masks.as<uint64_t>(),
                              static_cast<int32_t>(masked_rows.size()), nullptr),
            cudaSuccess);
  const std::vector<float> after = to_host<float>(d_logits, logits.size());
  std::vector<std::vector<float>> expected = raw;
  for (size_t k = 0; k < masked_rows.size(); ++k)
    engine::apply_token_mask(expected[masked_rows[k]], std::span<const uint64_t>(masks.data() + k * words, words));
  for (int32_t r = 0; r < rows; ++r)
    ASSERT_TRUE(std::equal(expected[r].begin(), expected[r].end(), after.begin() + static_cast<size_t>(r) * vocab))
        << "row " << r;
  const GpuDraws gpu = sample_on_gpu(after, vocab, params);
  for (int32_t r = 0; r < rows; ++r) {
    std::mt19937_64 cpu_rng(1);
    const engine::SampledToken cpu = engine::Sampler::sample(expected[r], cpu_params(params[r]), {}, cpu_rng);
    if (params[r].temperature == 0.0f) {
      EXPECT_EQ(gpu.tokens[r], cpu.token) << "row " << r;
      EXPECT_NEAR(gpu.logprobs[r], cpu.logprob, 1e-4) << "row " << r;
    }
    EXPECT_TRUE(std::isfinite(expected[r][gpu.tokens[r]])) << "row " << r << " drew masked token " << gpu.tokens[r];
  }
  EXPECT_EQ(gpu.tokens[4], 4242);
  EXPECT_NE(gpu.tokens[7], argmax7);
}

}  // namespace
}  // namespace pagoda::cuda
