// Penalties and top logprobs of drawn tokens on the GPU (backend/cuda/sampling.h: apply_penalties,
// restore_penalized, score_rows with token -1) against the CPU sampler (engine::Sampler) on the same
// rows and histories: the penalized logits bit for bit, the greedy draw over them the CPU's token,
// the row restored bit for bit after the draw, and the drawn token's score (logprob, top tokens) that
// of the raw row, as engine::Sampler reports it. Vocabularies of 128,256 and 1,000; repetition above
// and below 1, frequency and presence with counts up to 9, prompt-only tokens, ids outside the
// vocabulary (skipped) and -inf logits.

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/sampling.h"
#include "pagoda/engine/sampler.h"

namespace pagoda::cuda {
namespace {

using testing::to_device;
using testing::to_host;

struct PenaltyCase {
  std::vector<float> row;
  engine::SamplingParams params;  // temperature 0: the greedy draw
  engine::TokenHistory history;
};

// The history as the engine lists it (Engine::fill_penalty_tokens): with a repetition penalty the
// prompt's tokens (with their output counts), then the output's not in the prompt; else the output's.
std::vector<GpuPenaltyToken> listed(const PenaltyCase& c) {
  std::vector<GpuPenaltyToken> out;
  const bool repetition = c.params.repetition_penalty != 1.0f;
  if (repetition)
    for (const auto& [t, n] : c.history.prompt_counts) {
      const auto o = c.history.output_counts.find(t);
      out.push_back({t, o == c.history.output_counts.end() ? 0 : o->second, 0.0f});
    }
  for (const auto& [t, n] : c.history.output_counts)
    if (!repetition || !c.history.prompt_counts.contains(t)) out.push_back({t, n, 0.0f});
  return out;
}

std::vector<PenaltyCase> cases_for(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1), count(1, 9);
  std::vector<PenaltyCase> out;
  const float settings[][3] = {{1.3f, 0.0f, 0.0f}, {0.7f, 0.0f, 0.0f}, {1.0f, 0.8f, 0.0f}, {1.0f, 0.0f, 1.5f},
                               {1.6f, 1.5f, 0.4f}, {1.0f, -0.5f, -1.0f}};  // the last two favour seen tokens
  for (const auto& s : settings) {
    PenaltyCase c;
    c.row.resize(static_cast<size_t>(vocab));
    for (float& v : c.row) v = normal(rng);
    for (int32_t j = 5; j < vocab; j += 97) c.row[static_cast<size_t>(j)] = -std::numeric_limits<float>::infinity();
    c.params.temperature = 0.0f;
    c.params.repetition_penalty = s[0];
    c.params.frequency_penalty = s[1];
    c.params.presence_penalty = s[2];
    c.params.logprobs = 5;
    // The row's best tokens are in the history, so the penalties move the argmax.
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                      [&](int32_t a, int32_t b) { return c.row[static_cast<size_t>(a)] > c.row[static_cast<size_t>(b)]; });
    for (int i = 0; i < 8; ++i) {
      if (i % 2 == 0) c.history.prompt_counts[order[static_cast<size_t>(i)]] = 1;
      if (i % 3 != 2) c.history.output_counts[order[static_cast<size_t>(i)]] = count(rng);
    }
    for (int i = 0; i < 300; ++i) {
      c.history.prompt_counts[id(rng)] += 1;
      if (i % 4 == 0) c.history.output_counts[id(rng)] = count(rng);
    }
    c.history.output_counts[5] = 2;  // a -inf logit stays -inf
    out.push_back(std::move(c));
  }
  return out;
}

