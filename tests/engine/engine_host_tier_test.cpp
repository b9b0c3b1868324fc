// The engine over a KV manager with a host tier and a fake model that reads
// its K/V back from the pools (fake_model_runner.h): a host-tier hit, swap
// preemption and a failed transfer must all give exactly the reference output,
// with the KV invariants checked after every step.

#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing_support::Collected;
using testing_support::drain;
using testing_support::Harness;
using testing_support::test_prompt;

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens, std::string ns = "t") {
  GenerationRequest r;
  r.tenant_namespace = std::move(ns);
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

Collected run_one(Harness& h, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  auto stream = h.engine->submit(greedy(prompt, max_tokens));
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  if (!stream.ok()) return {};
  h.run_checked();
  return drain(**stream);
}

TEST(EngineHostTierTest, CreateChecksTheHostTierAgainstTheRunner) {
  testing::FakeModelRunner runner(16, 4, 64, 4096, {}, /*num_host_blocks=*/8);
  kv::KvCacheConfig kc;
  kc.num_blocks = 16;
  kc.block_size = 4;
  auto no_host = std::move(kv::KvCacheManager::create(kc)).value();
  auto mismatch = Engine::create(EngineConfig{}, runner, *no_host);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("host"), std::string::npos);

  testing::FakeModelRunner plain(16, 4);
  EngineConfig swap;
  swap.scheduler.preemption_mode = PreemptionMode::kSwap;
  auto no_tier = Engine::create(swap, plain, *no_host);
  ASSERT_FALSE(no_tier.ok());
  EXPECT_NE(no_tier.status().message().find("swap"), std::string::npos);
}

TEST(EngineHostTierTest, AHostTierHitGivesTheSameOutputAsAMiss) {
  // 8 device blocks of 4 tokens, 32 host blocks.
  Harness h(8, 4, {}, 256, {}, 4096, /*num_host_blocks=*/32);
  const auto prompt = test_prompt(17, 1);
  const Collected first = run_one(h, prompt, 6);
  ASSERT_TRUE(first.finished);
  EXPECT_EQ(first.tokens[0], h.runner.reference_greedy(prompt, 6));
  // Other requests take the device tier: the first prompt's blocks are written back.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(run_one(h, test_prompt(25, 10 + i), 4).finished);
  EXPECT_GT(h.kv->stats().blocks_demoted, 0);
  EXPECT_EQ(h.kv->match_prefix("t", prompt).host_blocks, 4) << "the prompt's 4 full blocks are in the host tier";

  const Collected again = run_one(h, prompt, 6);
  ASSERT_TRUE(again.finished);
  EXPECT_EQ(again.tokens[0], first.tokens[0]);
  EXPECT_EQ(again.usage.cached_tokens, 16) << "host-tier hits count as cached tokens";
  const EngineStats stats = h.engine->stats();
  EXPECT_EQ(stats.kv.hit_tokens_by_tier[static_cast<int>(kv::BlockTier::kHost)], 16);
  EXPECT_GT(stats.kv.blocks_promoted, 0);
  EXPECT_GT(h.runner.num_transfers[static_cast<int>(runtime::TransferDirection::kHostToDevice)], 0);
  EXPECT_GT(h.runner.num_transfers[static_cast<int>(runtime::TransferDirection::kDeviceToHost)], 0);
}

// Eight requests that need more KV than the device tier holds: preemption.
struct PressureRun {
  std::vector<std::vector<int32_t>> prompts, outputs;
  EngineStats stats;
};

PressureRun run_under_pressure(PreemptionMode mode, int32_t device_blocks, int32_t host_blocks,
                               int32_t fail_transfers = 0) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 64;
  sched.max_running_sequences = 16;
  sched.preemption_mode = mode;
  Harness h(device_blocks, 4, sched, 256, {}, 4096, host_blocks);
  h.runner.fail_transfers = fail_transfers;
  PressureRun run;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) {
    run.prompts.push_back(test_prompt(6 + i, 30 + i));
    streams.push_back(*h.engine->submit(greedy(run.prompts.back(), 16)));
  }
  h.run_checked();
  for (auto& s : streams) {
    const Collected c = drain(*s);
    EXPECT_TRUE(c.finished);
    EXPECT_TRUE(c.error.empty()) << c.error;
    run.outputs.push_back(c.tokens[0]);
  }
  run.stats = h.engine->stats();
  EXPECT_EQ(run.stats.kv.blocks_in_use, 0);
  EXPECT_EQ(run.stats.kv.sequences_swapped, 0);
  for (size_t i = 0; i < run.prompts.size(); ++i)
    EXPECT_EQ(run.outputs[i], h.runner.reference_greedy(run.prompts[i], 16)) << "request " << i;
  return run;
}

TEST(EngineHostTierTest, PreemptionBySwapGivesTheSameOutputAsNoPreemption) {
  const PressureRun roomy = run_under_pressure(PreemptionMode::kRecompute, 128, 0);
  EXPECT_EQ(roomy.stats.preemptions, 0);
  const PressureRun swap = run_under_pressure(PreemptionMode::kSwap, 12, 64);
  EXPECT_GT(swap.stats.swap_preemptions, 0) << "the test must exercise swapping";
  EXPECT_EQ(swap.stats.swap_preemptions, swap.stats.preemptions) << "the host tier had room for every swap";
  EXPECT_GT(swap.stats.kv.swap_ins, 0);
  EXPECT_EQ(swap.outputs, roomy.outputs);
  const PressureRun recompute = run_under_pressure(PreemptionMode::kRecompute, 12, 64);
  EXPECT_GT(recompute.stats.preemptions, 0);
  EXPECT_EQ(recompute.stats.swap_preemptions, 0);
  EXPECT_EQ(recompute.outputs, roomy.outputs);
}

