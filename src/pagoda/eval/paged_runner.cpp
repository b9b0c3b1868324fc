#include "pagoda/eval/paged_runner.h"

#include <algorithm>
#include <chrono>

namespace pagoda::eval {

StatusOr<std::unique_ptr<PagedRunner>> PagedRunner::create(std::unique_ptr<runtime::ModelRunner> runner,
                                                           const PagedRunnerOptions& options) {
  if (!runner) return invalid_argument_error("PagedRunner needs a model runner");
  if (options.prefill_chunk < 1)
    return invalid_argument_error("prefill chunk must be at least 1 token, got {}", options.prefill_chunk);
  if (options.max_sequence_tokens < 1)
    return invalid_argument_error("max sequence tokens must be positive, got {}", options.max_sequence_tokens);
  const KvPoolShape& geometry = runner->kv_geometry();
  if (static_cast<int64_t>(geometry.num_blocks) * geometry.block_size < options.max_sequence_tokens)
    return invalid_argument_error("the runner's KV pool holds {} tokens, fewer than the {} a sequence may need",
                                  static_cast<int64_t>(geometry.num_blocks) * geometry.block_size,
                                  options.max_sequence_tokens);
  if (options.kv_compression.enabled() && geometry.num_blocks < options.num_kv_blocks())
    return invalid_argument_error("token eviction needs {} KV blocks (the sequence plus a compaction's fresh "
                                  "blocks), the runner's pool has {}",
                                  options.num_kv_blocks(), geometry.num_blocks);

  kv::KvCacheConfig kv_config;
  kv_config.num_blocks = geometry.num_blocks;
  kv_config.block_size = geometry.block_size;
  kv_config.num_host_blocks = runner->capabilities().host_kv_blocks;
  kv_config.enable_prefix_cache = false;
  kv_config.record_events = false;
  PAGODA_ASSIGN_OR_RETURN(auto kv, kv::KvCacheManager::create(kv_config));

  engine::EngineConfig engine_config;
  engine_config.scheduler.max_running_sequences = 1;
  engine_config.scheduler.max_tokens_per_step = options.prefill_chunk;
  // One request at a time, every prompt row wanted: its chunks are the prefill chunk, as before the cap.
  engine_config.scheduler.max_prompt_rows_per_step = options.prefill_chunk;
  engine_config.scheduler.preemption_mode =
      kv_config.num_host_blocks > 0 ? options.preemption_mode : engine::PreemptionMode::kRecompute;
  engine_config.max_queued_requests = 1;
  engine_config.kv_compression = options.kv_compression;
  engine_config.kv_compression.compact_during_prefill = false;
  PAGODA_ASSIGN_OR_RETURN(auto engine, engine::Engine::create(engine_config, *runner, *kv));
  return std::unique_ptr<PagedRunner>(
      new PagedRunner(std::move(runner), options, std::move(kv), std::move(engine)));
}

PagedRunner::PagedRunner(std::unique_ptr<runtime::ModelRunner> runner, PagedRunnerOptions options,
                         std::unique_ptr<kv::KvCacheManager> kv, std::unique_ptr<engine::Engine> engine)
    : runner_(std::move(runner)), options_(options), kv_(std::move(kv)), engine_(std::move(engine)) {}

Status PagedRunner::check_tokens(std::span<const int32_t> tokens, int64_t extra) const {
  if (tokens.empty()) return invalid_argument_error("no tokens to run");
  const int64_t total = static_cast<int64_t>(tokens.size()) + extra;
  if (total > options_.max_sequence_tokens)
    return invalid_argument_error("sequence of {} tokens exceeds the runner's {} tokens", total,
                                  options_.max_sequence_tokens);
  const int32_t vocab = vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return invalid_argument_error("token id {} at position {} is outside the vocabulary (0..{})", tokens[i], i,
                                    vocab - 1);
  return ok_status();
}

StatusOr<std::vector<engine::RequestOutput>> PagedRunner::run(engine::GenerationRequest request,
                                                              double* first_token_seconds) {
  const auto start = std::chrono::steady_clock::now();
  PAGODA_ASSIGN_OR_RETURN(auto stream, engine_->submit(std::move(request)));
  std::vector<engine::RequestOutput> outputs;
  bool finished = false;
  bool first = true;
  while (!finished) {
    const bool stepped = engine_->step();
    while (auto out = stream->next(std::chrono::milliseconds(0))) {
      finished |= out->finished;
      if (first_token_seconds != nullptr && first && !out->choices.empty() && !out->choices[0].tokens.empty()) {
        first = false;
        *first_token_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      outputs.push_back(std::move(*out));
    }
    if (!stepped && !finished) return internal_error("the engine stopped before the request finished");
  }
  if (outputs.back().failed()) return outputs.back().failure();
  return outputs;
}

Status PagedRunner::score(std::span<const int32_t> tokens, std::vector<float>& logits) {
  PAGODA_RETURN_IF_ERROR(check_tokens(tokens, 0));
  engine::GenerationRequest request;
  request.prompt_tokens.assign(tokens.begin(), tokens.end());
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = 0;  // prompt logits only
  request.return_prompt_logits = true;
  if (options_.kv_compression.enabled()) {
    request.kv_compression = options_.kv_compression;
    request.kv_compression->compact_during_prefill = true;
  }
  PAGODA_ASSIGN_OR_RETURN(auto outputs, run(std::move(request)));
  logits.clear();
  for (const engine::RequestOutput& out : outputs)
    logits.insert(logits.end(), out.prompt_logits.begin(), out.prompt_logits.end());
  const size_t expected = tokens.size() * static_cast<size_t>(vocab_size());
  if (logits.size() != expected)
    return internal_error("scoring {} tokens returned {} logits, expected {}", tokens.size(), logits.size(),
                          expected);
  return ok_status();
}

StatusOr<GreedyOutput> PagedRunner::greedy(std::span<const int32_t> prompt, int32_t max_new_tokens,
                                           std::span<const int32_t> stop_ids) {
  if (max_new_tokens < 1) return invalid_argument_error("max_new_tokens must be >= 1, got {}", max_new_tokens);
  PAGODA_RETURN_IF_ERROR(check_tokens(prompt, max_new_tokens));
  engine::GenerationRequest request;
  request.prompt_tokens.assign(prompt.begin(), prompt.end());
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = max_new_tokens;
  request.sampling.ignore_eos = true;  // only stop_ids end the run
  request.sampling.stop_token_ids.assign(stop_ids.begin(), stop_ids.end());
  request.return_logits = true;
  const auto start = std::chrono::steady_clock::now();
  double first_token = 0.0;
  PAGODA_ASSIGN_OR_RETURN(auto outputs, run(std::move(request), &first_token));
  GreedyOutput result;
  result.prefill_seconds = first_token;
  result.decode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - first_token;
  std::vector<float> rows;
  for (const engine::RequestOutput& out : outputs)
    for (const engine::ChoiceDelta& delta : out.choices) {
      result.tokens.insert(result.tokens.end(), delta.tokens.begin(), delta.tokens.end());
      if (delta.stop_token) result.tokens.push_back(delta.stop_token->token);
      rows.insert(rows.end(), delta.logits.begin(), delta.logits.end());
    }
  const size_t vocab = static_cast<size_t>(vocab_size());
  if (rows.size() != result.tokens.size() * vocab)
    return internal_error("greedy run returned {} logits for {} tokens", rows.size(), result.tokens.size());
  for (size_t i = 0; i < result.tokens.size(); ++i)
    result.logits.emplace_back(rows.begin() + static_cast<int64_t>(i * vocab),
                               rows.begin() + static_cast<int64_t>((i + 1) * vocab));
  return result;
}

}  // namespace pagoda::eval
