#pragma once
// Test harness shared by the engine tests: an Engine over a FakeModelRunner
// and a real KV cache manager, stepped on the test's thread with the KV
// invariants checked after every step, and drain() to collect a stream.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fake_model_runner.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine::testing_support {

using ::pagoda::engine::testing::FakeModelRunner;
using namespace std::chrono_literals;

// The engine over a FakeModelRunner and a real KV cache manager, driven synchronously.
struct Harness {
  Harness(int32_t num_blocks, int32_t block_size, SchedulerConfig sched = {}, int32_t max_queued = 256,
          std::vector<int32_t> eos = {}, int32_t max_context = 4096, int32_t num_host_blocks = 0,
          OverlapSteps overlap = OverlapSteps::kAuto)
      : runner(num_blocks, block_size, 64, max_context, std::move(eos), num_host_blocks) {
    kv::KvCacheConfig kc;
    kc.num_blocks = num_blocks;
    kc.block_size = block_size;
    kc.num_host_blocks = num_host_blocks;
    kv = std::move(kv::KvCacheManager::create(kc)).value();
    EngineConfig ec;
    ec.scheduler = sched;
    ec.max_queued_requests = max_queued;
    ec.overlap_steps = overlap;
    auto created = Engine::create(ec, runner, *kv);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    engine = std::move(created).value();
  }
  // Steps until idle, checking KV invariants after every step.
  void run_checked() {
    int guard = 0;
    while (engine->step()) {
      Status s = engine->verify_integrity();
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_LT(++guard, 100000) << "no progress";
    }
  }
  FakeModelRunner runner;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<Engine> engine;
};

// Everything a request's stream delivered, per choice.
struct Collected {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<SampledToken>> logprobs;
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
  std::vector<SampledToken> prompt_logprobs;  // RequestOutput::prompt_logprobs, all deltas
  std::vector<float> prompt_logits;           // RequestOutput::prompt_logits, all deltas
  Usage usage;
  bool finished = false;
  StatusCode error_code = StatusCode::kOk;  // RequestOutput::error_code of the finished delta
  std::string error;
};

inline Collected drain(RequestStream& stream, int32_t n = 1) {
  Collected c;
  c.tokens.resize(n);
  c.logprobs.resize(n);
  c.text.resize(n);
  c.finish.resize(n, FinishReason::kNone);
  while (auto out = stream.next(0ms)) {
    c.prompt_logprobs.insert(c.prompt_logprobs.end(), out->prompt_logprobs.begin(), out->prompt_logprobs.end());
    c.prompt_logits.insert(c.prompt_logits.end(), out->prompt_logits.begin(), out->prompt_logits.end());
    for (const auto& d : out->choices) {
      c.tokens[d.index].insert(c.tokens[d.index].end(), d.tokens.begin(), d.tokens.end());
      c.logprobs[d.index].insert(c.logprobs[d.index].end(), d.logprobs.begin(), d.logprobs.end());
      c.text[d.index] += d.text;
      if (d.finish_reason != FinishReason::kNone) c.finish[d.index] = d.finish_reason;
    }
    if (out->finished) {
      c.finished = true;
      c.usage = out->usage;
      c.error_code = out->error_code;
      c.error = out->error;
    }
  }
  return c;
}

// Submits `r`, steps the engine until idle and drains the request's stream (expecting both to succeed).
inline Collected run_request(Harness& h, const GenerationRequest& r) {
  auto stream = h.engine->submit(r);
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  h.run_checked();
  Collected c = drain(**stream);
  EXPECT_TRUE(c.finished);
  return c;
}

// A deterministic prompt of `length` token ids below 64 (the fake model's
// vocabulary); different salts give different prompts.
inline std::vector<int32_t> test_prompt(int32_t length, int32_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(length));
  for (int32_t i = 0; i < length; ++i) p[static_cast<size_t>(i)] = (i * 5 + salt * 11 + 1) % 64;
  return p;
}

}  // namespace pagoda::engine::testing_support
