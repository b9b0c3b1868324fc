#include "pagoda/engine/sampler.h"

#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "pagoda/engine/sampling_params.h"

namespace pagoda::engine {
namespace {

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(SamplerTest, GreedyPicksArgmax) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -3.0f};
  std::mt19937_64 rng(1);
  EXPECT_EQ(Sampler::sample(logits, greedy(), {}, rng).token, 1);
}

TEST(SamplerTest, SeededSamplingIsReproducibleAndFollowsTheDistribution) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  std::mt19937_64 a(42), b(42);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 4000; ++i) {
    int32_t ta = Sampler::sample(logits, p, {}, a).token;
    ASSERT_EQ(ta, Sampler::sample(logits, p, {}, b).token);
    ++counts[ta];
  }
  EXPECT_NEAR(counts[0] / 4000.0, 0.5, 0.04);
  EXPECT_NEAR(counts[1] / 4000.0, 0.3, 0.04);
  EXPECT_NEAR(counts[2] / 4000.0, 0.2, 0.04);
}

TEST(SamplerTest, TopKOneTopPTinyAndMinPNearOneAreGreedy) {
  std::vector<float> logits = {0.0f, 1.0f, 0.9f, 0.8f};
  std::mt19937_64 rng(7);
  SamplingParams k;
  k.top_k = 1;
  SamplingParams p;
  p.top_p = 0.01f;
  SamplingParams m;
  m.min_p = 0.99f;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(Sampler::sample(logits, k, {}, rng).token, 1);
    EXPECT_EQ(Sampler::sample(logits, p, {}, rng).token, 1);
    EXPECT_EQ(Sampler::sample(logits, m, {}, rng).token, 1);
  }
}

TEST(SamplerTest, TopKTwoNeverPicksOthers) {
  std::vector<float> logits = {0.0f, 1.0f, 0.9f, 0.8f, 0.7f};
  SamplingParams p;
  p.top_k = 2;
  p.temperature = 5.0f;  // flatten so the tail would show up without the cut
  std::mt19937_64 rng(3);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 1000; ++i) ++counts[Sampler::sample(logits, p, {}, rng).token];
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
}

TEST(SamplerTest, RepetitionPenaltyMovesAwayFromSeenTokens) {
  std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  TokenHistory history;
  std::vector<int32_t> prompt = {0};
  history.add_prompt(prompt);
  SamplingParams p = greedy();
  p.repetition_penalty = 1.5f;  // 2.0 / 1.5 = 1.33 < 1.9
  std::mt19937_64 rng(1);
  EXPECT_EQ(Sampler::sample(logits, p, history, rng).token, 1);
  p.repetition_penalty = 1.0f;
  EXPECT_EQ(Sampler::sample(logits, p, history, rng).token, 0);
}

TEST(SamplerTest, FrequencyAndPresencePenaltiesCountOutputOnly) {
  std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  TokenHistory history;
  std::vector<int32_t> prompt = {0, 0, 0};
  history.add_prompt(prompt);
  SamplingParams p = greedy();
  p.frequency_penalty = 0.3f;
  std::mt19937_64 rng(1);
  EXPECT_EQ(Sampler::sample(logits, p, history, rng).token, 0) << "prompt tokens are not penalized";
  history.add_output(0);
  EXPECT_EQ(Sampler::sample(logits, p, history, rng).token, 0);  // 2.0 - 0.3 > 1.5
  history.add_output(0);
  EXPECT_EQ(Sampler::sample(logits, p, history, rng).token, 1);  // 2.0 - 0.6 < 1.5
  SamplingParams presence = greedy();
  presence.presence_penalty = 0.6f;
  TokenHistory once;
  once.add_output(0);
  EXPECT_EQ(Sampler::sample(logits, presence, once, rng).token, 1);
}

TEST(SamplerTest, LogprobsAreRawLogSoftmaxBestFirst) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  SamplingParams p = greedy();
  p.logprobs = 3;
  p.temperature = 0.0f;
  std::mt19937_64 rng(1);
  SampledToken t = Sampler::sample(logits, p, {}, rng);
  double z = 0;
  for (float v : logits) z += std::exp(v);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].token, 1);
  EXPECT_EQ(t.top_logprobs[1].token, 2);
  EXPECT_EQ(t.top_logprobs[2].token, 0);
  EXPECT_NEAR(t.top_logprobs[0].logprob, 3.0 - std::log(z), 1e-5);
  EXPECT_NEAR(t.logprob, t.top_logprobs[0].logprob, 1e-6);
}

TEST(SamplerTest, AllMaskedFallsBackToRawArgmax) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {-inf, -inf, -inf};
  SamplingParams p;
  std::mt19937_64 rng(1);
  int32_t t = Sampler::sample(logits, p, {}, rng).token;
  EXPECT_GE(t, 0);
  EXPECT_LT(t, 3);
}

TEST(SamplingParamsTest, RejectsBadValuesNamingTheField) {
  auto check = [](auto mutate, const std::string& field) {
    SamplingParams p;
    mutate(p);
    Status s = validate_sampling_params(p, 100);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  check([](SamplingParams& p) { p.temperature = -1; }, "temperature");
  check([](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature");
  check([](SamplingParams& p) { p.top_p = 0; }, "top_p");
  check([](SamplingParams& p) { p.top_p = std::nanf(""); }, "top_p");
  check([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  check([](SamplingParams& p) { p.min_p = 1.5f; }, "min_p");
  check([](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty");
  check([](SamplingParams& p) { p.frequency_penalty = 3; }, "frequency_penalty");
  check([](SamplingParams& p) { p.presence_penalty = -3; }, "presence_penalty");
  check([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  check([](SamplingParams& p) { p.n = 0; }, "n must");
  check([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  check([](SamplingParams& p) { p.stop = {""}; }, "stop");
  check([](SamplingParams& p) { p.stop_token_ids = {100}; }, "stop_token_ids");
  EXPECT_TRUE(validate_sampling_params(SamplingParams{}, 100).ok());
}

}  // namespace
}  // namespace pagoda::engine

namespace pagoda::engine {
namespace {

TEST(ScoreTokenTest, GivesTheLogSoftmaxTheRankAndTheTopAlternatives) {
  const std::vector<float> row = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  double z = 0.0;
  for (float v : row) z += std::exp(static_cast<double>(v));
  const SampledToken s = score_token(row, 2, 3);
  EXPECT_EQ(s.token, 2);
  EXPECT_NEAR(s.logprob, 2.0 - std::log(z), 1e-6);
  EXPECT_EQ(s.rank, 3) << "two tokens are more likely";
  ASSERT_EQ(s.top_logprobs.size(), 3u);
  EXPECT_EQ(s.top_logprobs[0].token, 1) << "ties to the lower id";
  EXPECT_EQ(s.top_logprobs[1].token, 3);
  EXPECT_EQ(s.top_logprobs[2].token, 2);
  EXPECT_NEAR(s.top_logprobs[0].logprob, 3.0 - std::log(z), 1e-6);
  EXPECT_EQ(score_token(row, 3, 0).rank, 2) << "a tie ranks below (vLLM counts logprobs >= the token's)";
  EXPECT_EQ(score_token(row, 1, 0).rank, 2);
  EXPECT_EQ(score_token(row, 4, 0).rank, 5);
  EXPECT_TRUE(score_token(row, 4, 0).top_logprobs.empty());
  EXPECT_EQ(score_token(row, 0, 9).top_logprobs.size(), 5u) << "at most the vocabulary";
}

}  // namespace
}  // namespace pagoda::engine
