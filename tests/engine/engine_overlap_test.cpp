// Overlapped steps (EngineConfig::overlap_steps, ModelRunner::launch): the
// engine plans and launches step n + 1 before it has seen step n's tokens,
// whose ids the runner takes from its own sampled rows (deferred tokens).
// Whatever overlaps, the output must be exactly the synchronous engine's:
// the same tokens, finish reasons and usage, prefix-cache hits on the same
// blocks, every KV block back at the end, and steps that need the host (host
// sampling, preemption) run synchronously. Each test runs over two runners:
// one whose launch() queues the step and runs it only at collect() (as a
// device runs its queue), and the default launch() that runs it at once.

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing_support::Collected;
using testing_support::drain;
using testing_support::Harness;
using testing_support::test_prompt;

GenerationRequest request(std::vector<int32_t> prompt, int32_t max_tokens, float temperature = 0.0f,
                          std::optional<uint64_t> seed = std::nullopt) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  r.sampling.seed = seed;
  return r;
}

// The harness with device sampling and overlapped steps on (lazy: launch queues, collect runs) or off.
struct OverlapHarness : Harness {
  OverlapHarness(bool overlap, bool lazy, int32_t num_blocks = 256, int32_t block_size = 4, SchedulerConfig sched = {},
                 std::vector<int32_t> eos = {})
      : Harness(num_blocks, block_size, sched, 256, std::move(eos), 4096, 0,
                overlap ? OverlapSteps::kOn : OverlapSteps::kOff) {
    runner.device_sampling = true;
    runner.lazy_launch = lazy;
  }
};

class EngineOverlap : public ::testing::TestWithParam<bool> {
 protected:
  bool lazy() const { return GetParam(); }
};

// Runs the same requests through an engine with and without overlap; returns both outcomes.
struct Outcome {
  std::vector<Collected> collected;
  EngineStats stats;
  int32_t free_blocks = 0;
};

template <typename Submit>
Outcome run(bool overlap, bool lazy, Submit submit, int32_t num_blocks = 256, SchedulerConfig sched = {},
            std::vector<int32_t> eos = {}) {
  OverlapHarness h(overlap, lazy, num_blocks, 4, sched, std::move(eos));
  std::vector<std::shared_ptr<RequestStream>> streams = submit(h);
  h.run_checked();
  Outcome out;
  for (auto& s : streams) out.collected.push_back(drain(*s));
  out.stats = h.engine->stats();
  out.free_blocks = h.kv->num_available_blocks();
  EXPECT_EQ(h.runner.steps_queued(), 0u) << "every launched step is collected";
  return out;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.collected.size(), b.collected.size());
  for (size_t i = 0; i < a.collected.size(); ++i) {
    EXPECT_TRUE(b.collected[i].finished) << "request " << i;
    EXPECT_EQ(a.collected[i].tokens, b.collected[i].tokens) << "request " << i;
    EXPECT_EQ(a.collected[i].finish, b.collected[i].finish) << "request " << i;
    EXPECT_EQ(a.collected[i].text, b.collected[i].text) << "request " << i;
    EXPECT_EQ(a.collected[i].usage.completion_tokens, b.collected[i].usage.completion_tokens) << "request " << i;
    EXPECT_EQ(a.collected[i].usage.cached_tokens, b.collected[i].usage.cached_tokens) << "request " << i;
  }
  EXPECT_EQ(a.free_blocks, b.free_blocks) << "the same blocks back in the pool (cached ones included)";
  EXPECT_EQ(a.stats.generated_tokens, b.stats.generated_tokens);
}

