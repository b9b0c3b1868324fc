// A request's logit rules through the engine (engine/logit_rules.h): rows go to
// the host sampler while a rule applies and back to the device once min_tokens
// is reached; min_tokens keeps eos and stop strings from ending the output
// early; allowed_token_ids, bad_words and logit_bias change what the fake
// model's greedy decode picks.

#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing_support::Collected;
using testing_support::run_request;
using testing_support::Harness;
using testing_support::test_prompt;

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(EngineLogitRules, RowsGoToTheHostWhileARuleAppliesAndBackAfterMinTokens) {
  Harness h(256, 4);
  h.runner.device_sampling = true;
  GenerationRequest r = greedy(test_prompt(9, 1), 6);
  r.sampling.min_tokens = 2;
  const Collected c = run_request(h, r);
  EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(r.prompt_tokens, 6)) << "no eos: min_tokens changes nothing";
  std::vector<bool> on_device;
  for (const auto& call : h.runner.sampled_rows)
    for (const runtime::RowSampling& row : call) on_device.push_back(row.on_device);
  EXPECT_EQ(on_device, (std::vector<bool>{false, false, true, true, true, true}));

  Harness biased(256, 4);
  biased.runner.device_sampling = true;
  GenerationRequest b = greedy(test_prompt(9, 1), 4);
  b.sampling.logit_bias = {{0, 0.5f}};
  run_request(biased, b);
  ASSERT_FALSE(biased.runner.sampled_rows.empty());
  for (const auto& call : biased.runner.sampled_rows)
    for (const runtime::RowSampling& row : call) EXPECT_FALSE(row.on_device) << "logit_bias applies to every row";
}

TEST(EngineLogitRules, MinTokensKeepsEosAndStopStringsFromEndingTheOutput) {
  const std::vector<int32_t> prompt = test_prompt(11, 2);
  const int32_t first = Harness(64, 4).runner.reference_next_token(prompt);
  Harness plain(256, 4, {}, 256, {first});
  EXPECT_TRUE(run_request(plain, greedy(prompt, 8)).tokens[0].empty()) << "the model's first token is eos here";

  Harness h(256, 4, {}, 256, {first});
  GenerationRequest r = greedy(prompt, 8);
  r.sampling.min_tokens = 3;
  const Collected c = run_request(h, r);
  ASSERT_GE(c.tokens[0].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(c.tokens[0][i], first) << "token " << i;

  // A stop string that the first token's text completes (the default decoder writes " <id>").
  Harness s(256, 4);
  const std::vector<int32_t> ref = s.runner.reference_greedy(prompt, 6);
  GenerationRequest stop = greedy(prompt, 6);
  stop.sampling.stop = {fmt::format(" <{}>", ref[0])};
  EXPECT_EQ(run_request(s, stop).text[0], "") << "without min_tokens the stop string ends the output at once";
  Harness m(256, 4);
  stop.sampling.min_tokens = 2;
  const Collected late = run_request(m, stop);
  ASSERT_GE(late.tokens[0].size(), 2u);
  EXPECT_EQ(late.tokens[0][0], ref[0]);
  EXPECT_EQ(late.text[0].rfind(fmt::format(" <{}>", ref[0]), 0), 0u) << late.text[0];
}

TEST(EngineLogitRules, AllowedTokensBadWordsAndBiasSteerTheGreedyDecode) {
  const std::vector<int32_t> prompt = test_prompt(10, 3);
  Harness h(256, 4);
  const std::vector<int32_t> ref = h.runner.reference_greedy(prompt, 5);

  GenerationRequest allowed = greedy(prompt, 5);
  allowed.sampling.allowed_token_ids = {7, 8, 9};
  const Collected a = run_request(h, allowed);
  ASSERT_EQ(a.tokens[0].size(), 5u);
  for (int32_t t : a.tokens[0]) EXPECT_TRUE(t >= 7 && t <= 9) << t;

  GenerationRequest banned = greedy(prompt, 5);
  banned.sampling.logit_bias = {{ref[0], -100.0f}};
  const Collected b = run_request(h, banned);
  ASSERT_FALSE(b.tokens[0].empty());
  EXPECT_NE(b.tokens[0][0], ref[0]);

  GenerationRequest bad = greedy(prompt, 5);
  bad.sampling.bad_words_ids = {{ref[0], ref[1]}};
  const Collected w = run_request(h, bad);
  ASSERT_GE(w.tokens[0].size(), 2u);
  EXPECT_EQ(w.tokens[0][0], ref[0]) << "the word's first token alone is allowed";
  EXPECT_NE(w.tokens[0][1], ref[1]) << "but not the word";
}

}  // namespace
}  // namespace pagoda::engine
