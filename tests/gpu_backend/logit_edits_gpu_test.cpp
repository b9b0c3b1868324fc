// Logit rules and penalties on the GPU (backend/cuda/sampling.h: apply_logit_edits,
// restore_logit_edits, score_rows with token -1) against the CPU (engine::apply_logit_rules and
// engine::Sampler) on the same rows and contexts: the edited logits bit for bit, the greedy draw over
// them the CPU sampler's token, the row restored bit for bit after the draw, and the drawn token's
// score (logprob, top tokens) that of the raw row, as the CPU sampler reports it. Vocabularies of
// 128,256 and 1,000; repetition above and below 1, frequency and presence with repeated output tokens,
// negative penalties, logit_bias (up, down, -100 on a banned token), bad words, min_tokens over eos
// and stop ids, ids outside the vocabulary (skipped) and -inf logits.

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/sampling.h"
#include "pagoda/engine/logit_rules.h"
#include "pagoda/engine/sampler.h"

namespace pagoda::cuda {
namespace {

using testing::to_device;
using testing::to_host;

struct EditCase {
  std::vector<float> row;
  engine::SamplingParams params;  // temperature 0: the greedy draw
  std::vector<int32_t> prompt, output, eos;
  engine::TokenHistory history;   // of prompt and output
  engine::LogitRuleContext context() const { return {output, eos}; }
};

// The edits as the engine lists them (Engine::fill_logit_edits): one per token the rules or penalties touch.
std::vector<GpuLogitEdit> listed(const EditCase& c) {
  std::vector<GpuLogitEdit> out;
  std::unordered_map<int32_t, size_t> at;
  auto entry = [&](int32_t t) -> GpuLogitEdit& {
    const auto [it, fresh] = at.try_emplace(t, out.size());
    if (fresh) out.push_back(GpuLogitEdit{t, 0, 0.0f, 0u, 0.0f});
    return out[it->second];
  };
  for (int32_t t : engine::banned_tokens(c.params, c.context())) entry(t).flags |= kLogitEditBanned;
  for (const auto& [t, b] : c.params.logit_bias) {
    entry(t).flags |= kLogitEditBiased;
    entry(t).bias = b;
  }
  if (c.params.repetition_penalty != 1.0f)
    for (const auto& [t, n] : c.history.prompt_counts) entry(t).flags |= kLogitEditSeen;
  for (const auto& [t, n] : c.history.output_counts) {
    entry(t).flags |= kLogitEditSeen;
    entry(t).output_count = n;
  }
  return out;
}

// Each case's best eight tokens are set 0.1 apart, and all but the sixth are in its prompt or output,
// so penalties and rules move the argmax; rules as `rules` says: 0 none, 1 logit_bias, 2 a bad word,
// 3 min_tokens over eos and a stop id.
std::vector<EditCase> cases_for(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<EditCase> out;
  struct Setting {
    float repetition, frequency, presence;
    int rules;
  };
  const Setting settings[] = {{1.3f, 0.0f, 0.0f, 0}, {0.7f, 0.0f, 0.0f, 1}, {1.0f, 0.8f, 0.0f, 2},
                              {1.0f, 0.0f, 1.5f, 3}, {1.6f, 1.5f, 0.4f, 1}, {1.0f, -0.5f, -1.0f, 0},
                              {1.0f, 0.0f, 0.0f, 1}, {1.0f, 0.0f, 0.0f, 2}, {1.2f, 0.3f, 0.0f, 3}};
  for (const Setting& s : settings) {
    EditCase c;
    c.row.resize(static_cast<size_t>(vocab));
    for (float& v : c.row) v = normal(rng);
    for (int32_t j = 5; j < vocab; j += 97) c.row[static_cast<size_t>(j)] = -std::numeric_limits<float>::infinity();
    c.params.temperature = 0.0f;
    c.params.repetition_penalty = s.repetition;
    c.params.frequency_penalty = s.frequency;
    c.params.presence_penalty = s.presence;
    c.params.logprobs = 5;
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + 8, order.end(), [&](int32_t a, int32_t b) {
      return c.row[static_cast<size_t>(a)] > c.row[static_cast<size_t>(b)];
    });
    // The best eight 0.1 apart (same order), so an edit of the best decides the argmax at any vocabulary.
    for (int i = 1; i < 8; ++i)
      c.row[static_cast<size_t>(order[static_cast<size_t>(i)])] = c.row[static_cast<size_t>(order[0])] - 0.1f * i;
    // Random ids other than the best eight, whose membership below is what the checks rely on.
    auto other_id = [&] {
      for (;;) {
        const int32_t t = id(rng);
        if (std::find(order.begin(), order.begin() + 8, t) == order.begin() + 8) return t;
      }
    };
    for (int i = 0; i < std::min(300, vocab / 20); ++i) c.prompt.push_back(other_id());
    for (int i = 0; i < std::min(40, vocab / 50); ++i) c.output.push_back(other_id());
    for (int i = 0; i < 8; ++i) {
      const int32_t t = order[static_cast<size_t>(i)];
      if (i % 2 == 0) c.prompt.push_back(t);
      for (int k = 0; k < (i % 3 == 2 ? 0 : 1 + i % 4); ++k) c.output.push_back(t);  // counts up to 4
    }
    c.output.push_back(5);  // a -inf logit stays -inf
    c.output.push_back(order[6]);
    c.history.add_prompt(c.prompt);
    for (int32_t t : c.output) c.history.add_output(t);
    c.eos = {order[1], vocab + 3};  // one outside the vocabulary
    if (s.rules == 1) c.params.logit_bias = {{order[0], -100.0f}, {order[3], 2.5f}, {order[7], -0.75f}, {9, 1.0f}};
    if (s.rules == 2) c.params.bad_words_ids = {{order[0]}, {order[6], order[2]}, {order[3], order[4]}};
    if (s.rules == 3) {
      c.params.min_tokens = 100;
      c.params.stop_token_ids = {order[2]};
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The CPU's edited row: apply_logit_rules, then engine::Sampler::sample's penalty arithmetic, written out.
std::vector<float> cpu_edited(const EditCase& c) {
  std::vector<float> v = c.row;
  engine::apply_logit_rules(v, c.params, c.context());
  const engine::SamplingParams& p = c.params;
  auto scale = [&](int32_t t) { v[t] = v[t] > 0 ? v[t] / p.repetition_penalty : v[t] * p.repetition_penalty; };
  if (p.repetition_penalty != 1.0f) {
    for (const auto& [t, n] : c.history.prompt_counts) scale(t);
    for (const auto& [t, n] : c.history.output_counts)
      if (!c.history.prompt_counts.contains(t)) scale(t);
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    for (const auto& [t, n] : c.history.output_counts)
      v[t] -= p.frequency_penalty * static_cast<float>(n) + p.presence_penalty;
  return v;
}

void expect_cpu_sampler(const std::vector<EditCase>& cases, int32_t vocab, int32_t extra_ids) {
  std::vector<float> logits;
  std::vector<GpuLogitEditRow> rows;
  std::vector<GpuLogitEdit> edits;
  std::vector<GpuSamplingParams> params(cases.size());
  std::vector<GpuScoreRequest> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    logits.insert(logits.end(), cases[i].row.begin(), cases[i].row.end());
    std::vector<GpuLogitEdit> list = listed(cases[i]);
    for (int32_t j = 0; j < extra_ids; ++j) list.push_back({vocab + j, 1, 1.0f, kLogitEditSeen, 0.0f});  // skipped
    list.push_back({-1, 1, 0.0f, kLogitEditBanned, 0.0f});
    const engine::SamplingParams& p = cases[i].params;
    rows.push_back({static_cast<int32_t>(i), static_cast<int32_t>(edits.size()), static_cast<int32_t>(list.size()),
                    p.repetition_penalty, p.frequency_penalty, p.presence_penalty});
    edits.insert(edits.end(), list.begin(), list.end());
    requests.push_back({static_cast<int32_t>(i), -1, *p.logprobs});
  }
  DeviceBuffer d_logits = to_device(logits), d_rows = to_device(rows), d_edits = to_device(edits);
  DeviceBuffer d_params = to_device(params), d_requests = to_device(requests);
  auto d_sampled = DeviceBuffer::allocate(cases.size() * sizeof(int32_t));
  auto d_logprobs = DeviceBuffer::allocate(cases.size() * sizeof(float));
  auto d_scores = DeviceBuffer::allocate(cases.size() * sizeof(GpuRowScore));
  ASSERT_TRUE(d_sampled.ok() && d_logprobs.ok() && d_scores.ok());
  const int32_t n = static_cast<int32_t>(cases.size());
  ASSERT_EQ(apply_logit_edits(d_logits.as<float>(), vocab, d_rows.as<GpuLogitEditRow>(), n, d_edits.as<GpuLogitEdit>(),
                              nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> edited = to_host<float>(d_logits, logits.size());
  ASSERT_EQ(sample_rows(d_logits.as<float>(), n, vocab, d_params.as<GpuSamplingParams>(), d_sampled->as<int32_t>(),
                        d_logprobs->as<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(restore_logit_edits(d_logits.as<float>(), vocab, d_rows.as<GpuLogitEditRow>(), n,
                                d_edits.as<GpuLogitEdit>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(score_rows(d_logits.as<float>(), vocab, d_requests.as<GpuScoreRequest>(), n, d_scores->as<GpuRowScore>(),
                       nullptr, d_sampled->as<int32_t>()),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> restored = to_host<float>(d_logits, logits.size());
  const std::vector<int32_t> drawn = to_host<int32_t>(*d_sampled, cases.size());
  const std::vector<GpuRowScore> scores = to_host<GpuRowScore>(*d_scores, cases.size());

  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " case " << i);
    const std::vector<float> want = cpu_edited(cases[i]);
    size_t differing = 0;
    for (size_t t = 0; t < want.size(); ++t) {
      const float got = edited[i * static_cast<size_t>(vocab) + t];
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want[t])) << "token " << t;
      differing += got != cases[i].row[t] ? 1 : 0;
      ASSERT_EQ(std::bit_cast<uint32_t>(restored[i * static_cast<size_t>(vocab) + t]),
                std::bit_cast<uint32_t>(cases[i].row[t]))
          << "restored token " << t;
    }
    EXPECT_GT(differing, 0u) << "the case edits";
    std::mt19937_64 rng(0);
    const engine::LogitRuleContext context = cases[i].context();
    const engine::SampledToken cpu =
        engine::Sampler::sample(cases[i].row, cases[i].params, cases[i].history, rng, &context);
    EXPECT_EQ(drawn[i], cpu.token);
    const engine::SamplingParams& p = cases[i].params;
    if (p.repetition_penalty >= 1.0f && p.frequency_penalty >= 0.0f && p.presence_penalty >= 0.0f) {
      engine::SamplingParams greedy;
      greedy.temperature = 0.0f;
      EXPECT_NE(cpu.token, engine::Sampler::sample(cases[i].row, greedy, {}, rng).token) << "the edits move the token";
    }
    EXPECT_NEAR(scores[i].logprob, cpu.logprob, 1e-5) << "the raw row's logprob";
    ASSERT_EQ(scores[i].top_count, static_cast<int32_t>(cpu.top_logprobs.size()));
    for (int32_t k = 0; k < scores[i].top_count; ++k) {
      EXPECT_EQ(scores[i].top_tokens[k], cpu.top_logprobs[static_cast<size_t>(k)].token) << k;
      EXPECT_NEAR(scores[i].top_logprobs[k], cpu.top_logprobs[static_cast<size_t>(k)].logprob, 1e-5) << k;
    }
  }
}

TEST(GpuLogitEdits, TheCpuRulesPenaltiesDrawAndScoresAtTheLlama3Vocabulary) {
  PAGODA_SKIP_WITHOUT_GPU();
  expect_cpu_sampler(cases_for(128256, 3), 128256, 2);
}

TEST(GpuLogitEdits, TheCpuRulesPenaltiesDrawAndScoresAtASmallVocabulary) {
  PAGODA_SKIP_WITHOUT_GPU();
  expect_cpu_sampler(cases_for(1000, 4), 1000, 0);
}

// A drawn token's score (score_rows with token -1) is the given-token score of the same token.
TEST(GpuLogitEdits, ADrawnTokensScoreIsTheScoreOfThatToken) {
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
                       d_drawn.as<int32_t>()),
            cudaSuccess);
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