TEST_P(EngineOverlap, GreedyDecodeMatchesTheReferenceAndTheSynchronousEngine) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 11;  // chunked prefills beside decodes
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 7; ++i) prompts.push_back(test_prompt(3 + 4 * i, i));
  auto submit = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    for (int i = 0; i < 7; ++i) s.push_back(*h.engine->submit(request(prompts[i], 1 + 3 * i)));
    return s;
  };
  OverlapHarness probe(true, lazy());
  const Outcome sync = run(false, lazy(), submit, 256, sched);
  const Outcome overlapped = run(true, lazy(), submit, 256, sched);
  expect_same(sync, overlapped);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(overlapped.collected[i].tokens[0], probe.runner.reference_greedy(prompts[i], 1 + 3 * i)) << i;
    EXPECT_EQ(overlapped.collected[i].finish[0], FinishReason::kLength);
  }
  EXPECT_EQ(sync.stats.overlapped_steps, 0);
  EXPECT_GT(overlapped.stats.overlapped_steps, 10) << "decode steps launched while the one before ran";
  EXPECT_EQ(overlapped.free_blocks, 256 - 0) << "no block held after the last request";
}

TEST_P(EngineOverlap, DeviceTokensFeedTheNextStepWithoutTheHost) {
  OverlapHarness h(true, lazy());
  const std::vector<int32_t> prompt = test_prompt(6, 3);
  auto stream = *h.engine->submit(request(prompt, 12));
  h.run_checked();
  const Collected c = drain(*stream);
  EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompt, 12));
  if (lazy()) {
    EXPECT_EQ(h.runner.max_steps_launched, 2) << "two steps queued at once";
    EXPECT_GE(h.runner.num_deferred_tokens, 10) << "decode inputs taken from the runner's own rows";
  }
  EXPECT_EQ(h.runner.num_launches, h.runner.num_executes);
}

TEST_P(EngineOverlap, EosSeenAStepLateWastesOneRowAndLeaksNothing) {
  // The eos id is a token the fake model produces a few tokens into the first
  // prompt's output: the step after it was already launched, and its row is
  // computed for nothing.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(test_prompt(5 + i, 20 + i));
  const int32_t eos = OverlapHarness(false, false).runner.reference_greedy(prompts[0], 4)[3];
  auto submit = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    for (int i = 0; i < 12; ++i) s.push_back(*h.engine->submit(request(prompts[i], 40)));
    return s;
  };
  const Outcome sync = run(false, lazy(), submit, 256, {}, {eos});
  const Outcome overlapped = run(true, lazy(), submit, 256, {}, {eos});
  expect_same(sync, overlapped);
  int stopped = 0;
  for (const Collected& c : overlapped.collected) stopped += c.finish[0] == FinishReason::kStop ? 1 : 0;
  EXPECT_GT(stopped, 0) << "the test needs requests that stop on eos";
  EXPECT_EQ(overlapped.free_blocks, 256);
}

TEST_P(EngineOverlap, SeededSamplingDrawsTheSameTokens) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(test_prompt(4 + i, 40 + i));
  auto submit = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    for (int i = 0; i < 5; ++i) s.push_back(*h.engine->submit(request(prompts[i], 15, 1.0f, 1000 + i)));
    return s;
  };
  expect_same(run(false, lazy(), submit), run(true, lazy(), submit));
}

TEST_P(EngineOverlap, HostSampledRowsRunSynchronouslyBesideOverlappedOnes) {
  // Top logprobs and a penalty need the host sampler: steps carrying them are executed, not launched.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(test_prompt(6 + i, 60 + i));
  auto submit = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r = request(prompts[i], 10 + 6 * i);
      if (i == 1) r.sampling.logprobs = 2;
      if (i == 2) r.sampling.repetition_penalty = 1.3f;
      s.push_back(*h.engine->submit(std::move(r)));
    }
    return s;
  };
  const Outcome sync = run(false, lazy(), submit);
  const Outcome overlapped = run(true, lazy(), submit);
  expect_same(sync, overlapped);
  EXPECT_GT(overlapped.stats.overlapped_steps, 0) << "after the host-sampled requests end, the rest overlaps";
}

