// The engine over a runner that samples on its device (ModelRunner::
// execute with RowSampling): rows go to the device sampler unless the request needs
// the host one (top logprobs and penalties on a runner that cannot score or edit
// logits, allowed_token_ids, the first token of n > 1), the mixed
// step hands each row the right result, and the output semantics (tokens,
// finish reasons, stop strings, usage) are those of the host path.

#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"
#include "pagoda/engine/sampler.h"

namespace pagoda::engine {
namespace {

using testing::FakeModelRunner;
using testing_support::drain;
using testing_support::test_prompt;
using testing_support::Collected;
using testing_support::Harness;
using namespace std::chrono_literals;

// The shared harness with the fake runner sampling on its "device" (or not).
struct DeviceHarness : Harness {
  explicit DeviceHarness(bool device, int32_t num_blocks = 256, int32_t block_size = 4, SchedulerConfig sched = {})
      : Harness(num_blocks, block_size, sched) {
    runner.device_sampling = device;
  }
};

GenerationRequest request(std::vector<int32_t> prompt, int32_t max_tokens, float temperature = 0.0f) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  return r;
}

size_t count_rows(const FakeModelRunner& runner, bool on_device) {
  size_t n = 0;
  for (const auto& call : runner.sampled_rows)
    for (const runtime::RowSampling& row : call) n += row.on_device == on_device ? 1 : 0;
  return n;
}

TEST(EngineDeviceSampling, GreedyOnTheDeviceMatchesTheReferenceAndSendsNoLogits) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 9;  // chunked prefills next to decodes
  DeviceHarness h(true, 256, 4, sched);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(test_prompt(4 + 3 * i, i));
    streams.push_back(*h.engine->submit(request(prompts.back(), 7)));
  }
  h.run_checked();
  for (int i = 0; i < 6; ++i) {
    Collected c = drain(*streams[i]);
    ASSERT_TRUE(c.finished);
    EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompts[i], 7)) << "request " << i;
    EXPECT_EQ(c.finish[0], FinishReason::kLength);
    EXPECT_EQ(c.usage.completion_tokens, 7);
  }
  EXPECT_EQ(count_rows(h.runner, true), 6u * 7u);
  EXPECT_EQ(count_rows(h.runner, false), 0u) << "plain greedy requests never need host logits";
  for (const auto& call : h.runner.sampled_rows)
    for (const runtime::RowSampling& row : call) EXPECT_EQ(row.temperature, 0.0f);
}

TEST(EngineDeviceSampling, MixedStepRoutesEachRowToTheRightSampler) {
  // Four requests decoding together: plain greedy (device), top logprobs and a
  // repetition penalty (host every step), n = 2 seeded (host for the first
  // token, shared by both choices; device after the fork).
  const int32_t max_tokens = 6;
  auto submit_all = [&](DeviceHarness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    s.push_back(*h.engine->submit(request(test_prompt(9, 1), max_tokens)));
    GenerationRequest lp = request(test_prompt(7, 2), max_tokens);
    lp.sampling.logprobs = 2;
    s.push_back(*h.engine->submit(lp));
    GenerationRequest pen = request(test_prompt(8, 3), max_tokens);
    pen.sampling.repetition_penalty = 1.3f;
    s.push_back(*h.engine->submit(pen));
    GenerationRequest fork = request(test_prompt(10, 4), max_tokens, 1.0f);
    fork.sampling.n = 2;
    fork.sampling.seed = 99;
    s.push_back(*h.engine->submit(fork));
    return s;
  };
  DeviceHarness device(true), host(false);
  auto ds = submit_all(device);
  auto hs = submit_all(host);
  device.run_checked();
  host.run_checked();

  EXPECT_EQ(count_rows(device.runner, false), 2u * max_tokens + 1u);
  EXPECT_EQ(count_rows(device.runner, true), 1u * max_tokens + 2u * (max_tokens - 1u));
  bool mixed_step = false;
  for (const auto& call : device.runner.sampled_rows) {
    size_t on = 0;
    for (const runtime::RowSampling& row : call) on += row.on_device ? 1 : 0;
    mixed_step |= on > 0 && on < call.size();
  }
  EXPECT_TRUE(mixed_step);

  // Greedy, logprobs and penalty requests: the same tokens, text and usage as the host path.
  for (int i = 0; i < 3; ++i) {
    Collected d = drain(*ds[i]), r = drain(*hs[i]);
    ASSERT_TRUE(d.finished && r.finished) << i;
    EXPECT_EQ(d.tokens, r.tokens) << "request " << i;
    EXPECT_EQ(d.text, r.text) << "request " << i;
    EXPECT_EQ(d.finish, r.finish) << "request " << i;
    EXPECT_EQ(d.usage.completion_tokens, r.usage.completion_tokens);
    EXPECT_EQ(d.usage.prompt_tokens, r.usage.prompt_tokens);
  }
  // Top logprobs came from the host sampler: two per token, the chosen one first for greedy.
  DeviceHarness again(true);
  auto as = submit_all(again);
  again.run_checked();
  Collected a_lp = drain(*as[1]);
  ASSERT_EQ(a_lp.logprobs[0].size(), static_cast<size_t>(max_tokens));
  for (const SampledToken& t : a_lp.logprobs[0]) {
    ASSERT_EQ(t.top_logprobs.size(), 2u);
    EXPECT_EQ(t.top_logprobs[0].token, t.token);
  }
  // The n = 2 request: both choices complete; reproducible run to run (seeded).
  Collected f1 = drain(*as[3], 2);
  Collected f0 = drain(*ds[3], 2);
  ASSERT_TRUE(f0.finished);
  EXPECT_EQ(f0.tokens, f1.tokens);
  EXPECT_EQ(f0.usage.completion_tokens, 2 * max_tokens);
  EXPECT_NE(f0.tokens[0], f0.tokens[1]) << "choices key their device draws differently";
}

