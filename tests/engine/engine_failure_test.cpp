// How the engine fails a request after submit(): the finished delta carries a
// StatusCode (request.h) that callers act on, never the wording of the text.
// A request that can never fit the KV cache is kFailedPrecondition, a failed
// model step kInternal, a request cut short by shutdown kCancelled; a caller's
// own abort is no failure at all.

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing_support::Collected;
using testing_support::drain;
using testing_support::test_prompt;
using testing_support::Harness;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

GenerationRequest greedy_request(std::vector<int32_t> prompt, int32_t max_tokens, int32_t n = 1) {
  GenerationRequest r;
  r.tenant_namespace = "t";
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.n = n;
  return r;
}

// A sequence the engine does not know holds blocks of the shared KV cache, so a
// request that submit() accepts (it fits the cache's size) can still never be
// placed: even with the engine idle, the blocks it needs cannot be freed.
constexpr kv::SequenceId kForeignSequence = 1'000'000;

TEST(EngineFailureTest, RequestThatCanNeverFitTheKvCacheFailsWithFailedPrecondition) {
  Harness h(16, 4);  // 64 tokens of KV
  auto held = h.kv->allocate_sequence(kForeignSequence, "other", test_prompt(40, 9));  // 10 of the 16 blocks
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  const auto prompt = test_prompt(30, 1);  // 8 blocks: more than the 6 left
  auto stream = h.engine->submit(greedy_request(prompt, 4));
  ASSERT_TRUE(stream.ok()) << "34 tokens fit a 64-token cache: submit() accepts it; "
                           << stream.status().to_string();
  h.run_checked();
  Collected c = drain(**stream);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kFailedPrecondition) << c.error;
  EXPECT_THAT(c.error, HasSubstr("30 tokens")) << "the message says what did not fit";
  EXPECT_EQ(c.finish[0], FinishReason::kError);
  EXPECT_TRUE(c.tokens[0].empty());
  EXPECT_EQ(h.engine->stats().requests_failed, 1);
  EXPECT_EQ(h.engine->stats().requests_aborted, 0);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 10) << "only the foreign sequence's blocks stay held";

  // The same request runs once the blocks are back: it was capacity, nothing else.
  ASSERT_TRUE(h.kv->abort_sequence(kForeignSequence).ok());
  auto again = *h.engine->submit(greedy_request(prompt, 4));
  h.run_checked();
  Collected ok = drain(*again);
  ASSERT_TRUE(ok.finished);
  EXPECT_EQ(ok.error_code, StatusCode::kOk) << ok.error;
  EXPECT_TRUE(ok.error.empty());
  EXPECT_EQ(ok.tokens[0], h.runner.reference_greedy(prompt, 4));
}

TEST(EngineFailureTest, ModelFailureOfAForkedRequestIsOneInternalFailureForAllChoices) {
  Harness h(128, 4);
  auto stream = *h.engine->submit(greedy_request(test_prompt(11, 2), 8, /*n=*/3));
  ASSERT_TRUE(h.engine->step());  // the prompt's prefill: the choices fork after it
  h.runner.fail_next = true;
  h.run_checked();
  Collected c = drain(*stream, 3);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kInternal) << c.error;
  EXPECT_THAT(c.error, HasSubstr("model step failed"));
  EXPECT_THAT(c.error, HasSubstr("injected failure")) << "the runner's own message is kept";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.finish[i], FinishReason::kError) << "choice " << i;
  EXPECT_EQ(h.engine->stats().requests_failed, 1);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineFailureTest, ShutdownCancelsWhatIsLeftButACallersAbortIsNoFailure) {
  Harness h(256, 4);
  auto running = *h.engine->submit(greedy_request(test_prompt(8, 3), 200));
  auto aborted = *h.engine->submit(greedy_request(test_prompt(9, 4), 200));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.engine->step());
  auto queued = *h.engine->submit(greedy_request(test_prompt(7, 5), 200));  // never admitted
  h.engine->abort(aborted->id());  // applied in the same drain as the shutdown
  h.engine->shutdown(0ms);

  for (auto* stream : {&running, &queued}) {
    Collected c = drain(**stream);
    ASSERT_TRUE(c.finished);
    EXPECT_EQ(c.error_code, StatusCode::kCancelled) << c.error;
    EXPECT_FALSE(c.error.empty());
    EXPECT_EQ(c.finish[0], FinishReason::kAbort);
  }
  Collected a = drain(*aborted);
  ASSERT_TRUE(a.finished);
  EXPECT_EQ(a.error_code, StatusCode::kOk) << a.error;
  EXPECT_TRUE(a.error.empty());
  EXPECT_EQ(a.finish[0], FinishReason::kAbort);

  const EngineStats stats = h.engine->stats();
  EXPECT_EQ(stats.requests_aborted, 3) << "cancelled by shutdown counts as aborted";
  EXPECT_EQ(stats.requests_failed, 0);
  EXPECT_EQ(stats.num_requests_in_flight, 0);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineFailureTest, ThreadedShutdownCancelsTheRequestItCutsShort) {
  Harness h(1024, 4);
  h.engine->start();
  // 4,000 steps: far longer than the moment between its first delta and the shutdown.
  auto stream = *h.engine->submit(greedy_request(test_prompt(8, 6), 4000));
  ASSERT_TRUE(stream->next(5s).has_value());
  h.engine->shutdown(0ms);
  ASSERT_TRUE(stream->finished());
  Collected c = drain(*stream);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kCancelled) << c.error;
  EXPECT_EQ(c.finish[0], FinishReason::kAbort);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

}  // namespace
}  // namespace pagoda::engine