TEST_P(EngineOverlap, PrefixCacheHitsTheSameBlocksIncludingGeneratedOnes) {
  // A second wave re-sends the first wave's prompts plus their outputs: the
  // generated tokens' blocks are cached only once their ids are known, and
  // hit the same way with and without overlap.
  const std::vector<int32_t> base = test_prompt(9, 77);
  auto submit = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    s.push_back(*h.engine->submit(request(base, 14)));
    h.run_checked();
    Collected first = drain(*s.back());
    std::vector<int32_t> follow = base;
    follow.insert(follow.end(), first.tokens[0].begin(), first.tokens[0].end());
    auto again = *h.engine->submit(request(follow, 6));
    auto twin = *h.engine->submit(request(base, 14));
    return std::vector<std::shared_ptr<RequestStream>>{again, twin};
  };
  const Outcome sync = run(false, lazy(), submit);
  const Outcome overlapped = run(true, lazy(), submit);
  expect_same(sync, overlapped);
  EXPECT_GE(overlapped.collected[0].usage.cached_tokens, 20) << "the prompt's and the output's full blocks hit";
}

TEST_P(EngineOverlap, AbortWhileAStepIsLaunchedFreesEverything) {
  OverlapHarness h(true, lazy());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(*h.engine->submit(request(test_prompt(5, 90 + i), 30)));
  for (int s = 0; s < 6; ++s) ASSERT_TRUE(h.engine->step());
  if (lazy()) {
    EXPECT_GT(h.runner.steps_queued(), 0u) << "a step is on the 'device' when the abort comes";
  }
  h.engine->abort(streams[1]->id());
  h.engine->abort(streams[2]->id());
  h.run_checked();
  for (int i = 0; i < 4; ++i) {
    const Collected c = drain(*streams[i]);
    ASSERT_TRUE(c.finished) << i;
    if (i == 1 || i == 2) {
      EXPECT_EQ(c.finish[0], FinishReason::kAbort) << i;
    } else {
      EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(test_prompt(5, 90 + i), 30)) << i;
    }
  }
  EXPECT_EQ(h.kv->num_available_blocks(), 256);
  EXPECT_EQ(h.runner.steps_queued(), 0u);
}

TEST_P(EngineOverlap, TightCacheFallsBackToSynchronousStepsAndPreemptsAsBefore) {
  // 24 blocks of 4 for 6 requests of 8 + 20 tokens: preemption by recompute, which never happens while a step
  // is launched (the engine collects first), so the outputs are the synchronous engine's.
  SchedulerConfig sched;
  sched.max_running_sequences = 6;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(test_prompt(8, 110 + i));
  auto submit = [&](Harness& h) {
    std::vector<std::shared_ptr<RequestStream>> s;
    for (int i = 0; i < 6; ++i) s.push_back(*h.engine->submit(request(prompts[i], 20)));
    return s;
  };
  const Outcome sync = run(false, lazy(), submit, 24, sched);
  const Outcome overlapped = run(true, lazy(), submit, 24, sched);
  ASSERT_GT(sync.stats.preemptions, 0) << "the test needs a cache too small for every request";
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(overlapped.collected[i].tokens, sync.collected[i].tokens) << i;
    EXPECT_EQ(overlapped.collected[i].finish, sync.collected[i].finish) << i;
  }
  EXPECT_EQ(overlapped.free_blocks, 24);
}

TEST_P(EngineOverlap, AFailedLaunchedStepFailsItsRequestsAndFreesTheirBlocks) {
  OverlapHarness h(true, lazy());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(*h.engine->submit(request(test_prompt(6, 130 + i), 25)));
  for (int s = 0; s < 5; ++s) ASSERT_TRUE(h.engine->step());
  h.runner.fail_next = true;  // the next step the runner runs fails
  h.run_checked();
  for (auto& s : streams) {
    const Collected c = drain(*s);
    ASSERT_TRUE(c.finished);
    EXPECT_EQ(c.error_code, StatusCode::kInternal);
  }
  EXPECT_EQ(h.kv->num_available_blocks(), 256);
  EXPECT_EQ(h.runner.steps_queued(), 0u);
}

