// The engine on the CUDA runner with sampling on the GPU (RowSampling::on_device),
// against the same engine taking every row's logits to the host sampler, on a
// committed fixture model: greedy outputs identical, with top logprobs and
// penalties on the device too, and seeded GPU draws reproducible whatever else
// is batched.

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/runtime/delegating_model_runner.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::cuda {
namespace {

using namespace std::chrono_literals;

std::filesystem::path fixture(const char* name) {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/models" / name;
}

// The same runner with device sampling hidden: the engine samples every row on the host.
class HostSamplingRunner final : public runtime::DelegatingModelRunner {
 public:
  using DelegatingModelRunner::DelegatingModelRunner;
  runtime::RunnerCapabilities capabilities() const override { return {}; }
  std::vector<int32_t> eos_token_ids() const override { return {}; }  // fixed-length outputs
};

// A device-sampling runner with no eos (random-ish fixtures would stop early); its steps overlap as the
// CUDA runner's do (launch and collect go straight to it).
class NoEosRunner final : public runtime::DelegatingModelRunner {
 public:
  using DelegatingModelRunner::DelegatingModelRunner;
  std::vector<int32_t> eos_token_ids() const override { return {}; }
  Status launch(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) override {
    return inner().launch(batch, rows);
  }
  StatusOr<runtime::StepResult> collect() override { return inner().collect(); }
};

// One CUDA runner (llama_f32 fixture) that several engines use one after
// another: the same GEMM plans and weights, so identical batches give
// identical logits whichever engine runs them.
std::unique_ptr<CudaModelRunner> make_runner() {
  CudaModelOptions options;
  options.max_num_seqs = 16;
  options.max_num_tokens = 512;
  options.max_model_len = 256;
  options.show_progress = false;
  auto model = CudaModel::load(fixture("llama_f32"), options);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  CudaRunnerOptions runner_options;
  runner_options.num_blocks = 128;
  runner_options.print_report = false;
  auto r = CudaModelRunner::create(std::move(model).value(), runner_options);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

struct GpuEngine {
  GpuEngine(CudaModelRunner& runner, bool device_sampling,
            engine::OverlapSteps overlap = engine::OverlapSteps::kAuto) {
    if (device_sampling) {
      seam = std::make_unique<NoEosRunner>(runner);
    } else {
      seam = std::make_unique<HostSamplingRunner>(runner);
    }
    kv::KvCacheConfig kc;
    kc.num_blocks = runner.kv_geometry().num_blocks;
    kc.block_size = runner.kv_geometry().block_size;
    kv = std::move(kv::KvCacheManager::create(kc)).value();
    engine::EngineConfig ec;
    ec.scheduler.max_running_sequences = 16;
    ec.scheduler.max_tokens_per_step = 64;  // chunked prefills next to decodes
    ec.overlap_steps = overlap;
    eng = std::make_unique<engine::Engine>(ec, *seam, *kv);
  }
  void run() {
    int guard = 0;
    while (eng->step()) ASSERT_LT(++guard, 10000);
  }
  std::unique_ptr<runtime::ModelRunner> seam;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<engine::Engine> eng;
};

struct Output {
  std::vector<int32_t> tokens;
  std::vector<engine::SampledToken> logprobs;
  std::string error;
  bool finished = false;
};

Output collect(engine::RequestStream& stream) {
  Output o;
  while (auto out = stream.next(0ms)) {
    for (const auto& c : out->choices) {
      o.tokens.insert(o.tokens.end(), c.tokens.begin(), c.tokens.end());
      o.logprobs.insert(o.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
    }
    if (out->finished) {
      o.finished = true;
      o.error = out->error;
    }
  }
  return o;
}

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p(length);
  for (int32_t i = 0; i < length; ++i) p[i] = (i * 37 + salt * 101 + 7) % 256;
  return p;
}

engine::GenerationRequest request(std::vector<int32_t> prompt, int32_t max_tokens, float temperature) {
  engine::GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(EngineOnGpu, DeviceSamplingGivesTheHostSamplersGreedyOutputsInMixedSteps) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto runner = make_runner();
  GpuEngine device(*runner, true), host(*runner, false);
  std::vector<std::shared_ptr<engine::RequestStream>> d, h;
  ASSERT_TRUE(runner->capabilities().edits_logits_on_device && runner->capabilities().scores_on_device);
  for (int i = 0; i < 6; ++i) {
    engine::GenerationRequest r = request(prompt_of(20 + 9 * i, i), 12, 0.0f);
    if (i == 1) r.sampling.logprobs = 3;  // scored on the device: the drawn token's top 3
    if (i == 2) r.sampling.repetition_penalty = 1.3f;  // penalized on the device
    if (i == 3) {
      r.sampling.frequency_penalty = 0.9f;
      r.sampling.presence_penalty = 0.6f;
      r.sampling.repetition_penalty = 0.8f;
      r.sampling.logprobs = 2;
    }
    d.push_back(*device.eng->submit(r));
    h.push_back(*host.eng->submit(r));
  }
  device.run();  // one after the other on the shared runner
  host.run();
  for (int i = 0; i < 6; ++i) {
    const Output a = collect(*d[i]), b = collect(*h[i]);
    ASSERT_TRUE(a.finished && b.finished) << i;
    EXPECT_TRUE(a.error.empty()) << a.error;
    EXPECT_EQ(a.tokens.size(), 12u);
    EXPECT_EQ(a.tokens, b.tokens) << "request " << i;
    if (i != 1 && i != 3) continue;
    ASSERT_EQ(a.logprobs.size(), 12u);
    ASSERT_EQ(b.logprobs.size(), 12u);
    for (size_t t = 0; t < 12; ++t) {
      EXPECT_NEAR(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-5) << i << " " << t;
      ASSERT_EQ(a.logprobs[t].top_logprobs.size(), i == 1 ? 3u : 2u);
      ASSERT_EQ(a.logprobs[t].top_logprobs.size(), b.logprobs[t].top_logprobs.size());
      for (size_t k = 0; k < a.logprobs[t].top_logprobs.size(); ++k) {
        EXPECT_EQ(a.logprobs[t].top_logprobs[k].token, b.logprobs[t].top_logprobs[k].token) << i << " " << t;
        EXPECT_NEAR(a.logprobs[t].top_logprobs[k].logprob, b.logprobs[t].top_logprobs[k].logprob, 1e-5);
      }
    }
  }
}

// Prompt scoring (sampling.prompt_logprobs) on the device (runtime::RowSampling::score_token: the
// runner returns each prompt row's score, not its logits) against the host engine scoring the rows'
// logits with engine::score_token, on the same runner: the ranks and top tokens identical, the logprobs
// within 1e-5, in chunked prefills beside other requests' decode rows; then every block back.
TEST(EngineOnGpu, PromptScoresOnTheDeviceAreTheHostEnginesScores) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto runner = make_runner();
  ASSERT_TRUE(runner->capabilities().scores_on_device);
  GpuEngine device(*runner, true), host(*runner, false);
  std::vector<std::shared_ptr<engine::RequestStream>> d, h;
  for (int i = 0; i < 4; ++i) {
    engine::GenerationRequest r = request(prompt_of(30 + 41 * i, i), i == 3 ? 0 : 6, 0.0f);
    if (i != 1) r.sampling.prompt_logprobs = i == 0 ? 0 : 5 * i;  // request 1 is plain, beside the others
    d.push_back(*device.eng->submit(r));
    h.push_back(*host.eng->submit(r));
  }
  device.run();
  host.run();
  for (int i = 0; i < 4; ++i) {
    std::vector<engine::SampledToken> a, b;
    for (auto [stream, out] : {std::pair{d[i].get(), &a}, std::pair{h[i].get(), &b}})
      while (auto o = stream->next(0ms)) out->insert(out->end(), o->prompt_logprobs.begin(), o->prompt_logprobs.end());
    const size_t expected = i == 1 ? 0 : static_cast<size_t>(30 + 41 * i - 1);
    ASSERT_EQ(a.size(), expected) << "request " << i;
    ASSERT_EQ(b.size(), expected) << "request " << i;
    for (size_t t = 0; t < a.size(); ++t) {
      EXPECT_EQ(a[t].token, b[t].token);
      EXPECT_EQ(a[t].rank, b[t].rank) << "request " << i << " token " << t;
      EXPECT_NEAR(a[t].logprob, b[t].logprob, 1e-5) << "request " << i << " token " << t;
      ASSERT_EQ(a[t].top_logprobs.size(), b[t].top_logprobs.size());
      for (size_t j = 0; j < a[t].top_logprobs.size(); ++j) {
        EXPECT_EQ(a[t].top_logprobs[j].token, b[t].top_logprobs[j].token);
        EXPECT_NEAR(a[t].top_logprobs[j].logprob, b[t].top_logprobs[j].logprob, 1e-5);
      }
    }
  }
  EXPECT_EQ(device.kv->num_available_blocks(), device.kv->num_blocks());
}

// Overlapped steps (engine::EngineConfig::overlap_steps): graph decode steps are launched before the
// step before them is read, their inputs taken on the device from that step's sampled rows. Greedy and
// seeded draws must be those of the synchronous engine, token for token, and every block comes back.
TEST(EngineOnGpu, OverlappedStepsGiveTheSynchronousEnginesTokens) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto runner = make_runner();
  GpuEngine overlapped(*runner, true, engine::OverlapSteps::kOn), sync(*runner, true, engine::OverlapSteps::kOff);
  std::vector<std::shared_ptr<engine::RequestStream>> a, b;
  for (int i = 0; i < 10; ++i) {
    engine::GenerationRequest r = request(prompt_of(5 + 7 * i, 60 + i), 10 + 3 * i, i % 2 == 0 ? 0.0f : 0.8f);
    r.sampling.seed = 100 + i;
    a.push_back(*overlapped.eng->submit(r));
    b.push_back(*sync.eng->submit(r));
  }
  overlapped.run();  // one after the other on the shared runner
  sync.run();
  for (int i = 0; i < 10; ++i) {
    const Output x = collect(*a[i]), y = collect(*b[i]);
    ASSERT_TRUE(x.finished && y.finished) << i;
    EXPECT_TRUE(x.error.empty()) << x.error;
    EXPECT_EQ(x.tokens.size(), static_cast<size_t>(10 + 3 * i)) << i;
    EXPECT_EQ(x.tokens, y.tokens) << "request " << i;
    ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
  }
  EXPECT_GT(overlapped.eng->stats().overlapped_steps, 20);
  EXPECT_EQ(sync.eng->stats().overlapped_steps, 0);
  EXPECT_EQ(overlapped.kv->num_available_blocks(), overlapped.kv->num_blocks());
}

TEST(EngineOnGpu, SeededGpuSamplingIsReproducibleWhateverTheBatch) {
  PAGODA_SKIP_WITHOUT_GPU();
  engine::GenerationRequest r = request(prompt_of(33, 9), 16, 1.0f);
  r.sampling.seed = 5;
  r.sampling.top_p = 0.9f;
  r.sampling.top_k = 50;
  auto runner = make_runner();
  GpuEngine alone(*runner, true), crowded(*runner, true);
  auto a = *alone.eng->submit(r);
  alone.run();
  std::vector<std::shared_ptr<engine::RequestStream>> others;
  for (int i = 0; i < 5; ++i) others.push_back(*crowded.eng->submit(request(prompt_of(10 + i, 40 + i), 16, 0.7f)));
  auto b = *crowded.eng->submit(r);
  crowded.run();
  const Output oa = collect(*a), ob = collect(*b);
  ASSERT_TRUE(oa.finished && ob.finished);
  EXPECT_EQ(oa.tokens, ob.tokens);
  std::set<int32_t> distinct(oa.tokens.begin(), oa.tokens.end());
  EXPECT_GT(distinct.size(), 1u);
  for (auto& s : others) EXPECT_EQ(collect(*s).tokens.size(), 16u);
}


// Allows a fixed set of tokens forever (a stand-in for a grammar state that loops).
class FixedSetConstraint final : public engine::TokenConstraint {
 public:
  explicit FixedSetConstraint(std::vector<int32_t> allowed) : allowed_(std::move(allowed)) {}
  size_t fill_allowed(std::span<uint64_t> mask) override {
    for (int32_t t : allowed_) mask[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
    return allowed_.size();
  }
  bool accept(int32_t token) override { return std::find(allowed_.begin(), allowed_.end(), token) != allowed_.end(); }
  std::unique_ptr<engine::TokenConstraint> clone() const override { return std::make_unique<FixedSetConstraint>(*this); }

 private:
  std::vector<int32_t> allowed_;
};

// Structured outputs on the GPU: constrained rows are masked and drawn on the device (no logits
// leave it) and give the host path's greedy tokens and logprobs; sampled rows stay inside the set.
TEST(EngineOnGpu, MaskedRowsOnTheDeviceGiveTheHostPathsGreedyOutputs) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto runner = make_runner();
  ASSERT_TRUE(runner->capabilities().samples_masked_on_device);
  std::vector<int32_t> allowed;
  for (int32_t t = 3; t < 256; t += 7) allowed.push_back(t);
  GpuEngine device(*runner, true), host(*runner, false);
  std::vector<std::shared_ptr<engine::RequestStream>> d, h;
  for (int i = 0; i < 4; ++i) {
    engine::GenerationRequest r = request(prompt_of(17 + 5 * i, 60 + i), 10, 0.0f);
    if (i != 3) r.constraint = std::make_shared<FixedSetConstraint>(allowed);  // request 3: unconstrained neighbour
    d.push_back(*device.eng->submit(r));
    h.push_back(*host.eng->submit(r));
  }
  engine::GenerationRequest sampled = request(prompt_of(25, 77), 10, 1.0f);
  sampled.sampling.seed = 3;
  sampled.constraint = std::make_shared<FixedSetConstraint>(allowed);
  auto s = *device.eng->submit(sampled);
  device.run();
  host.run();
  for (int i = 0; i < 4; ++i) {
    const Output a = collect(*d[i]), b = collect(*h[i]);
    ASSERT_TRUE(a.finished && b.finished) << i;
    EXPECT_TRUE(a.error.empty()) << a.error;
    ASSERT_EQ(a.tokens.size(), 10u);
    EXPECT_EQ(a.tokens, b.tokens) << "request " << i;
    if (i != 3) {
      for (int32_t t : a.tokens) EXPECT_EQ((t - 3) % 7, 0) << t;
    }
  }
  const Output os = collect(*s);
  ASSERT_TRUE(os.finished);
  EXPECT_TRUE(os.error.empty()) << os.error;
  ASSERT_EQ(os.tokens.size(), 10u);
  for (int32_t t : os.tokens) EXPECT_EQ((t - 3) % 7, 0) << t;
}

// Turns the engine's deferred masks (RowSampling::mask_source, filled while the forward runs)
// back into masks filled before the step (RowSampling::allowed): the two must draw the same.
class EagerMaskRunner final : public runtime::DelegatingModelRunner {
 public:
  using DelegatingModelRunner::DelegatingModelRunner;
  std::vector<int32_t> eos_token_ids() const override { return {}; }
  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) override {
    const size_t words = (static_cast<size_t>(vocab_size()) + 63) / 64;
    std::vector<runtime::RowSampling> eager(rows.begin(), rows.end());
    masks_.assign(rows.size() * words, 0);
    for (size_t r = 0; r < eager.size(); ++r) {
      if (eager[r].mask_source == nullptr) continue;
      eager[r].mask_source->fill_mask(r, std::span<uint64_t>(masks_.data() + r * words, words));
      eager[r].mask_source = nullptr;
      eager[r].allowed = masks_.data() + r * words;
      ++eager_masks;
    }
    return DelegatingModelRunner::execute(batch, eager);
  }
  int64_t eager_masks = 0;

 private:
  std::vector<uint64_t> masks_;
};