TEST(EngineDeviceSampling, SeededDrawsDoNotDependOnTheBatch) {
  GenerationRequest r = request(test_prompt(12, 7), 10, 1.2f);
  r.sampling.seed = 7;
  r.sampling.top_p = 0.95f;
  DeviceHarness alone(true);
  auto a = *alone.engine->submit(r);
  alone.run_checked();
  // The same request among others, with preemption (few blocks).
  SchedulerConfig sched;
  sched.max_tokens_per_step = 16;
  DeviceHarness crowded(true, /*num_blocks=*/14, 4, sched);
  std::vector<std::shared_ptr<RequestStream>> others;
  for (int i = 0; i < 5; ++i) others.push_back(*crowded.engine->submit(request(test_prompt(6 + i, 20 + i), 9, 0.8f)));
  auto b = *crowded.engine->submit(r);
  crowded.run_checked();
  Collected ra = drain(*a), rb = drain(*b);
  ASSERT_TRUE(ra.finished && rb.finished);
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_GT(crowded.engine->stats().preemptions, 0) << "the test must exercise preemption";
  std::set<int32_t> distinct(ra.tokens[0].begin(), ra.tokens[0].end());
  EXPECT_GT(distinct.size(), 1u);
  // Steps key the draws: the device saw output indices 0..9 for this request.
  std::set<uint64_t> steps;
  for (const auto& call : alone.runner.sampled_rows)
    for (const runtime::RowSampling& row : call) steps.insert(row.step);
  EXPECT_EQ(steps.size(), 10u);
  EXPECT_EQ(*steps.rbegin(), 9u);
}

TEST(EngineDeviceSampling, StopTokensStopStringsAndUsageAsOnTheHost) {
  DeviceHarness h(true);
  const auto prompt = test_prompt(9, 4);
  const auto ref = h.runner.reference_greedy(prompt, 8);
  GenerationRequest r = request(prompt, 8);
  r.sampling.stop_token_ids = {ref[3]};
  auto s = *h.engine->submit(r);
  GenerationRequest r2 = request(prompt, 8);
  r2.sampling.stop = {fmt::format(" <{}> <{}>", ref[1], ref[2])};
  auto s2 = *h.engine->submit(r2);
  h.run_checked();
  Collected c = drain(*s);
  const size_t first_stop = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  EXPECT_EQ(c.tokens[0], std::vector<int32_t>(ref.begin(), ref.begin() + first_stop));
  EXPECT_EQ(c.finish[0], FinishReason::kStop);
  EXPECT_EQ(c.usage.completion_tokens, static_cast<int32_t>(first_stop) + 1) << "the stop token counts";
  Collected c2 = drain(*s2);
  EXPECT_EQ(c2.finish[0], FinishReason::kStop);
  EXPECT_EQ(c2.text[0], fmt::format(" <{}>", ref[0]));
  EXPECT_EQ(count_rows(h.runner, false), 0u);
}