TEST(EngineHostTierTest, SwapFallsBackToRecomputeWhenTheHostTierIsFull) {
  const PressureRun tight = run_under_pressure(PreemptionMode::kSwap, 12, 2);
  EXPECT_GT(tight.stats.preemptions, tight.stats.swap_preemptions) << "some swaps did not fit";
  EXPECT_GT(tight.stats.kv.swap_out_failures, 0);
}

TEST(EngineHostTierTest, FailedTransfersAreRecomputedNeverServed) {
  // The first transfer calls fail (garbage lands at their destinations): the
  // sequences whose K/V was lost start over; nobody reads the garbage.
  const PressureRun failing = run_under_pressure(PreemptionMode::kSwap, 12, 64, /*fail_transfers=*/3);
  EXPECT_EQ(failing.stats.transfer_failures, 3);
  EXPECT_GT(failing.stats.kv.blocks_lost, 0);

  Harness h(8, 4, {}, 256, {}, 4096, 32);
  const auto prompt = test_prompt(17, 1);
  const Collected first = run_one(h, prompt, 6);
  for (int i = 0; i < 3; ++i) run_one(h, test_prompt(25, 10 + i), 4);
  ASSERT_EQ(h.kv->match_prefix("t", prompt).host_blocks, 4);
  h.runner.fail_transfers = 1;  // the promotion of the host hit fails
  const Collected again = run_one(h, prompt, 6);
  ASSERT_TRUE(again.finished);
  EXPECT_EQ(again.tokens[0], first.tokens[0]);
  EXPECT_EQ(h.engine->stats().transfer_failures, 1);
}


// The request timeline (request_timeline.h) of a host-tier hit: every phase in
// order, the load counted in its admission step and reported complete.
TEST(EngineHostTierTest, TimelineOfAHostHitHasEveryPhaseInOrder) {
  testing::FakeModelRunner runner(8, 4, 64, 4096, {}, /*num_host_blocks=*/32);
  kv::KvCacheConfig kc;
  kc.num_blocks = 8;
  kc.block_size = 4;
  kc.num_host_blocks = 32;
  auto kv = std::move(kv::KvCacheManager::create(kc)).value();
  std::vector<RequestTimeline> timelines;
  EngineConfig ec;
  ec.timeline_sink = [&](const RequestTimeline& t) { timelines.push_back(t); };
  auto engine = std::move(Engine::create(ec, runner, *kv)).value();
  auto run = [&](const std::vector<int32_t>& prompt) {
    auto stream = engine->submit(greedy(prompt, 3));
    ASSERT_TRUE(stream.ok());
    engine->run_until_idle();
    EXPECT_TRUE(drain(**stream).finished);
  };
  const auto prompt = test_prompt(17, 1);
  run(prompt);
  for (int i = 0; i < 3; ++i) run(test_prompt(25, 10 + i));
  ASSERT_EQ(kv->match_prefix("t", prompt).host_blocks, 4);
  run(prompt);
  ASSERT_EQ(timelines.size(), 5u) << "one timeline per request, at its first token";

  const RequestTimeline& miss = timelines[0];
  EXPECT_EQ(miss.host_hit_tokens, 0);
  EXPECT_EQ(miss.prompt_tokens, 17);
  EXPECT_EQ(miss.load_enqueued_s, -1) << "nothing moved in its admission step";

  const RequestTimeline& hit = timelines[4];
  EXPECT_EQ(hit.request_id, 5u);
  EXPECT_EQ(hit.cached_tokens, 16);
  EXPECT_EQ(hit.host_hit_tokens, 16);
  EXPECT_GE(hit.admission_h2d_blocks, 4) << "its 4 host blocks are loaded in its admission step";
  EXPECT_EQ(hit.admitted_with, 1);
  EXPECT_EQ(hit.first_step_sequences, 1);
  EXPECT_EQ(hit.first_step_tokens, 1) << "one new token after a 16-token hit of a 17-token prompt";
  EXPECT_EQ(hit.steps_before_first_token, 1);
  EXPECT_GE(hit.picked_up_s, 0);
  EXPECT_GE(hit.admitted_s, hit.picked_up_s);
  EXPECT_GE(hit.load_enqueued_s, hit.admitted_s);
  EXPECT_GE(hit.load_done_s, hit.admitted_s) << "the runner reports when the copies ended";
  EXPECT_LE(hit.load_done_s, hit.load_enqueued_s) << "a synchronous runner is done when the call returns";
  EXPECT_GE(hit.first_step_start_s, hit.load_enqueued_s);
  EXPECT_GE(hit.first_step_end_s, hit.first_step_start_s);
  EXPECT_GE(hit.first_token_s, hit.first_step_end_s);
  const std::string line = format_timeline(hit);
  EXPECT_NE(line.find("request 5: prompt 17 (cached 16, host 16)"), std::string::npos) << line;
}

}  // namespace
}  // namespace pagoda::engine