TEST_P(EngineOverlap, ATenantsCapNeverPreemptsALaunchedSequence) {
  // Tenant "a" may hold 4 blocks of 4 tokens; two requests of 6 + 8 tokens cannot both grow. The pool has
  // room, so planning ahead goes on; a sequence a launched step carries sits a step out instead of being
  // preempted under it, and is preempted (or not) only once that step is in.
  auto submit = [&](Harness& h) {
    EXPECT_TRUE(h.kv->set_namespace_block_limit("a", 4).ok());
    std::vector<std::shared_ptr<RequestStream>> s;
    for (int i = 0; i < 2; ++i) {
      GenerationRequest r = request(test_prompt(6, 300 + i), 8);
      r.tenant_namespace = "a";
      s.push_back(*h.engine->submit(std::move(r)));
    }
    return s;
  };
  const Outcome sync = run(false, lazy(), submit);
  const Outcome overlapped = run(true, lazy(), submit);
  ASSERT_GT(sync.stats.preemptions, 0) << "the test needs the cap to preempt";
  expect_same(sync, overlapped);
  EXPECT_EQ(overlapped.free_blocks, 256);
}

TEST_P(EngineOverlap, AFailedStepNeverLeavesItsBlocksInThePrefixCache) {
  // A prompt prefilled 4 tokens a step: its first chunk fails while the second is already launched (and
  // succeeds). Nothing the failed request computed may be cached: the same prompt again gets no hit.
  SchedulerConfig sched;
  sched.max_tokens_per_step = 4;
  OverlapHarness h(true, lazy(), 256, 4, sched);
  const std::vector<int32_t> prompt = test_prompt(16, 500);
  auto a = *h.engine->submit(request(prompt, 4));
  ASSERT_TRUE(h.engine->step());  // launches chunk [0, 4)
  h.runner.fail_next = true;      // the next step the runner runs fails
  h.run_checked();
  const Collected ca = drain(*a);
  EXPECT_TRUE(ca.finished);
  EXPECT_EQ(ca.error_code, StatusCode::kInternal);
  auto b = *h.engine->submit(request(prompt, 4));
  h.run_checked();
  const Collected cb = drain(*b);
  EXPECT_EQ(cb.error_code, StatusCode::kOk);
  // With the queueing runner the failure is the first chunk's (nothing of the request was written); the
  // runner that runs at launch had already run the first chunk when the failure came (the second's).
  EXPECT_EQ(cb.usage.cached_tokens, lazy() ? 0 : 4) << "only blocks a successful step wrote are cached";
  EXPECT_EQ(cb.tokens[0], h.runner.reference_greedy(prompt, 4));
  EXPECT_EQ(h.kv->num_available_blocks(), 256);
}

TEST_P(EngineOverlap, ShutdownWithALaunchedStepFinishesEverything) {
  OverlapHarness h(true, lazy());
  auto a = *h.engine->submit(request(test_prompt(6, 600), 20));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.engine->step());
  h.engine->shutdown(std::chrono::milliseconds(0));
  EXPECT_TRUE(drain(*a).finished);
  EXPECT_EQ(h.kv->num_available_blocks(), 256);
  EXPECT_EQ(h.runner.steps_queued(), 0u);
}

TEST_P(EngineOverlap, ThreadedAbortsAndShutdownLeakNothing) {
  OverlapHarness h(true, lazy());
  h.engine->start();
  std::vector<std::shared_ptr<RequestStream>> s;
  for (int i = 0; i < 8; ++i) s.push_back(*h.engine->submit(request(test_prompt(5 + i, 1000 + i), 200)));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  h.engine->abort(s[0]->id());
  h.engine->abort(s[3]->id());
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  h.engine->shutdown(std::chrono::milliseconds(0));
  for (auto& st : s) EXPECT_TRUE(drain(*st).finished);
  EXPECT_EQ(h.kv->num_available_blocks(), 256);
  EXPECT_EQ(h.runner.steps_queued(), 0u);
}