class BrokenRunner : public ::testing::TestWithParam<bool> {};

TEST_P(BrokenRunner, TooFewTokensOrAnOutOfVocabularyTokenFailTheStepNotTheProcess) {
  DeviceHarness h(true);
  (GetParam() ? h.runner.drop_a_token : h.runner.out_of_vocab_token) = true;
  auto s = *h.engine->submit(request(test_prompt(5, 1), 4));
  h.run_checked();
  Collected c = drain(*s);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kInternal) << c.error;
  EXPECT_NE(c.error.find("model step failed"), std::string::npos) << c.error;
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

INSTANTIATE_TEST_SUITE_P(EngineDeviceSampling, BrokenRunner, ::testing::Bool());

// The engine keeps a sequence's token counts only for requests with a penalty
// (needs_token_history); those must still see every prompt and output token:
// the output is the host sampler's over the whole history, step by step.
TEST(EngineDeviceSampling, PenaltiesSeeThePromptAndEveryOutputToken) {
  DeviceHarness h(true);
  const std::vector<int32_t> prompt = test_prompt(12, 3);
  GenerationRequest r = request(prompt, 12);
  r.sampling.repetition_penalty = 1.6f;
  r.sampling.frequency_penalty = 1.5f;
  EXPECT_TRUE(needs_token_history(r.sampling));
  EXPECT_FALSE(needs_token_history(request(prompt, 12).sampling));
  const SamplingParams params = r.sampling;
  auto penalized = *h.engine->submit(std::move(r));
  auto plain = *h.engine->submit(request(prompt, 12));
  h.run_checked();

  TokenHistory history;
  history.add_prompt(prompt);
  std::vector<int32_t> context = prompt, expected;
  std::vector<float> logits(static_cast<size_t>(h.runner.vocab_size()));
  std::mt19937_64 rng(0);
  for (int i = 0; i < 12; ++i) {
    FakeModelRunner::fill_logits(context, h.runner.vocab_size(), logits.data());
    const int32_t t = Sampler::sample(logits, params, history, rng).token;
    history.add_output(t);
    context.push_back(t);
    expected.push_back(t);
  }
  Collected p = drain(*penalized), q = drain(*plain);
  ASSERT_TRUE(p.finished && q.finished);
  EXPECT_EQ(p.tokens[0], expected);
  EXPECT_EQ(q.tokens[0], h.runner.reference_greedy(prompt, 12));
  EXPECT_NE(expected, h.runner.reference_greedy(prompt, 12)) << "the penalties must change this output";
}

// Penalties and top logprobs where the runner offers them (RunnerCapabilities::edits_logits_on_device,
// scores_on_device): every row stays on the device, penalized rows with their lists, and the output is
// the host sampler's, token for token and logprob for logprob. Parameter: overlapped steps (a lazy
// launch); penalized and top-logprob rows are never launched, the rest of the run still is.
class DevicePenalties : public ::testing::TestWithParam<bool> {};

TEST_P(DevicePenalties, PenaltiesRulesAndTopLogprobsOnTheDeviceAreTheHostsOutput) {
  const bool overlap = GetParam();
  // Requests 0, 1, 5, 6 and 7 change their greedy outputs (checked below, so that ignoring them fails).
  const std::vector<int32_t> prompts[] = {test_prompt(12, 3), test_prompt(10, 5), test_prompt(9, 6),
                                          test_prompt(11, 7), test_prompt(8, 8),  test_prompt(13, 9),
                                          test_prompt(7, 10), test_prompt(10, 11), test_prompt(9, 12)};
  const std::vector<int32_t> penalized_prompts[] = {prompts[0], prompts[1], prompts[2]};
  Harness host(256, 4);
  std::vector<std::vector<int32_t>> refs;
  for (const auto& p : prompts) refs.push_back(host.runner.reference_greedy(p, 12));
  auto submit_all = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    GenerationRequest a = request(penalized_prompts[0], 12);
    a.sampling.repetition_penalty = 1.6f;
    a.sampling.frequency_penalty = 1.5f;
    a.sampling.logprobs = 3;
    s.push_back(*h.engine->submit(a));
    GenerationRequest b = request(penalized_prompts[1], 12);
    b.sampling.presence_penalty = 2.0f;
    s.push_back(*h.engine->submit(b));
    GenerationRequest c = request(penalized_prompts[2], 12);
    c.sampling.repetition_penalty = 0.7f;  // below 1: seen tokens favoured
    c.sampling.logprobs = 0;
    s.push_back(*h.engine->submit(c));
    GenerationRequest d = request(test_prompt(11, 7), 12);
    d.sampling.logprobs = 5;
    s.push_back(*h.engine->submit(d));
    s.push_back(*h.engine->submit(request(test_prompt(8, 8), 30)));  // plain: its tail alone is launched
    GenerationRequest bias = request(prompts[5], 12);  // logit_bias: one token up, the first one out
    bias.sampling.logit_bias = {{refs[5][0], -100.0f}, {refs[5][2], 4.0f}};
    bias.sampling.logprobs = 2;
    s.push_back(*h.engine->submit(bias));
    GenerationRequest min = request(prompts[6], 12);  // min_tokens bans the stop token at first
    min.sampling.min_tokens = 8;
    min.sampling.stop_token_ids = {refs[6][0]};
    min.sampling.frequency_penalty = 0.5f;
    s.push_back(*h.engine->submit(min));
    GenerationRequest bad = request(prompts[7], 12);  // a two-token bad word: its second token after its first
    bad.sampling.bad_words_ids = {{refs[7][0], refs[7][1]}};
    s.push_back(*h.engine->submit(bad));
    GenerationRequest allowed = request(prompts[8], 12);  // a whole-row rule: the host sampler's
    allowed.sampling.allowed_token_ids = {refs[8][0], 3, 4, 5};
    s.push_back(*h.engine->submit(allowed));
    return s;
  };
  Harness device(256, 4, {}, 256, {}, 4096, 0, overlap ? OverlapSteps::kOn : OverlapSteps::kOff);
  device.runner.device_sampling = device.runner.device_scoring = device.runner.device_logit_edits = true;
  device.runner.lazy_launch = overlap;
  auto hs = submit_all(host);
  auto ds = submit_all(device);
  host.run_checked();
  device.run_checked();

  EXPECT_EQ(count_rows(device.runner, false), 12u) << "allowed_token_ids' rows alone need the host sampler";
  EXPECT_GT(device.runner.num_logit_edits, 0);
  EXPECT_EQ(device.engine->stats().overlapped_steps > 0, overlap);
  for (size_t i = 0; i < hs.size(); ++i) {
    Collected h = drain(*hs[i]), d = drain(*ds[i]);
    ASSERT_TRUE(h.finished && d.finished) << i << " " << d.error;
    EXPECT_EQ(d.tokens, h.tokens) << "request " << i;
    ASSERT_EQ(d.logprobs[0].size(), h.logprobs[0].size()) << i;
    // The penalties change these outputs (else the comparison would hold with them ignored).
    if (i < 2 || (i >= 5 && i <= 7)) {
      EXPECT_NE(d.tokens[0], refs[i]) << i;
    }
    for (size_t t = 0; t < h.logprobs[0].size(); ++t) {
      const SampledToken &x = d.logprobs[0][t], &y = h.logprobs[0][t];
      EXPECT_EQ(x.token, y.token) << i << " " << t;
      EXPECT_EQ(x.logprob, y.logprob) << i << " " << t;
      ASSERT_EQ(x.top_logprobs.size(), y.top_logprobs.size()) << i << " " << t;
      for (size_t k = 0; k < y.top_logprobs.size(); ++k) {
        EXPECT_EQ(x.top_logprobs[k].token, y.top_logprobs[k].token) << i << " " << t << " " << k;
        EXPECT_EQ(x.top_logprobs[k].logprob, y.top_logprobs[k].logprob) << i << " " << t << " " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EngineDeviceSampling, DevicePenalties, ::testing::Bool());

}  // namespace
}  // namespace pagoda::engine