// Allows a set that changes with every accepted token, and nothing after `dead_after` tokens.
class ShiftingSetConstraint final : public engine::TokenConstraint {
 public:
  explicit ShiftingSetConstraint(int32_t dead_after) : dead_after_(dead_after) {}
  size_t fill_allowed(std::span<uint64_t> mask) override {
    if (accepted_ >= dead_after_) return 0;
    size_t n = 0;
    for (int32_t t = 2 + accepted_ % 5; t < 256; t += 5 + accepted_ % 3, ++n)
      mask[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
    return n;
  }
  bool accept(int32_t token) override {
    std::vector<uint64_t> mask(4, 0);
    if (fill_allowed(mask) == 0 || token < 0 || token >= 256 || !((mask[token >> 6] >> (token & 63)) & 1)) return false;
    ++accepted_;
    return true;
  }
  std::unique_ptr<engine::TokenConstraint> clone() const override {
    return std::make_unique<ShiftingSetConstraint>(*this);
  }

 private:
  int32_t dead_after_;
  int32_t accepted_ = 0;
};

// The overlapped path: masks filled while the GPU runs the forward and written straight into the
// upload buffer draw exactly what masks filled before the step draw (greedy and seeded rows), a
// dead end found during the step fails only its request, and the neighbours go on.
TEST(EngineOnGpu, DeferredMasksDrawWhatMasksFilledBeforeTheStepDraw) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto runner = make_runner();
  EagerMaskRunner eager_seam(*runner);
  kv::KvCacheConfig kc;
  kc.num_blocks = runner->kv_geometry().num_blocks;
  kc.block_size = runner->kv_geometry().block_size;
  auto eager_kv = std::move(kv::KvCacheManager::create(kc)).value();
  GpuEngine deferred(*runner, true), eager(*runner, true);
  engine::EngineConfig ec;
  ec.scheduler.max_running_sequences = 16;
  ec.scheduler.max_tokens_per_step = 64;
  eager.eng = std::make_unique<engine::Engine>(ec, eager_seam, *eager_kv);
  std::vector<std::shared_ptr<engine::RequestStream>> d, e;
  for (int i = 0; i < 7; ++i) {
    engine::GenerationRequest r = request(prompt_of(13 + 3 * i, 30 + i), 12, i % 2 == 0 ? 0.0f : 1.0f);
    r.sampling.seed = 40 + i;
    if (i != 5) r.constraint = std::make_shared<ShiftingSetConstraint>(i == 3 ? 4 : 1000);  // 3: dead end; 5: plain
    d.push_back(*deferred.eng->submit(r));
    e.push_back(*eager.eng->submit(r));
  }
  deferred.run();
  eager.run();
  EXPECT_GT(eager_seam.eager_masks, 0);
  for (int i = 0; i < 7; ++i) {
    const Output a = collect(*d[i]), b = collect(*e[i]);
    ASSERT_TRUE(a.finished && b.finished) << i;
    EXPECT_EQ(a.tokens, b.tokens) << "request " << i;
    if (i == 3) {
      EXPECT_EQ(a.tokens.size(), 4u);
      EXPECT_NE(a.error.find("no token can continue"), std::string::npos) << a.error;
      EXPECT_NE(b.error.find("no token can continue"), std::string::npos) << b.error;
    } else {
      EXPECT_TRUE(a.error.empty()) << i << ": " << a.error;
      EXPECT_EQ(a.tokens.size(), 12u) << i;
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda
