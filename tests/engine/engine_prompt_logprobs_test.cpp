// sampling.prompt_logprobs through the engine: every prompt token after the
// first comes back scored by the model's row for the tokens before it (the
// fake model's logits are a function of the context read back from the KV
// pool, so a wrong position or stale KV shows), whatever the prefix cache
// holds, however the prompt is chunked, and across a preemption in mid-prompt;
// each case twice: the rows' logits scored by the engine, and the rows scored
// by the runner where the logits are (RunnerCapabilities::scores_on_device).

#include <algorithm>

#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing_support::Collected;
using testing_support::drain;
using testing_support::run_request;
using testing_support::Harness;
using testing_support::test_prompt;

GenerationRequest scored(std::vector<int32_t> prompt, int32_t max_tokens, int32_t k) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.prompt_logprobs = k;
  return r;
}

// What the model says of prompt token j given tokens [0, j), for j = 1 .. size - 1.
std::vector<SampledToken> expected_scores(const std::vector<int32_t>& prompt, int32_t k) {
  std::vector<SampledToken> out;
  std::vector<float> row(64);
  for (size_t j = 1; j < prompt.size(); ++j) {
    testing::FakeModelRunner::fill_logits(std::span<const int32_t>(prompt.data(), j), 64, row.data());
    out.push_back(score_token(row, prompt[j], k));
  }
  return out;
}

class EnginePromptLogprobs : public ::testing::TestWithParam<bool> {};

void expect_same_scores(const std::vector<SampledToken>& got, const std::vector<SampledToken>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << i;
    EXPECT_EQ(got[i].logprob, want[i].logprob) << i;
    EXPECT_EQ(got[i].rank, want[i].rank) << i;
    ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << i;
    for (size_t t = 0; t < got[i].top_logprobs.size(); ++t) {
      EXPECT_EQ(got[i].top_logprobs[t].token, want[i].top_logprobs[t].token) << i << " " << t;
      EXPECT_EQ(got[i].top_logprobs[t].logprob, want[i].top_logprobs[t].logprob) << i << " " << t;
    }
  }
}

TEST_P(EnginePromptLogprobs, ScoresEveryPromptTokenAfterTheFirstAndStillGenerates) {
  Harness h(128, 4);
  h.runner.device_scoring = GetParam();
  const std::vector<int32_t> prompt = test_prompt(23, 1);
  const Collected c = run_request(h, scored(prompt, 5, 3));
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 3));
  EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompt, 5)) << "the output is what it is without scoring";
  EXPECT_EQ(h.runner.num_scored_rows, GetParam() ? 22 : 0) << "the runner scores exactly the prompt's 22 rows";
  for (const SampledToken& s : c.prompt_logprobs) {
    EXPECT_GE(s.rank, 1);
    EXPECT_LE(s.logprob, 0.0f);
  }
  // The fake model's winner for most contexts is not the next prompt token: some rank below 1.
  EXPECT_TRUE(
      std::any_of(c.prompt_logprobs.begin(), c.prompt_logprobs.end(), [](const auto& s) { return s.rank > 1; }));
}

TEST_P(EnginePromptLogprobs, MaxTokensZeroScoresThePromptAlone) {
  Harness h(128, 4);
  h.runner.device_scoring = GetParam();
  const std::vector<int32_t> prompt = test_prompt(10, 2);
  const Collected c = run_request(h, scored(prompt, 0, 0));
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 0));
  EXPECT_TRUE(c.tokens[0].empty());
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EXPECT_EQ(c.usage.completion_tokens, 0);
  EXPECT_EQ(h.kv->num_available_blocks(), h.kv->num_blocks()) << "nothing held after the request";

  GenerationRequest plain = scored(prompt, 0, 0);
  plain.sampling.prompt_logprobs.reset();
  EXPECT_FALSE(h.engine->submit(plain).ok()) << "max_tokens 0 without prompt_logprobs is refused";
}

TEST_P(EnginePromptLogprobs, ThePrefixCacheIsNotReadButIsFilled) {
  Harness h(128, 4);
  h.runner.device_scoring = GetParam();
  const std::vector<int32_t> prompt = test_prompt(21, 3);
  GenerationRequest warm;
  warm.prompt_tokens = prompt;
  warm.sampling.temperature = 0.0f;
  warm.sampling.max_tokens = 2;
  run_request(h, warm);
  const Collected c = run_request(h, scored(prompt, 2, 1));
  EXPECT_EQ(c.usage.cached_tokens, 0) << "a scored prompt computes every position";
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 1));
  // The scored request's blocks were cached as written: a plain request after it hits them.
  const Collected again = run_request(h, warm);
  EXPECT_EQ(again.usage.cached_tokens, 20);
  EXPECT_GT(h.kv->stats().miss_tokens_by_reason[static_cast<int>(kv::MissReason::kNotRead)], 0);
  EXPECT_EQ(h.runner.num_scored_rows > 0, GetParam());
}

