// A request's logit rules (engine/logit_rules.h) on single rows and through the
// sampler: allowed_token_ids, bad_words, min_tokens, logit_bias, their order,
// that logprobs still describe the model, and their validation.

#include "pagoda/engine/logit_rules.h"

#include <cmath>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "pagoda/engine/sampler.h"

namespace pagoda::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> row() { return {0.5f, 3.0f, 2.0f, 1.0f, -1.0f, 2.5f}; }

TEST(LogitRules, AllowedTokenIdsKeepOnlyThoseLogits) {
  SamplingParams p;
  p.allowed_token_ids = {2, 4};
  std::vector<float> l = row();
  apply_logit_rules(l, p, {});
  EXPECT_EQ(l, (std::vector<float>{kNegInf, kNegInf, 2.0f, kNegInf, -1.0f, kNegInf}));
}

TEST(LogitRules, BadWordBansItsLastTokenWhereTheOutputEndsWithTheRest) {
  SamplingParams p;
  p.bad_words_ids = {{3, 1}, {5}};
  const std::vector<int32_t> after_3 = {0, 3}, after_2 = {0, 2}, none = {};
  std::vector<float> l = row();
  apply_logit_rules(l, p, {after_3, {}});
  EXPECT_EQ(l[1], kNegInf) << "3 then 1 is a bad word";
  EXPECT_EQ(l[5], kNegInf) << "a one-token bad word is banned everywhere";
  EXPECT_EQ(l[3], 1.0f);
  l = row();
  apply_logit_rules(l, p, {after_2, {}});
  EXPECT_EQ(l[1], 3.0f) << "the output does not end with 3";
  EXPECT_EQ(l[5], kNegInf);
  l = row();
  apply_logit_rules(l, p, {none, {}});
  EXPECT_EQ(l[1], 3.0f) << "no output yet: only one-token words apply";
}

TEST(LogitRules, MinTokensBansEosAndStopIdsUntilReached) {
  SamplingParams p;
  p.max_tokens = 8;
  p.min_tokens = 2;
  p.stop_token_ids = {2};
  const std::vector<int32_t> eos = {1}, one = {4}, two = {4, 4};
  std::vector<float> l = row();
  apply_logit_rules(l, p, {one, eos});
  EXPECT_EQ(l[1], kNegInf);
  EXPECT_EQ(l[2], kNegInf);
  l = row();
  apply_logit_rules(l, p, {two, eos});
  EXPECT_EQ(l, row()) << "min_tokens reached";
  p.ignore_eos = true;
  l = row();
  apply_logit_rules(l, p, {one, eos});
  EXPECT_EQ(l[1], 3.0f) << "with ignore_eos an eos id does not end the output, so it is not banned";
  EXPECT_EQ(l[2], kNegInf);
  EXPECT_TRUE(logit_rules_apply(p, 1));
  EXPECT_FALSE(logit_rules_apply(p, 2));
  EXPECT_FALSE(logit_rules_apply(SamplingParams{}, 0));
}

TEST(LogitRules, BiasIsAddedAfterTheMasks) {
  SamplingParams p;
  p.allowed_token_ids = {0, 3};
  p.logit_bias = {{0, 10.0f}, {1, 100.0f}, {3, -100.0f}};
  std::vector<float> l = row();
  apply_logit_rules(l, p, {});
  EXPECT_EQ(l[0], 10.5f);
  EXPECT_EQ(l[1], kNegInf) << "a bias does not bring back a token the allowed set left out";
  EXPECT_EQ(l[3], -99.0f);
}

TEST(LogitRules, SamplerDrawsUnderTheRulesAndReportsTheModelsLogprobs) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 2;
  greedy.logit_bias = {{4, 5.0f}};
  const std::vector<float> raw = row();
  std::mt19937_64 rng(3);
  const LogitRuleContext context;
  SampledToken t = Sampler::sample(raw, greedy, {}, rng, &context);
  EXPECT_EQ(t.token, 4) << "-1 + 5 beats 3";
  double z = 0.0;
  for (float v : raw) z += std::exp(double(v));
  EXPECT_NEAR(t.logprob, -1.0 - std::log(z), 1e-5) << "the logprob is the raw row's";
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[0].token, 1) << "top logprobs describe the model, not the bias";
  EXPECT_EQ(Sampler::sample(raw, greedy, {}, rng, nullptr).token, 1) << "no context: no rules";

  SamplingParams drawn;
  drawn.temperature = 1.5f;
  drawn.allowed_token_ids = {0, 4, 5};
  drawn.bad_words_ids = {{5}};
  for (int i = 0; i < 300; ++i) {
    const int32_t token = Sampler::sample(raw, drawn, {}, rng, &context).token;
    EXPECT_TRUE(token == 0 || token == 4) << token;
  }
}

TEST(LogitRules, EveryTokenBannedFallsBackToTheRawArgmax) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.allowed_token_ids = {2};
  p.bad_words_ids = {{2}};
  std::mt19937_64 rng(1);
  const LogitRuleContext context;
  EXPECT_EQ(Sampler::sample(row(), p, {}, rng, &context).token, 1);
  p.temperature = 1.0f;
  EXPECT_EQ(Sampler::sample(row(), p, {}, rng, &context).token, 1);
}

TEST(LogitRules, ValidationNamesTheField) {
  auto message = [](const SamplingParams& p) { return validate_sampling_params(p, 6).message(); };
  SamplingParams p;
  p.allowed_token_ids = {6};
  EXPECT_EQ(message(p).rfind("allowed_token_ids: 6 is outside the vocabulary [0, 6)", 0), 0u) << message(p);
  p = {};
  p.bad_words_ids = {{}};
  EXPECT_EQ(message(p).rfind("bad_words:", 0), 0u) << message(p);
  p.bad_words_ids = {{1, -1}};
  EXPECT_EQ(message(p).rfind("bad_words: token -1", 0), 0u) << message(p);
  p = {};
  p.max_tokens = 4;
  p.min_tokens = 5;
  EXPECT_EQ(message(p).rfind("min_tokens must be in [0, max_tokens = 4], got 5", 0), 0u) << message(p);
  p = {};
  p.logit_bias = {{1, 100.5f}};
  EXPECT_EQ(message(p).rfind("logit_bias: the bias of token 1", 0), 0u) << message(p);
  p.logit_bias = {{1, std::nanf("")}};
  EXPECT_EQ(message(p).rfind("logit_bias: the bias of token 1", 0), 0u) << message(p);
  p.logit_bias = {{7, 1.0f}};
  EXPECT_EQ(message(p).rfind("logit_bias: token 7 is outside", 0), 0u) << message(p);
  p.logit_bias = {{3, 1.0f}, {1, 1.0f}, {3, -1.0f}};
  EXPECT_EQ(message(p), "logit_bias: token 3 is given twice");
  p.logit_bias = {{3, 1.0f}, {1, -100.0f}};
  EXPECT_TRUE(validate_sampling_params(p, 6).ok());
}

}  // namespace
}  // namespace pagoda::engine