TEST_P(EngineOverlap, ForksStopStringsAndStopTokensGiveTheSynchronousOutputs) {
  // n = 3 (its first token on the host, then forks sampled on the device), stop strings and a stop
  // token id, seeded sampling: every choice's tokens, text and finish as without overlap.
  std::vector<Collected> out[2];
  int free_blocks[2];
  for (int o = 0; o < 2; ++o) {
    OverlapHarness h(o == 1, lazy());
    std::vector<std::shared_ptr<RequestStream>> s;
    std::vector<int> ns;
    for (int i = 0; i < 6; ++i) {
      GenerationRequest r = request(test_prompt(5 + i, 700 + i), 12 + i, 1.0f, 900 + i);
      if (i % 3 == 0) r.sampling.n = 3;
      if (i % 3 == 1) r.sampling.stop = {"<25>", "5> <3"};
      if (i == 2) r.sampling.stop_token_ids = {25};
      ns.push_back(r.sampling.n);
      s.push_back(*h.engine->submit(std::move(r)));
    }
    h.run_checked();
    for (size_t i = 0; i < s.size(); ++i) out[o].push_back(drain(*s[i], ns[i]));
    free_blocks[o] = h.kv->num_available_blocks();
  }
  for (size_t i = 0; i < out[0].size(); ++i) {
    EXPECT_TRUE(out[1][i].finished) << i;
    EXPECT_EQ(out[0][i].tokens, out[1][i].tokens) << i;
    EXPECT_EQ(out[0][i].text, out[1][i].text) << i;
    EXPECT_EQ(out[0][i].finish, out[1][i].finish) << i;
    EXPECT_EQ(out[0][i].usage.completion_tokens, out[1][i].usage.completion_tokens) << i;
  }
  EXPECT_EQ(free_blocks[0], free_blocks[1]);
}

TEST_P(EngineOverlap, TheContextLimitEndsSequencesAsWithoutOverlap) {
  for (const int32_t context : {9, 10, 11}) {
    Harness a(256, 4, {}, 256, {}, context, 0, OverlapSteps::kOff);
    Harness b(256, 4, {}, 256, {}, context, 0, OverlapSteps::kOn);
    for (Harness* h : {&a, &b}) {
      h->runner.device_sampling = true;
      h->runner.lazy_launch = lazy();
    }
    auto sa = *a.engine->submit(request(test_prompt(5, 800), context - 5));
    auto sb = *b.engine->submit(request(test_prompt(5, 800), context - 5));
    a.run_checked();
    b.run_checked();
    const Collected ca = drain(*sa), cb = drain(*sb);
    EXPECT_TRUE(cb.finished) << context;
    EXPECT_EQ(ca.tokens, cb.tokens) << context;
    EXPECT_EQ(ca.finish, cb.finish) << context;
    EXPECT_EQ(b.kv->num_available_blocks(), 256) << context;
  }
}

INSTANTIATE_TEST_SUITE_P(Runners, EngineOverlap, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "LaunchQueues" : "LaunchRunsAtOnce");
                         });

TEST(EngineOverlapAuto, OnlyARunnerThatOverlapsGetsLaunchedSteps) {
  for (const bool overlaps : {false, true}) {
    Harness h(64, 4, {}, 256, {}, 4096, 0, OverlapSteps::kAuto);
    h.runner.device_sampling = true;
    h.runner.lazy_launch = overlaps;  // the engine reads the capability at construction: rebuild it
    EngineConfig config;
    config.overlap_steps = OverlapSteps::kAuto;
    h.engine = std::make_unique<Engine>(config, h.runner, *h.kv);
    auto stream = *h.engine->submit(request(test_prompt(5, 1), 6));
    h.run_checked();
    EXPECT_TRUE(drain(*stream).finished);
    if (overlaps) {
      EXPECT_GT(h.runner.num_launches, 0) << "kAuto on a runner whose launch returns early overlaps";
    } else {
      EXPECT_EQ(h.runner.num_launches, 0) << "kAuto on a runner without overlaps_steps executes";
    }
  }
}

TEST(EngineOverlapAuto, OffByDefault) {
  Harness h(64, 4);
  h.runner.device_sampling = true;
  h.runner.lazy_launch = true;
  h.engine = std::make_unique<Engine>(EngineConfig{}, h.runner, *h.kv);
  auto stream = *h.engine->submit(request(test_prompt(5, 2), 6));
  h.run_checked();
  EXPECT_TRUE(drain(*stream).finished);
  EXPECT_EQ(h.runner.num_launches, 0);
}

}  // namespace
}  // namespace pagoda::engine
