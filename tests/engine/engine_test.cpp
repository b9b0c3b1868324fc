// The engine with the real KV cache manager and a fake model whose output
// depends on the KV pool contents (fake_model_runner.h): every output is
// checked against a reference computed from the token list alone, and the KV
// manager's invariants are verified after every step.

#include "pagoda/engine/engine.h"

#include <thread>

#include <gtest/gtest.h>

#include "engine_harness.h"

namespace pagoda::engine {
namespace {

using testing::FakeModelRunner;
using testing_support::drain;
using testing_support::Collected;
using testing_support::Harness;
using namespace std::chrono_literals;

std::vector<int32_t> make_prompt(int32_t length, int32_t salt) {
  std::vector<int32_t> p(length);
  for (int32_t i = 0; i < length; ++i) p[i] = (i * 7 + salt * 13 + 3) % 64;
  return p;
}

GenerationRequest greedy_request(std::vector<int32_t> prompt, int32_t max_tokens, std::string ns = "t") {
  GenerationRequest r;
  r.tenant_namespace = std::move(ns);
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(EngineTest, SingleGreedyRequestMatchesReference) {
  Harness h(64, 4);
  auto prompt = make_prompt(10, 1);
  auto stream = h.engine->submit(greedy_request(prompt, 8));
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  h.run_checked();
  Collected c = drain(**stream);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompt, 8));
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EXPECT_EQ(c.usage.prompt_tokens, 10);
  EXPECT_EQ(c.usage.completion_tokens, 8);
  EXPECT_EQ(c.text[0].substr(0, 2), " <");
}

TEST(EngineTest, ChunkedPrefillMixedWithDecodesMatchesReference) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 7;  // forces prompts into several chunks next to decodes
  sched.max_running_sequences = 4;
  Harness h(256, 4, sched);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 10; ++i) {
    prompts.push_back(make_prompt(5 + i * 3, i));
    streams.push_back(*h.engine->submit(greedy_request(prompts.back(), 6)));
  }
  h.run_checked();
  EXPECT_LE(h.runner.max_batch_tokens, 7);
  for (int i = 0; i < 10; ++i) {
    Collected c = drain(*streams[i]);
    ASSERT_TRUE(c.finished) << i;
    EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompts[i], 6)) << "request " << i;
  }
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineTest, PrefixHitAndMissGiveTheSameGreedyOutput) {
  Harness h(64, 4);
  auto prompt = make_prompt(21, 5);
  auto first = *h.engine->submit(greedy_request(prompt, 10));
  h.run_checked();
  auto second = *h.engine->submit(greedy_request(prompt, 10));
  h.run_checked();
  Collected a = drain(*first), b = drain(*second);
  EXPECT_EQ(a.usage.cached_tokens, 0);
  EXPECT_EQ(b.usage.cached_tokens, 20) << "21-token prompt, blocks of 4: 5 full blocks reusable";
  EXPECT_EQ(a.tokens[0], b.tokens[0]);
  EXPECT_EQ(a.tokens[0], h.runner.reference_greedy(prompt, 10));
}

TEST(EngineTest, TenantsDoNotShareThePrefixCache) {
  Harness h(64, 4);
  auto prompt = make_prompt(17, 2);
  auto a1 = *h.engine->submit(greedy_request(prompt, 2, "alice"));
  h.run_checked();
  auto b1 = *h.engine->submit(greedy_request(prompt, 2, "bob"));
  h.run_checked();
  auto b2 = *h.engine->submit(greedy_request(prompt, 2, "bob"));
  h.run_checked();
  EXPECT_EQ(drain(*a1).usage.cached_tokens, 0);
  EXPECT_EQ(drain(*b1).usage.cached_tokens, 0) << "bob must miss where alice hit";
  EXPECT_EQ(drain(*b2).usage.cached_tokens, 16);
}

TEST(EngineTest, PreemptionByRecomputeLosesNothing) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 64;
  sched.max_running_sequences = 16;
  Harness h(/*num_blocks=*/12, /*block_size=*/4, sched);  // 48 slots for 8 requests of up to 24 tokens
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(make_prompt(6 + i, 10 + i));
    streams.push_back(*h.engine->submit(greedy_request(prompts.back(), 16)));
  }
  h.run_checked();
  EXPECT_GT(h.engine->stats().preemptions, 0) << "the test must exercise preemption";
  for (int i = 0; i < 8; ++i) {
    Collected c = drain(*streams[i]);
    ASSERT_TRUE(c.finished) << i;
    EXPECT_EQ(c.tokens[0], h.runner.reference_greedy(prompts[i], 16)) << "request " << i;
  }
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineTest, ForksShareThePromptAndSeededChoicesAreReproducible) {
  Harness h(128, 4);
  auto prompt = make_prompt(11, 3);
  GenerationRequest r = greedy_request(prompt, 6);
  r.sampling.n = 3;
  auto greedy = *h.engine->submit(r);
  h.run_checked();
  Collected g = drain(*greedy, 3);
  ASSERT_TRUE(g.finished);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.tokens[i], h.runner.reference_greedy(prompt, 6)) << "choice " << i;
  EXPECT_GT(h.runner.num_block_copies, 0) << "the partial last block is copied, not shared";
  EXPECT_EQ(g.usage.completion_tokens, 18);

  r.sampling.temperature = 1.5f;
  r.sampling.seed = 1234;
  auto s1 = *h.engine->submit(r);
  h.run_checked();
  auto s2 = *h.engine->submit(r);
  h.run_checked();
  Collected c1 = drain(*s1, 3), c2 = drain(*s2, 3);
  EXPECT_EQ(c1.tokens, c2.tokens);
  EXPECT_NE(c1.tokens[0], c1.tokens[1]) << "choices use different seeds";
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineTest, StopTokenIdsEosAndStopStrings) {
  Harness h(64, 4, {}, 256, /*eos=*/{});
  auto prompt = make_prompt(9, 4);
  auto ref = h.runner.reference_greedy(prompt, 8);
  GenerationRequest r = greedy_request(prompt, 8);
  r.sampling.stop_token_ids = {ref[3]};
  auto s = *h.engine->submit(r);
  GenerationRequest r2 = greedy_request(prompt, 8);
  r2.sampling.stop = {fmt::format(" <{}> <{}>", ref[1], ref[2])};
  auto s2 = *h.engine->submit(r2);
  h.run_checked();
  Collected c = drain(*s);
  size_t first_stop = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  EXPECT_EQ(c.tokens[0], std::vector<int32_t>(ref.begin(), ref.begin() + first_stop));
  EXPECT_EQ(c.finish[0], FinishReason::kStop);
  Collected c2 = drain(*s2);
  EXPECT_EQ(c2.finish[0], FinishReason::kStop);
  EXPECT_EQ(c2.text[0], fmt::format(" <{}>", ref[0]));
}

