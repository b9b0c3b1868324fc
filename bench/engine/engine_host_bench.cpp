// The engine's own per-step host cost, without a model: pagoda_engine_host_bench
// drives engine::Engine (scheduler, KV manager, prefix cache, request streams)
// over a runner that does no work and answers every row with one token, as a
// runner that samples on the device would. With all requests submitted at once
// (issue 23's 1,000 x 1,000 shape, fewer output tokens by default), the wall
// time per step is what the engine adds to each GPU step when nothing overlaps:
// run it under perf to see where it goes.
//
//   pagoda_engine_host_bench --num-requests 1000 --input-len 1000 --output-len 200 --max-num-seqs 512
//
// Prints one line: steps, decode-only steps, wall, us per step (all steps and
// decode-only steps at their mean batch). Single-threaded besides the engine's
// own thread and this client thread, which polls the streams as the GPU
// benchmark's client does.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/model_runner.h"

namespace {

using Clock = std::chrono::steady_clock;
using pagoda::ForwardBatch;

// Answers every logits row with token 1 and spends no time; counts steps and
// decode rows, timed between the end of one execute and the start of the next.
class NullRunner final : public pagoda::runtime::ModelRunner {
 public:
  NullRunner(int32_t num_blocks, int32_t block_size, int32_t vocab, int32_t max_context)
      : vocab_(vocab), max_context_(max_context) {
    shape_.num_layers = 1;
    shape_.num_blocks = num_blocks;
    shape_.block_size = block_size;
    shape_.num_kv_heads = 1;
    shape_.head_dim = 1;
  }
  pagoda::StatusOr<pagoda::runtime::StepResult> execute(const ForwardBatch& batch,
                                                        std::span<const pagoda::runtime::RowSampling>) override {
    const auto now = Clock::now();
    bool decode = true;
    for (const auto& s : batch.sequences) decode &= s.num_new_tokens == 1;
    if (steps > 0) {
      const double gap = std::chrono::duration<double>(now - last_end_).count();
      host_seconds += gap;
      if (decode) {
        decode_host_seconds += gap;
        ++decode_steps;
        decode_rows += static_cast<int64_t>(batch.sequences.size());
      }
    }
    ++steps;
    pagoda::runtime::StepResult out;
    out.tokens.assign(static_cast<size_t>(batch.num_logit_rows()), 1);
    out.logprobs.assign(out.tokens.size(), 0.0f);
    last_end_ = Clock::now();
    return out;
  }
  pagoda::Status copy_blocks(std::span<const pagoda::runtime::BlockCopy>) override { return pagoda::ok_status(); }
  const pagoda::KvPoolShape& kv_geometry() const override { return shape_; }
  pagoda::runtime::RunnerCapabilities capabilities() const override {
    pagoda::runtime::RunnerCapabilities c;
    c.samples_on_device = true;
    return c;
  }
  int32_t vocab_size() const override { return vocab_; }
  int32_t max_context_length() const override { return max_context_; }
  std::vector<int32_t> eos_token_ids() const override { return {}; }

  int64_t steps = 0, decode_steps = 0, decode_rows = 0;
  double host_seconds = 0, decode_host_seconds = 0;  // between consecutive executes

 private:
  pagoda::KvPoolShape shape_;
  int32_t vocab_, max_context_;
  Clock::time_point last_end_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pagoda_engine_host_bench: the engine's per-step host cost over a runner that does no work"};
  int32_t num_requests = 1000, input_len = 1000, output_len = 200, max_num_seqs = 512, max_tokens = 8192;
  int32_t num_blocks = 114470, vocab = 128256;
  app.add_option("--num-requests", num_requests)->check(CLI::PositiveNumber);
  app.add_option("--input-len", input_len)->check(CLI::PositiveNumber);
  app.add_option("--output-len", output_len)->check(CLI::PositiveNumber);
  app.add_option("--max-num-seqs", max_num_seqs)->check(CLI::PositiveNumber);
  app.add_option("--max-tokens-per-step", max_tokens)->check(CLI::PositiveNumber);
  app.add_option("--kv-blocks", num_blocks)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const int32_t block_size = 16;
  NullRunner runner(num_blocks, block_size, vocab, input_len + output_len + block_size);
  pagoda::kv::KvCacheConfig kv_config;
  kv_config.num_blocks = num_blocks;
  kv_config.block_size = block_size;
  kv_config.enable_prefix_cache = true;
  kv_config.record_events = false;
  auto kv = pagoda::kv::KvCacheManager::create(kv_config);
  if (!kv.ok()) {
    std::fprintf(stderr, "error: KV manager: %s\n", kv.status().to_string().c_str());
    return 1;
  }
  pagoda::engine::EngineConfig config;
  config.scheduler.max_running_sequences = max_num_seqs;
  config.scheduler.max_tokens_per_step = max_tokens;
  config.max_queued_requests = num_requests + 1;
  pagoda::engine::Engine engine(config, runner, **kv);
  engine.start();

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(10, vocab - 1);
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<pagoda::engine::RequestStream>> streams;
  for (int32_t i = 0; i < num_requests; ++i) {
    pagoda::engine::GenerationRequest request;
    request.prompt_tokens.resize(static_cast<size_t>(input_len));
    for (auto& t : request.prompt_tokens) t = token(rng);
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = output_len;
    request.sampling.ignore_eos = true;
    auto stream = engine.submit(std::move(request));
    if (!stream.ok()) {
      std::fprintf(stderr, "error: submit: %s\n", stream.status().to_string().c_str());
      return 1;
    }
    streams.push_back(*stream);
  }
  std::vector<bool> done(streams.size(), false);
  size_t finished = 0;
  int64_t tokens = 0;
  while (finished < streams.size()) {
    bool any = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (done[i]) continue;
      while (auto out = streams[i]->next(std::chrono::milliseconds(0))) {
        any = true;
        for (const auto& c : out->choices) tokens += static_cast<int64_t>(c.tokens.size());
        if (!out->error.empty()) std::fprintf(stderr, "request %zu failed: %s\n", i, out->error.c_str());
        if (out->finished) {
          done[i] = true;
          ++finished;
          break;
        }
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  engine.shutdown(std::chrono::milliseconds(0));
  const double per_step_us = runner.steps > 1 ? runner.host_seconds * 1e6 / (runner.steps - 1) : 0;
  const double decode_us = runner.decode_steps ? runner.decode_host_seconds * 1e6 / runner.decode_steps : 0;
  const double batch = runner.decode_steps ? double(runner.decode_rows) / runner.decode_steps : 0;
  std::printf("engine host: %d requests x %d in / %d out, %d seqs, %d tokens/step: %lld output tokens, %lld steps "
              "in %.2f s; host %.0f us per step; decode-only steps %lld, %.0f us each at mean batch %.1f "
              "(%.2f us per row)\n",
              num_requests, input_len, output_len, max_num_seqs, max_tokens, static_cast<long long>(tokens),
              static_cast<long long>(runner.steps), wall, per_step_us, static_cast<long long>(runner.decode_steps),
              decode_us, batch, batch > 0 ? decode_us / batch : 0.0);
  return 0;
}