// The CPU sampler's penalized row (engine::Sampler::sample's own arithmetic, written out).
std::vector<float> cpu_penalized(const PenaltyCase& c) {
  std::vector<float> v = c.row;
  const engine::SamplingParams& p = c.params;
  auto scale = [&](int32_t t) { v[t] = v[t] > 0 ? v[t] / p.repetition_penalty : v[t] * p.repetition_penalty; };
  if (p.repetition_penalty != 1.0f) {
    for (const auto& [t, n] : c.history.prompt_counts) scale(t);
    for (const auto& [t, n] : c.history.output_counts)
      if (!c.history.prompt_counts.contains(t)) scale(t);
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    for (const auto& [t, n] : c.history.output_counts) v[t] -= p.frequency_penalty * static_cast<float>(n) + p.presence_penalty;
  return v;
}

void expect_cpu_sampler(const std::vector<PenaltyCase>& cases, int32_t vocab, int32_t extra_ids) {
  std::vector<float> logits;
  std::vector<GpuPenaltyRow> rows;
  std::vector<GpuPenaltyToken> tokens;
  std::vector<GpuSamplingParams> params(cases.size());
  std::vector<GpuScoreRequest> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    logits.insert(logits.end(), cases[i].row.begin(), cases[i].row.end());
    std::vector<GpuPenaltyToken> list = listed(cases[i]);
    for (int32_t j = 0; j < extra_ids; ++j) list.push_back({vocab + j, 1, 0.0f});  // outside: skipped
    list.push_back({-1, 1, 0.0f});
    const engine::SamplingParams& p = cases[i].params;
    rows.push_back({static_cast<int32_t>(i), static_cast<int32_t>(tokens.size()), static_cast<int32_t>(list.size()),
                    p.repetition_penalty, p.frequency_penalty, p.presence_penalty});
    tokens.insert(tokens.end(), list.begin(), list.end());
    requests.push_back({static_cast<int32_t>(i), -1, *p.logprobs});
  }
  DeviceBuffer d_logits = to_device(logits), d_rows = to_device(rows), d_tokens = to_device(tokens);
  DeviceBuffer d_params = to_device(params), d_requests = to_device(requests);
  auto d_sampled = DeviceBuffer::allocate(cases.size() * sizeof(int32_t));
  auto d_logprobs = DeviceBuffer::allocate(cases.size() * sizeof(float));
  auto d_scores = DeviceBuffer::allocate(cases.size() * sizeof(GpuRowScore));
  ASSERT_TRUE(d_sampled.ok() && d_logprobs.ok() && d_scores.ok());
  const int32_t n = static_cast<int32_t>(cases.size());
  ASSERT_EQ(apply_penalties(d_logits.as<float>(), vocab, d_rows.as<GpuPenaltyRow>(), n,
                            d_tokens.as<GpuPenaltyToken>(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> penalized = to_host<float>(d_logits, logits.size());
  ASSERT_EQ(sample_rows(d_logits.as<float>(), n, vocab, d_params.as<GpuSamplingParams>(), d_sampled->as<int32_t>(),
                        d_logprobs->as<float>(), nullptr), cudaSuccess);
  ASSERT_EQ(restore_penalized(d_logits.as<float>(), vocab, d_rows.as<GpuPenaltyRow>(), n,
                              d_tokens.as<GpuPenaltyToken>(), nullptr), cudaSuccess);
  ASSERT_EQ(score_rows(d_logits.as<float>(), vocab, d_requests.as<GpuScoreRequest>(), n, d_scores->as<GpuRowScore>(),
                       nullptr, d_sampled->as<int32_t>()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> restored = to_host<float>(d_logits, logits.size());
  const std::vector<int32_t> drawn = to_host<int32_t>(*d_sampled, cases.size());
  const std::vector<GpuRowScore> scores = to_host<GpuRowScore>(*d_scores, cases.size());

  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " case " << i);
    const std::vector<float> want = cpu_penalized(cases[i]);
    size_t differing = 0;
    for (size_t t = 0; t < want.size(); ++t) {
      const float got = penalized[i * static_cast<size_t>(vocab) + t];
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want[t])) << "token " << t;
      differing += got != cases[i].row[t] ? 1 : 0;
      ASSERT_EQ(std::bit_cast<uint32_t>(restored[i * static_cast<size_t>(vocab) + t]),
                std::bit_cast<uint32_t>(cases[i].row[t])) << "restored token " << t;
    }
    EXPECT_GT(differing, 100u) << "the case penalizes";
    std::mt19937_64 rng(0);
    const engine::SampledToken cpu = engine::Sampler::sample(cases[i].row, cases[i].params, cases[i].history, rng);
    EXPECT_EQ(drawn[i], cpu.token);
    const engine::SamplingParams& p = cases[i].params;
    if (p.repetition_penalty >= 1.0f && p.frequency_penalty >= 0.0f && p.presence_penalty >= 0.0f) {
      engine::SamplingParams greedy;
      greedy.temperature = 0.0f;
      EXPECT_NE(cpu.token, engine::Sampler::sample(cases[i].row, greedy, {}, rng).token)
          << "the penalties move the greedy token";
    }
    EXPECT_NEAR(scores[i].logprob, cpu.logprob, 1e-5) << "the raw row's logprob";
    ASSERT_EQ(scores[i].top_count, static_cast<int32_t>(cpu.top_logprobs.size()));
    for (int32_t k = 0; k < scores[i].top_count; ++k) {
      EXPECT_EQ(scores[i].top_tokens[k], cpu.top_logprobs[static_cast<size_t>(k)].token) << k;
      EXPECT_NEAR(scores[i].top_logprobs[k], cpu.top_logprobs[static_cast<size_t>(k)].logprob, 1e-5) << k;
    }
  }
}

TEST(GpuPenalties, TheCpuSamplersPenaltiesDrawAndScoresAtTheLlama3Vocabulary) {
  PAGODA_SKIP_WITHOUT_GPU();
  expect_cpu_sampler(cases_for(128256, 3), 128256, 2);
}

TEST(GpuPenalties, TheCpuSamplersPenaltiesDrawAndScoresAtASmallVocabulary) {
  PAGODA_SKIP_WITHOUT_GPU();
  expect_cpu_sampler(cases_for(1000, 4), 1000, 0);
}

// A drawn token's score (score_rows with token -1) is the given-token score of the same token.
TEST(GpuPenalties, ADrawnTokensScoreIsTheScoreOfThatToken) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t vocab = 5003, rows = 3;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(vocab) * rows);
  for (float& v : logits) v = normal(rng);
  const std::vector<int32_t> drawn = {17, 4000, 5002};
  std::vector<GpuScoreRequest> requests;
  for (int32_t r = 0; r < rows; ++r) {
    requests.push_back({r, -1, 7});
    requests.push_back({r, drawn[static_cast<size_t>(r)], 7});
  }
  DeviceBuffer d_logits = to_device(logits), d_requests = to_device(requests), d_drawn = to_device(drawn);
  auto d_scores = DeviceBuffer::allocate(requests.size() * sizeof(GpuRowScore));
  ASSERT_TRUE(d_scores.ok());
  ASSERT_EQ(score_rows(d_logits.as<float>(), vocab, d_requests.as<GpuScoreRequest>(),
                       static_cast<int32_t>(requests.size()), d_scores->as<GpuRowScore>(), nullptr,
                       d_drawn.as<int32_t>()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<GpuRowScore> s = to_host<GpuRowScore>(*d_scores, requests.size());
  for (int32_t r = 0; r < rows; ++r) {
    const GpuRowScore &a = s[2 * static_cast<size_t>(r)], &b = s[2 * static_cast<size_t>(r) + 1];
    EXPECT_EQ(a.logprob, b.logprob);
    EXPECT_EQ(a.rank, b.rank);
    ASSERT_EQ(a.top_count, 7);
    for (int32_t k = 0; k < 7; ++k) EXPECT_EQ(a.top_tokens[k], b.top_tokens[k]);
  }
}

}  // namespace
}  // namespace pagoda::cuda