TEST_P(EnginePromptLogprobs, ALongPromptTakesShortStepsOfRows) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 64;
  sched.max_prompt_rows_per_step = 5;
  Harness h(14, 4, sched);
  h.runner.device_scoring = GetParam();
  const std::vector<int32_t> prompt = test_prompt(37, 4);
  GenerationRequest other;
  other.prompt_tokens = test_prompt(9, 5);
  other.sampling.temperature = 0.0f;
  other.sampling.max_tokens = 12;
  auto s1 = h.engine->submit(scored(prompt, 3, 2));
  auto s2 = h.engine->submit(other);
  ASSERT_TRUE(s1.ok() && s2.ok());
  h.run_checked();
  const Collected c = drain(**s1);
  const Collected o = drain(**s2);
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 2));
  EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompt, 3));
  EXPECT_EQ(o.tokens[0], h.runner.reference_greedy(other.prompt_tokens, 12));
  EXPECT_GE(h.runner.num_executes, 37 / 5) << "the scored prompt ran in chunks of at most 5";
  EXPECT_EQ(h.runner.num_scored_rows > 0, GetParam());
}

TEST_P(EnginePromptLogprobs, APreemptionInMidPromptNeitherLosesNorRepeatsScores) {
  // Blocks of 4: the first request (earlier, so never the victim) grows by decoding until
  // the scored prompt's blocks are needed, which preempts it mid-prompt (recompute). Steps
  // of 5 tokens: rows of 4 a step beside the other's decode; the recompute, once that one is
  // done, takes 5 a step, so it must stop where the rows that went out end.
  SchedulerConfig sched;
  sched.max_tokens_per_step = 5;
  sched.max_prompt_rows_per_step = 4;
  Harness h(14, 4, sched);
  h.runner.device_scoring = GetParam();
  GenerationRequest first;
  first.prompt_tokens = test_prompt(8, 6);
  first.sampling.temperature = 0.0f;
  first.sampling.max_tokens = 40;
  first.sampling.ignore_eos = true;
  const std::vector<int32_t> prompt = test_prompt(40, 7);
  auto s1 = h.engine->submit(first);
  auto s2 = h.engine->submit(scored(prompt, 1, 2));
  ASSERT_TRUE(s1.ok() && s2.ok());
  h.run_checked();
  EXPECT_GT(h.engine->stats().preemptions, 0) << "the test must preempt to test that";
  const Collected c = drain(**s2);
  ASSERT_TRUE(c.finished);
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 2));
  EXPECT_EQ(drain(**s1).tokens[0].size(), 40u);
  EXPECT_EQ(h.runner.num_scored_rows > 0, GetParam());
}

TEST_P(EnginePromptLogprobs, ForkedChoicesRecomputedDoNotScoreThePromptAgain) {
  // n = 2 in a pool too small for both outputs: a choice is preempted and recomputes the prompt.
  Harness h(10, 4);
  h.runner.device_scoring = GetParam();
  const std::vector<int32_t> prompt = test_prompt(12, 8);
  GenerationRequest r = scored(prompt, 20, 1);
  r.sampling.n = 2;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 5;
  r.sampling.ignore_eos = true;
  auto stream = h.engine->submit(r);
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  h.run_checked();
  EXPECT_GT(h.engine->stats().preemptions, 0) << "the test must preempt to test that";
  const Collected c = drain(**stream, 2);
  ASSERT_TRUE(c.finished) << h.engine->stats().num_running << " running, " << h.engine->stats().num_waiting
                          << " waiting; " << c.tokens[0].size() << " + " << c.tokens[1].size() << " tokens";
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 1));
  EXPECT_EQ(c.tokens[0].size(), 20u);
  EXPECT_EQ(c.tokens[1].size(), 20u);
  EXPECT_EQ(h.runner.num_scored_rows > 0, GetParam());
}

TEST_P(EnginePromptLogprobs, RawPromptLogitsComeBackAsRowsWhateverTheRunnerScores) {
  Harness h(128, 4);
  h.runner.device_scoring = GetParam();
  const std::vector<int32_t> prompt = test_prompt(9, 9);
  GenerationRequest r = scored(prompt, 2, 2);
  r.return_prompt_logits = true;
  const Collected c = run_request(h, r);
  expect_same_scores(c.prompt_logprobs, expected_scores(prompt, 2));
  EXPECT_EQ(c.prompt_logits.size(), prompt.size() * 64) << "a row per prompt position";
  EXPECT_EQ(h.runner.num_scored_rows, 0) << "the rows are wanted whole: nothing scored on the runner";
}

INSTANTIATE_TEST_SUITE_P(ScoredBy, EnginePromptLogprobs, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "TheRunner" : "TheEngine";
                         });

}  // namespace
}  // namespace pagoda::engine