TEST(EngineTest, RejectsBadRequestsAndBoundsTheQueue) {
  Harness h(8, 4, {}, /*max_queued=*/2, {}, /*max_context=*/64);
  EXPECT_EQ(h.engine->submit(greedy_request({}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.engine->submit(greedy_request({1, 64}, 4)).status().code(), StatusCode::kInvalidArgument);
  auto too_long = h.engine->submit(greedy_request(make_prompt(60, 1), 10));
  EXPECT_EQ(too_long.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find("maximum context length is 64"), std::string::npos);
  auto over_kv = h.engine->submit(greedy_request(make_prompt(30, 1), 10));  // 40 tokens > 32 slots
  EXPECT_EQ(over_kv.status().code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(h.engine->submit(greedy_request(make_prompt(4, 1), 2)).ok());
  ASSERT_TRUE(h.engine->submit(greedy_request(make_prompt(4, 2), 2)).ok());
  EXPECT_EQ(h.engine->submit(greedy_request(make_prompt(4, 3), 2)).status().code(), StatusCode::kResourceExhausted);
  h.run_checked();
  EXPECT_TRUE(h.engine->submit(greedy_request(make_prompt(4, 3), 2)).ok()) << "queue drained";
  h.run_checked();
}

TEST(EngineTest, ThousandsOfAbortsReturnBlocksToBaseline) {
  SchedulerConfig sched;
  sched.max_tokens_per_step = 32;
  Harness h(256, 4, sched, /*max_queued=*/4096);
  const int32_t baseline = h.kv->stats().blocks_in_use;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3000; ++i) {
    streams.push_back(*h.engine->submit(greedy_request(make_prompt(10 + i % 20, i), 50)));
    if (i % 3 == 0) h.engine->step();           // some are mid-prefill or decoding when aborted
    if (i % 2 == 0) h.engine->abort(streams[i / 2]->id());
  }
  for (auto& s : streams) h.engine->abort(s->id());
  h.run_checked();
  EXPECT_EQ(h.kv->stats().blocks_in_use, baseline);
  EXPECT_EQ(h.engine->stats().num_requests_in_flight, 0);
  EXPECT_EQ(h.engine->stats().num_queued_requests, 0);
  for (auto& s : streams) {
    Collected c = drain(*s);
    EXPECT_TRUE(c.finished);
  }
}

TEST(EngineTest, ModelFailureFailsTheStepsRequestsWithoutLeaking) {
  Harness h(64, 4);
  auto s = *h.engine->submit(greedy_request(make_prompt(8, 1), 4));
  h.runner.fail_next = true;
  h.run_checked();
  Collected c = drain(*s);
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kInternal) << c.error;
  EXPECT_NE(c.error.find("injected failure"), std::string::npos);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineTest, ThreadedSubmitStreamAbortAndShutdown) {
  Harness h(256, 4);
  h.engine->start();
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        auto prompt = make_prompt(5 + i, t * 100 + i);
        auto stream = h.engine->submit(greedy_request(prompt, 5));
        if (!stream.ok()) continue;
        std::vector<int32_t> got;
        while (auto out = (*stream)->next(5s)) {
          for (auto& d : out->choices) got.insert(got.end(), d.tokens.begin(), d.tokens.end());
          if (out->finished) break;
        }
        if (got == h.runner.reference_greedy(prompt, 5)) ++ok;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(ok.load(), 40);
  auto long_one = *h.engine->submit(greedy_request(make_prompt(8, 9), 900));
  ASSERT_TRUE(long_one->next(5s).has_value());
  h.engine->shutdown(50ms);
  bool finished = long_one->finished();
  EXPECT_TRUE(finished) << "shutdown aborts what did not finish in the grace period";
  EXPECT_EQ(h.engine->submit(greedy_request(make_prompt(4, 1), 2)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

}  // namespace
}  // namespace pagoda::engine
