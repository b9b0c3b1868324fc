#include "pagoda/engine/engine.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <random>

#include "pagoda/core/thread_pool.h"
#include "pagoda/engine/lower_tier_loader.h"
#include "pagoda/engine/lower_tier_spiller.h"
#include "pagoda/runtime/host_block_layout.h"

namespace pagoda::engine {
namespace {

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// splitmix64's finalizer: spreads (seed, choice) over 64 bits for the device key.
uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Every choice of the request has ended (its finished delta is out or pending).
bool all_choices_finished(const RequestState& req) {
  const bool all_choices_exist = req.forked || req.request.sampling.n == 1 || req.aborted;
  return all_choices_exist && req.num_finished >= static_cast<int32_t>(req.sequences.size());
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::create(EngineConfig config, runtime::ModelRunner& runner,
                                                 kv::KvCacheManager& kv) {
  const KvPoolShape& geometry = runner.kv_geometry();
  if (geometry.block_size != kv.block_size() || geometry.num_blocks != kv.num_blocks())
    return invalid_argument_error(
        "the KV manager has {} blocks of {} tokens but the model runner's KV pool holds {} blocks of {}",
        kv.num_blocks(), kv.block_size(), geometry.num_blocks, geometry.block_size);
  if (kv.num_host_blocks() != runner.capabilities().host_kv_blocks)
    return invalid_argument_error("the KV manager has a host tier of {} blocks but the model runner's host pool "
                                  "holds {}", kv.num_host_blocks(), runner.capabilities().host_kv_blocks);
  if (config.scheduler.preemption_mode == PreemptionMode::kSwap && kv.num_host_blocks() == 0)
    return invalid_argument_error("preemption by swap needs a host tier (the KV manager has none)");
  if (config.lower_tiers != nullptr && !config.lower_tiers->empty()) {
    if (kv.num_host_blocks() == 0)
      return invalid_argument_error("KV tiers below the host (disk, redis) need a host tier (--kv-offload-memory)");
    if (!kv.has_stable_keys())
      return invalid_argument_error("KV tiers below the host need stable block keys in the KV manager");
    if (!runner.capabilities().host_block_access)
      return unimplemented_error("KV tiers below the host: this model runner cannot read or write host blocks");
    const size_t block_bytes = runtime::host_block_layout(geometry).block_bytes();
    if (block_bytes != config.lower_tiers->block_bytes())
      return invalid_argument_error("KV tiers below the host store blocks of {} bytes, the runner's are {}",
                                    config.lower_tiers->block_bytes(), block_bytes);
  }
  return std::make_unique<Engine>(std::move(config), runner, kv);
}

Engine::Engine(EngineConfig config, runtime::ModelRunner& runner, kv::KvCacheManager& kv)
    : config_(std::move(config)),
      runner_(runner),
      kv_(kv),
      scheduler_(config_.scheduler, kv),
      vocab_size_(runner.vocab_size()),
      max_context_(runner.max_context_length()),
      eos_ids_(runner.eos_token_ids()),
      kv_block_size_(kv.block_size()),
      kv_num_blocks_(kv.num_blocks()),
      runner_compacts_kv_(runner.capabilities().compacts_kv),
      runner_kv_scores_(runner.capabilities().kv_attention_scores),
      runner_kv_head_budgets_(runner.capabilities().kv_head_budgets),
      kv_num_layers_(runner.kv_geometry().num_layers),
      unseeded_salt_(mix64(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32))) {
  const bool lower_tiers = config_.lower_tiers != nullptr && !config_.lower_tiers->empty();
  overlap_ = !lower_tiers && (config_.overlap_steps == OverlapSteps::kOn ||
                              (config_.overlap_steps == OverlapSteps::kAuto && runner.capabilities().overlaps_steps));
  if (!config_.text_decoder_factory)
    config_.text_decoder_factory = [](std::span<const int32_t>, bool) { return make_token_id_text_decoder(); };
  if (config_.lower_tiers != nullptr && !config_.lower_tiers->empty()) {
    spiller_ = std::make_unique<LowerTierSpiller>(runner_, *config_.lower_tiers);
    loader_ = std::make_unique<LowerTierLoader>(*config_.lower_tiers, std::max(1, config_.lower_tier_readers), [this] {
      {
        std::lock_guard lock(mutex_);
        loads_finished_ = true;
      }
      work_ready_.notify_all();
    });
  }
}

Engine::~Engine() {
  shutdown(std::chrono::milliseconds(0));
  // Its readers call back into this engine (mutex_, work_ready_), which are destroyed before it would be.
  loader_.reset();
}

void Engine::start() {
  std::lock_guard lock(mutex_);
  if (thread_state_ != ThreadState::kNotStarted) return;
  thread_state_ = ThreadState::kRunning;
  thread_ = std::thread([this] { loop(); });
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] {
        return stop_thread_ || !pending_submits_.empty() || !pending_aborts_.empty() || !pending_tasks_.empty() ||
               !requests_.empty();
      });
      if (stop_thread_) break;
    }
    if (!step()) {
      // Requests exist but none could run (should not happen); avoid spinning.
      std::unique_lock lock(mutex_);
      work_ready_.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
  collect_all_steps();  // steps launched after shutdown's last task: their blocks go back
  flush_outputs();
  // Tasks queued while the thread was told to stop still run here, on this
  // thread: after this point run_on_engine_thread runs them inline.
  for (;;) {
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard lock(mutex_);
      if (pending_tasks_.empty()) {
        thread_state_ = ThreadState::kExited;
        break;
      }
      tasks.swap(pending_tasks_);
    }
    for (auto& task : tasks) task();
  }
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  bool threaded;
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
    threaded = thread_state_ == ThreadState::kRunning;
  }
  if (!threaded) {
    // Synchronous mode (or already shut down): admit what was submitted, apply
    // the callers' aborts, then cancel whatever is left.
    std::lock_guard inline_lock(inline_mutex_);
    drain_commands();
    collect_all_steps();
    cancel_all_requests();
    settle_lower_tier_loads();
    publish_stats(-1);
    flush_outputs();
    if (spiller_) spiller_->wait_idle();  // the tiers get the last blocks before their owner closes them
    return;
  }
  {
    // In-flight requests finish on their own until the grace period ends.
    std::unique_lock lock(mutex_);
    idle_.wait_for(lock, grace, [&] { return num_in_flight_.load() == 0; });
  }
  // Then the rest is cancelled on the engine thread, which then stops.
  run_on_engine_thread([this] {
    collect_all_steps();
    cancel_all_requests();
    settle_lower_tier_loads();
    flush_outputs();
    return 0;
  });
  {
    std::lock_guard lock(mutex_);
    stop_thread_ = true;
  }
  work_ready_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (spiller_) spiller_->wait_idle();  // the tiers get the last blocks before their owner closes them
}

StatusOr<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest request) {
  const auto& prompt = request.prompt_tokens;
  if (prompt.empty()) return invalid_argument_error("the prompt is empty: at least one token is needed");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab_size_)
      return invalid_argument_error("prompt token {} at index {} is outside the vocabulary [0, {})", prompt[i], i,
                                    vocab_size_);
  if (request.sampling.max_tokens == 0 && request.return_prompt_logits) {
    // Scoring only: the request ends once its prompt logits are out.
    SamplingParams checked = request.sampling;
    checked.max_tokens = 1;
    PAGODA_RETURN_IF_ERROR(validate_sampling_params(checked, vocab_size_));
  } else {
    PAGODA_RETURN_IF_ERROR(validate_sampling_params(request.sampling, vocab_size_));
  }
  PAGODA_ASSIGN_OR_RETURN(const runtime::KvCompressionConfig kv_compression, resolve_kv_compression(request));
  const int64_t total = static_cast<int64_t>(prompt.size()) + request.sampling.max_tokens;
  // kOutOfRange for the two length bounds: callers (the server's
  // "context_length_exceeded") tell them from other bad input by the code.
  if (total > max_context_)
    return out_of_range_error(
        "this model's maximum context length is {} tokens, but {} tokens were requested ({} in the prompt, {} "
        "for the completion); shorten the prompt or lower max_tokens",
        max_context_, total, prompt.size(), request.sampling.max_tokens);
  if ((total + kv_block_size_ - 1) / kv_block_size_ > kv_num_blocks_)
    return out_of_range_error(
        "the request needs {} tokens of KV cache but the server holds only {}; shorten the prompt or lower "
        "max_tokens",
        total, kv_num_blocks_ * kv_block_size_);

  auto state = std::make_unique<RequestState>();
  state->request = std::move(request);
  state->kv_compression = kv_compression;
  state->arrival_time = Clock::now();
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) return failed_precondition_error("the server is shutting down");
    if (num_queued_.load() >= config_.max_queued_requests) {
      ++rejected_queue_full_;
      return resource_exhausted_error("the request queue is full ({} requests waiting)", num_queued_.load());
    }
    state->id = next_request_id_++;
    stream = std::make_shared<RequestStream>(state->id);
    state->stream = stream;
    ++num_queued_;
    ++num_in_flight_;
    pending_submits_.push_back(std::move(state));
  }
  work_ready_.notify_all();
  return stream;
}

StatusOr<runtime::KvCompressionConfig> Engine::resolve_kv_compression(const GenerationRequest& request) const {
  const bool own = request.kv_compression.has_value();
  const runtime::KvCompressionConfig c = own ? *request.kv_compression : config_.kv_compression;
  const std::string_view field = own ? "kv_compression." : "--kv-";
  PAGODA_RETURN_IF_ERROR(runtime::validate_kv_compression(c, field));
  if (!c.enabled()) return c;
  if (!runner_compacts_kv_)
    return unimplemented_error("{}: this runner cannot run token eviction (policy {}): its model has MLA or a "
                               "sliding window, or its KV is shared across layers (--kv-cross-layer-share)",
                               own ? "kv_compression.policy" : "--kv-compression",
                               runtime::kv_compression_policy_name(c.policy));
  if (!runner_kv_scores_ && c.policy != runtime::KvCompressionPolicy::kStreaming)
    return unimplemented_error("{} {}: this device has no attention scores yet; it runs streaming only",
                               own ? "kv_compression.policy" : "--kv-compression",
                               runtime::kv_compression_policy_name(c.policy));
  if (!runner_kv_head_budgets_ && (c.policy == runtime::KvCompressionPolicy::kPyramidKV ||
                                   c.policy == runtime::KvCompressionPolicy::kEntropy))
    return unimplemented_error("{} {}: this runner does not skip the holes that per-head budgets leave (a cuda runner "
                               "built with CudaRunnerOptions::kv_head_budgets off); it runs streaming, h2o and snapkv",
                               own ? "kv_compression.policy" : "--kv-compression",
                               runtime::kv_compression_policy_name(c.policy));
  if (request.sampling.n > 1)
    return invalid_argument_error("{}: token eviction runs one choice per request; n is {}",
                                  own ? "kv_compression" : "--kv-compression", request.sampling.n);
  return c;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard lock(mutex_);
    pending_aborts_.push_back(id);
  }
  work_ready_.notify_all();
}

int32_t Engine::run_on_engine_thread(std::function<int32_t()> work) {
  auto task = std::make_shared<std::packaged_task<int32_t()>>(std::move(work));
  auto result = task->get_future();
  bool queued = false;
  {
    std::lock_guard lock(mutex_);
    // While the thread lives (even when told to stop) it runs every queued task.
    if (thread_state_ == ThreadState::kRunning) {
      pending_tasks_.push_back([task] { (*task)(); });
      queued = true;
    }
  }
  if (queued) {
    work_ready_.notify_all();
  } else {
    // No engine thread: callers take turns on the single-threaded KV manager.
    std::lock_guard inline_lock(inline_mutex_);
    (*task)();
  }
  return result.get();
}

StatusOr<int32_t> Engine::drop_conversation(const std::string& tenant_namespace, std::vector<int32_t> tokens,
                                              int64_t keep_prefix_tokens) {
  return run_on_engine_thread([this, tenant_namespace, tokens = std::move(tokens), keep_prefix_tokens] {
    return kv_.drop_conversation(tenant_namespace, tokens, keep_prefix_tokens);
  });
}

StatusOr<int32_t> Engine::drop_namespace(const std::string& tenant_namespace) {
  return run_on_engine_thread([this, tenant_namespace] { return kv_.drop_namespace(tenant_namespace); });
}

kv::NamespaceKvUsage Engine::namespace_usage(const std::string& tenant_namespace) {
  kv::NamespaceKvUsage usage;
  run_on_engine_thread([this, &tenant_namespace, &usage] {
    usage = kv_.namespace_usage(tenant_namespace);
    return 0;
  });
  return usage;
}

void Engine::visit_kv_cache(const std::function<void(kv::KvCacheManager&)>& read) {
  run_on_engine_thread([this, &read] {
    read(kv_);
    return 0;
  });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(stats_mutex_);
  EngineStats out = stats_;
  out.num_queued_requests = num_queued_.load();
  out.num_requests_in_flight = num_in_flight_.load();
  out.requests_rejected_queue_full = rejected_queue_full_.load();
  // Live: the tiers' writer threads go on after the last step.
  if (config_.lower_tiers != nullptr) out.lower_tiers = config_.lower_tiers->stats();
  return out;
}

void Engine::drain_commands() {
  std::vector<std::unique_ptr<RequestState>> submits;
  std::vector<RequestId> aborts;
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard lock(mutex_);
    submits.swap(pending_submits_);
    aborts.swap(pending_aborts_);
    tasks.swap(pending_tasks_);
  }
  for (auto& s : submits) admit_request(std::move(s));
  for (RequestId id : aborts) {
    auto it = requests_.find(id);
    if (it != requests_.end()) abort_request(it->second.get());
  }
  for (auto& task : tasks) task();
}

Sequence* Engine::new_sequence(RequestState* req, int32_t choice_index) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_sequence_id_++;
  seq->block_hashes = kv::BlockHashes(kv_block_size_);
  seq->request = req;
  seq->choice_index = choice_index;
  seq->stop_matcher = StopStringMatcher(req->request.sampling.stop, req->request.sampling.include_stop_str_in_output);
  const auto& sampling = req->request.sampling;
  // A seeded request is reproducible whatever else runs: choice i draws from seed + i. An unseeded
  // one draws from the engine's random salt mixed with the sequence id (two std::random_device reads
  // per sequence cost ~3% of the host's time at 1,000 requests: a device open and read each).
  seq->rng.seed(sampling.seed ? *sampling.seed + static_cast<uint64_t>(choice_index)
                              : mix64(unseeded_salt_ + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(seq->id + 1)));
  const auto& prompt = req->request.prompt_tokens;
  seq->decoder = config_.text_decoder_factory(prompt, sampling.skip_special_tokens);
  if (req->request.constraint) seq->constraint = req->request.constraint->clone();
  Sequence* raw = seq.get();
  sequences_.emplace(raw->id, std::move(seq));
  if (static_cast<int32_t>(req->sequences.size()) <= choice_index) req->sequences.resize(choice_index + 1, nullptr);
  req->sequences[choice_index] = raw;
  return raw;
}

void Engine::admit_request(std::unique_ptr<RequestState> state) {
  RequestState* req = state.get();
  requests_.emplace(req->id, std::move(state));
  Sequence* seq = new_sequence(req, 0);
  seq->arrival_order = next_arrival_++;
  req->timeline.request_id = req->id;
  req->timeline.prompt_tokens = static_cast<int32_t>(req->request.prompt_tokens.size());
  req->timeline.picked_up_s = seconds_between(req->arrival_time, Clock::now());
  seq->tokens = req->request.prompt_tokens;
  seq->prompt_length = static_cast<int32_t>(seq->tokens.size());
  if (needs_token_history(req->request.sampling)) seq->history.add_prompt(seq->tokens);
  if (!start_lower_tier_load(seq)) scheduler_.enqueue(seq);  // else scheduled once its blocks are in
  ++thread_stats_.requests_submitted;
  thread_stats_.prompt_tokens += seq->prompt_length;
}

ChoiceDelta& Engine::delta_for(Sequence* seq) {
  RequestOutput& out = step_outputs_[seq->request->id];
  out.request_id = seq->request->id;
  out.usage.cached_tokens = std::max(0, seq->request->cached_tokens);
  for (auto& c : out.choices)
    if (c.index == seq->choice_index) return c;
  out.choices.push_back(ChoiceDelta{});
  out.choices.back().index = seq->choice_index;
  return out.choices.back();
}

void Engine::finish_sequence(Sequence* seq, FinishReason reason) {
  if (seq->status == SequenceStatus::kFinished) return;
  const bool aborted = reason == FinishReason::kAbort || reason == FinishReason::kError;
  // A planned or launched step still carries it: its blocks go back when that step is finished.
  const bool held = seq->steps_in_flight > 0;
  scheduler_.remove(seq, aborted, /*release_kv=*/!held);
  seq->kv_release_pending = held;
  seq->kv_release_aborted = aborted;
  seq->finish_reason = reason;
  delta_for(seq).finish_reason = reason;
  RequestState* req = seq->request;
  ++req->num_finished;
  if (!all_choices_finished(*req)) return;

  RequestOutput& out = step_outputs_[req->id];
  out.request_id = req->id;
  out.finished = true;
  out.usage.prompt_tokens = static_cast<int32_t>(req->request.prompt_tokens.size());
  out.usage.completion_tokens = req->completion_tokens;
  out.usage.cached_tokens = std::max(0, req->cached_tokens);
  // A request cancelled by shutdown counts as aborted, as a caller's abort does.
  if (out.failed() && out.error_code != StatusCode::kCancelled) {
    ++thread_stats_.requests_failed;
  } else if (req->aborted) {
    ++thread_stats_.requests_aborted;
  } else {
    bool any_length = false;
    for (Sequence* s : req->sequences) any_length |= s && s->finish_reason == FinishReason::kLength;
    ++(any_length ? thread_stats_.requests_finished_length : thread_stats_.requests_finished_stop);
  }
  finished_requests_.push_back(req);
}

void Engine::abort_request(RequestState* req) {
  if (req->num_finished == static_cast<int32_t>(req->sequences.size()) && req->aborted) return;
  req->aborted = true;
  for (Sequence* seq : req->sequences) {
    if (!seq) continue;
    if (loader_) loader_->cancel(seq->id);  // its reads not started are skipped; blocks back when it returns
    finish_sequence(seq, FinishReason::kAbort);
  }
}

void Engine::fail_request(RequestState* req, const Status& failure, FinishReason reason) {
  assert(!failure.ok());
  // Already over (a shutdown right after the caller's abort, or a second chunk
  // of the same failed step): its finished delta stands as it is.
  if (all_choices_finished(*req)) return;
  RequestOutput& out = step_outputs_[req->id];
  out.request_id = req->id;
  if (!out.failed()) {
    out.error_code = failure.code();
    // error is never empty for a failure (request.h): consumers that only look
    // at the text still see one.
    out.error = failure.message().empty() ? std::string(status_code_name(failure.code())) : failure.message();
  }
  req->aborted = true;
  for (Sequence* seq : req->sequences) {
    if (!seq) continue;
    if (loader_) loader_->cancel(seq->id);
    finish_sequence(seq, reason);
  }
}

void Engine::cancel_all_requests() {
  const Status shut_down = cancelled_error("the engine shut down before the request finished; retry it");
  std::vector<RequestState*> all;
  for (auto& [id, req] : requests_) all.push_back(req.get());
  for (RequestState* req : all) fail_request(req, shut_down, FinishReason::kAbort);
}

void Engine::add_prompt_rows(const Sequence* seq, std::span<const float> rows) {
  const GenerationRequest& r = seq->request->request;
  RequestOutput& out = step_outputs_[seq->request->id];
  out.request_id = seq->request->id;
  if (r.return_prompt_logits) out.prompt_logits.insert(out.prompt_logits.end(), rows.begin(), rows.end());
  if (!r.sampling.prompt_logprobs) return;
  const size_t vocab = static_cast<size_t>(vocab_size_);
  const int32_t first = seq->prompt_logits_done + 1;  // the prompt token that row 0 predicts
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(rows.size() / vocab), seq->prompt_length - first);
  if (n <= 0) return;
  const size_t at = out.prompt_logprobs.size();
  out.prompt_logprobs.resize(at + static_cast<size_t>(n));
  // Each row is a vocabulary's worth of work (log-softmax, rank, top-k): spread over the CPU pool.
  ThreadPool::global().parallel_for(static_cast<size_t>(n), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      out.prompt_logprobs[at + i] = score_token(rows.subspan(i * vocab, vocab), seq->tokens[first + i],
                                                *r.sampling.prompt_logprobs);
  });
}

void Engine::add_prompt_scores(const Sequence* seq, std::span<const runtime::RowScore> scores) {
  std::vector<SampledToken>& out = step_outputs_[seq->request->id].prompt_logprobs;
  step_outputs_[seq->request->id].request_id = seq->request->id;
  const int32_t first = seq->prompt_logits_done + 1;  // the prompt token that scores[0] is of
  for (size_t i = 0; i < scores.size(); ++i) {
    const runtime::RowScore& score = scores[i];
    SampledToken& t = out.emplace_back();
    t.token = seq->tokens[static_cast<size_t>(first) + i];
    t.logprob = score.logprob;
    t.rank = score.rank;
    t.top_logprobs.reserve(score.top_tokens.size());
    for (size_t j = 0; j < score.top_tokens.size(); ++j)
      t.top_logprobs.push_back({score.top_tokens[j], score.top_logprobs[j]});
  }
}

void Engine::push_prompt_rows(const ScheduledChunk& chunk, std::vector<runtime::RowSampling>& rows) const {
  const Sequence* seq = chunk.sequence;
  const GenerationRequest& r = seq->request->request;
  const std::optional<int32_t> k = r.sampling.prompt_logprobs;
  const bool score = runner_.capabilities().scores_on_device && k && *k <= runtime::kMaxScoreTopK &&
                     !r.return_prompt_logits;
  const int32_t first = seq->prompt_logits_done + 1;  // the prompt token that row 0 predicts
  for (int32_t i = 0; i < chunk.logit_rows(); ++i) {
    runtime::RowSampling row;
    if (score && first + i < seq->prompt_length) {
      row.score_token = seq->tokens[static_cast<size_t>(first + i)];
      row.score_top_k = *k;
    }
    rows.push_back(row);
  }
}

void Engine::append_token(Sequence* seq, const SampledToken& token, int32_t position) {
  RequestState* req = seq->request;
  const SamplingParams& params = req->request.sampling;
  const auto now = Clock::now();
  if (position < 0) {
    seq->tokens.push_back(token.token);
  } else {
    seq->tokens[static_cast<size_t>(position)] = token.token;
    --seq->pending_tokens;
    // Reserved by a later plan but not computed yet (it is that step's input): the KV manager hashes it
    // once it is. Not reserved yet: the next plan reserves it from `tokens`.
    if (seq->in_kv && position < seq->num_reserved) {
      const Status set = kv_.set_token(seq->id, position, token.token);
      assert(set.ok());
      (void)set;
    }
  }
  if (needs_token_history(params)) seq->history.add_output(token.token);
  ++req->completion_tokens;
  ++thread_stats_.generated_tokens;
  if (seq->last_token_time) thread_stats_.inter_token_latency.observe(seconds_between(*seq->last_token_time, now));
  seq->last_token_time = now;
  if (!req->first_token_seen) {
    req->first_token_seen = true;
    thread_stats_.time_to_first_token.observe(seconds_between(req->arrival_time, now));
    req->timeline.first_token_s = seconds_between(req->arrival_time, now);
    req->timeline.cached_tokens = std::max(0, req->cached_tokens);
    emit_timeline(req);
  }

  ChoiceDelta& delta = delta_for(seq);
  const bool stop_token =
      (!params.ignore_eos && contains(eos_ids_, token.token)) || contains(params.stop_token_ids, token.token);
  if (stop_token) {
    delta.stop_token = token;
    // The stop token itself is not part of the text (unless include_stop_str_in_output, as vLLM); release
    // what was held back.
    if (params.include_stop_str_in_output) delta.text += seq->stop_matcher.pass(seq->decoder->append(token.token));
    delta.text += seq->stop_matcher.append(seq->decoder->finish());
    delta.text += seq->stop_matcher.flush();
    finish_sequence(seq, FinishReason::kStop);
    return;
  }
  delta.tokens.push_back(token.token);
  if (params.logprobs) delta.logprobs.push_back(token);
  // min_tokens: stop strings are matched once the output is longer than min_tokens (as vLLM); a stop
  // string may still start in the text before.
  if (seq->num_output_tokens() <= params.min_tokens)
    delta.text += seq->stop_matcher.pass(seq->decoder->append(token.token));
  else
    delta.text += seq->stop_matcher.append(seq->decoder->append(token.token));
  if (seq->stop_matcher.stopped()) {
    finish_sequence(seq, FinishReason::kStop);
    return;
  }
  if (seq->num_known_output_tokens() >= params.max_tokens ||
      static_cast<int32_t>(seq->tokens.size()) - seq->pending_tokens >= max_context_) {
    delta.text += seq->stop_matcher.append(seq->decoder->finish());
    if (seq->stop_matcher.stopped()) {
      finish_sequence(seq, FinishReason::kStop);
      return;
    }
    delta.text += seq->stop_matcher.flush();
    finish_sequence(seq, FinishReason::kLength);
  }
}

runtime::RowSampling Engine::row_sampling_for(const Sequence* seq) const {
  const RequestState* req = seq->request;
  const SamplingParams& p = req->request.sampling;
  runtime::RowSampling row;
  // Penalties, logit rules and top logprobs stay on the device where the runner says so (but
  // allowed_token_ids, a whole-row rule, never); the first token of an n > 1 request is drawn n times
  // from one row on the host. Constrained rows stay on the device where the runner applies token masks
  // (the engine fills the mask before the forward: step()).
  const runtime::RunnerCapabilities caps = runner_.capabilities();
  const int32_t top_logprobs = p.logprobs.value_or(0);
  const bool edits = needs_logit_edits(seq);
  row.on_device = caps.samples_on_device && (!edits || (caps.edits_logits_on_device && p.allowed_token_ids.empty())) &&
                  (top_logprobs == 0 || (caps.scores_on_device && top_logprobs <= runtime::kMaxScoreTopK)) &&
                  (p.n == 1 || req->forked) && !req->request.return_logits &&
                  (!seq->constraint || caps.samples_masked_on_device);
  if (!row.on_device) return row;
  row.score_top_k = top_logprobs;
  // The lists themselves come once the step's earlier tokens are known (fill_logit_edits).
  row.repetition_penalty = p.repetition_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.presence_penalty = p.presence_penalty;
  row.temperature = p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  // Seeded: choice i keys on (seed, i), like the host RNG's seed + i.
  const uint64_t base = p.seed ? mix64(*p.seed) : mix64(unseeded_salt_ ^ static_cast<uint64_t>(req->id));
  row.seed = mix64(base + static_cast<uint64_t>(seq->choice_index));
  row.step = static_cast<uint64_t>(std::max(0, seq->num_output_tokens()));
  return row;
}

bool Engine::needs_logit_edits(const Sequence* seq) const {
  const SamplingParams& p = seq->request->request.sampling;
  return needs_token_history(p) || logit_rules_apply(p, seq->num_output_tokens());
}

void Engine::fill_logit_edits(std::span<const std::pair<size_t, const Sequence*>> edited,
                              std::span<runtime::RowSampling> rows) {
  using runtime::LogitEdit;
  logit_edits_.clear();
  std::vector<size_t> ends;
  ends.reserve(edited.size());
  std::unordered_map<int32_t, size_t> at;  // a row's token -> its entry
  for (const auto& [r, seq] : edited) {
    at.clear();
    auto entry = [&](int32_t token) -> LogitEdit& {
      const auto [it, fresh] = at.try_emplace(token, logit_edits_.size());
      if (fresh) logit_edits_.push_back(LogitEdit{token});
      return logit_edits_[it->second];
    };
    const SamplingParams& p = seq->request->request.sampling;
    if (logit_rules_apply(p, seq->num_output_tokens())) {
      for (int32_t token : banned_tokens(p, logit_rule_context(seq))) entry(token).flags |= LogitEdit::kBanned;
      for (const auto& [token, bias] : p.logit_bias) {
        LogitEdit& e = entry(token);
        e.flags |= LogitEdit::kBiased;
        e.bias = bias;
      }
    }
    // Repetition penalizes the prompt's tokens too (engine::Sampler), the others only the output's.
    const TokenHistory& history = seq->history;
    if (p.repetition_penalty != 1.0f)
      for (const auto& [token, count] : history.prompt_counts) entry(token).flags |= LogitEdit::kSeen;
    for (const auto& [token, count] : history.output_counts) {
      LogitEdit& e = entry(token);
      e.flags |= LogitEdit::kSeen;
      e.output_count = count;
    }
    ends.push_back(logit_edits_.size());
  }
  // Spans only once the vector stops growing.
  size_t begin = 0;
  for (size_t i = 0; i < edited.size(); ++i) {
    rows[edited[i].first].logit_edits = std::span<const LogitEdit>(logit_edits_.data() + begin, ends[i] - begin);
    begin = ends[i];
  }
}

void Engine::emit_timeline(RequestState* req) {
  if (config_.timeline_sink) config_.timeline_sink(req->timeline);
  if (config_.log_timelines) std::fprintf(stderr, "timeline: %s\n", format_timeline(req->timeline).c_str());
}

void Engine::sample_into(Sequence* seq, std::span<const float> logits) {
  if (seq->constraint) {
    sample_constrained(seq, logits);
    return;
  }
  const SamplingParams& params = seq->request->request.sampling;
  const LogitRuleContext rules = logit_rule_context(seq);
  append_token(seq, Sampler::sample(logits, params, seq->history, seq->rng,
                                    logit_rules_apply(params, seq->num_output_tokens()) ? &rules : nullptr));
}

LogitRuleContext Engine::logit_rule_context(const Sequence* seq) const {
  // The known output: a sequence sampled here has no token pending (only device-sampled rows are launched
  // ahead), but the span leaves any out all the same.
  const std::span<const int32_t> tokens(seq->tokens);
  const size_t begin = static_cast<size_t>(seq->prompt_length);
  const size_t end = tokens.size() - static_cast<size_t>(seq->pending_tokens);
  return LogitRuleContext{tokens.subspan(begin, end - begin), eos_ids_};
}

void Engine::DeviceMasks::reset(size_t num_rows) {
  sequences_.assign(num_rows, nullptr);
  dead_.assign(num_rows, 0);
}

void Engine::DeviceMasks::add(size_t row, Sequence* seq) { sequences_[row] = seq; }

void Engine::DeviceMasks::fill_mask(size_t row, std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  if (row >= sequences_.size() || sequences_[row] == nullptr) return;
  if (sequences_[row]->constraint->fill_allowed(mask) != 0) return;
  // A dead end: the device still draws the row, from token 0 alone so that its sampler sees a
  // finite logit; the engine discards the draw and fails the request after the step.
  dead_[row] = 1;
  mask[0] = 1;
}

void Engine::sample_constrained(Sequence* seq, std::span<const float> logits) {
  constraint_mask_.assign(allowed_words(static_cast<int32_t>(logits.size())), 0);
  if (seq->constraint->fill_allowed(constraint_mask_) == 0) {
    fail_request(seq->request, internal_error("structured output: no token can continue the output (choice {})",
                                              seq->choice_index));
    return;
  }
  constrained_logits_.assign(logits.begin(), logits.end());
  apply_token_mask(constrained_logits_, constraint_mask_);
  const SamplingParams& params = seq->request->request.sampling;
  const LogitRuleContext rules = logit_rule_context(seq);
  const SampledToken token = Sampler::sample(constrained_logits_, params, seq->history, seq->rng,
                                             logit_rules_apply(params, seq->num_output_tokens()) ? &rules : nullptr);
  if (!seq->constraint->accept(token.token)) {
    fail_request(seq->request, internal_error("structured output: sampled token {} is outside the mask", token.token));
    return;
  }
  append_token(seq, token);
  jump_forward(seq);
}

void Engine::jump_forward(Sequence* seq) {
  const GenerationRequest& r = seq->request->request;
  if (seq->status != SequenceStatus::kRunning || r.sampling.logprobs.has_value() || r.return_logits ||
      logit_rules_apply(r.sampling, seq->num_output_tokens()))
    return;
  seq->constraint->forced_tokens(forced_tokens_);
  for (int32_t token : forced_tokens_) {
    if (seq->status != SequenceStatus::kRunning || !seq->constraint->accept(token)) break;
    append_token(seq, SampledToken{token, 0.0f, {}});
    ++thread_stats_.jump_forward_tokens;
  }
}

void Engine::fork_children(Sequence* parent, std::span<const float> logits) {
  RequestState* req = parent->request;
  req->forked = true;
  for (int32_t i = 1; i < req->request.sampling.n; ++i) {
    Sequence* child = new_sequence(req, i);
    child->arrival_order = parent->arrival_order;
    child->tokens = parent->tokens;
    child->block_hashes = parent->block_hashes;
    child->prompt_length = parent->prompt_length;
    child->prompt_logits_done = parent->prompt_logits_done;  // the request's prompt rows went out once
    child->history = parent->history;
    if (parent->constraint) child->constraint = parent->constraint->clone();
    auto copies = kv_.fork(parent->id, child->id);
    if (copies.ok() && copy_blocks_on_runner(*copies).ok()) {
      child->in_kv = true;
      child->num_computed = parent->num_computed;
      child->num_reserved = parent->num_reserved;
      scheduler_.add_running(child);
    } else {
      if (copies.ok()) (void)kv_.abort_sequence(child->id);
      // No room to share now: the child recomputes its prompt later.
      scheduler_.enqueue(child, /*at_front=*/true);
    }
    sample_into(child, logits);
  }
}

void Engine::flush_outputs() {
  for (auto& [id, out] : step_outputs_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    it->second->stream->push(std::move(out));
  }
  step_outputs_.clear();
  // A request whose sequence a launched step still carries stays until that step is collected.
  std::vector<RequestState*> held;
  std::erase_if(finished_requests_, [&](RequestState* req) {
    const bool in_flight =
        std::any_of(req->sequences.begin(), req->sequences.end(), [](const Sequence* s) { return s && s->steps_in_flight > 0; });
    if (in_flight) held.push_back(req);
    return in_flight;
  });
  for (RequestState* req : finished_requests_) {
    if (!req->admitted_once) --num_queued_;
    for (Sequence* seq : req->sequences) {
      if (!seq) continue;
      if (req->kv_compression.enabled()) runner_.release_kv_state(seq->id);
      sequences_.erase(seq->id);
    }
    const RequestId id = req->id;
    requests_.erase(id);
    --num_in_flight_;
  }
  if (!finished_requests_.empty()) {
    std::lock_guard lock(mutex_);
    idle_.notify_all();
  }
  finished_requests_ = std::move(held);
}

void Engine::publish_stats(double step_seconds) {
  if (step_seconds >= 0) thread_stats_.step_time.observe(step_seconds);
  thread_stats_.num_waiting = static_cast<int64_t>(scheduler_.num_waiting());
  thread_stats_.num_running = static_cast<int64_t>(scheduler_.num_running());
  thread_stats_.preemptions = scheduler_.num_preemptions();
  thread_stats_.swap_preemptions = scheduler_.num_swap_preemptions();
  thread_stats_.kv = kv_.stats();
  thread_stats_.transfers = runner_.transfer_stats();
  thread_stats_.lower_tier_loads_in_flight = loader_ ? loader_->in_flight() : 0;
  std::lock_guard lock(stats_mutex_);
  stats_ = thread_stats_;
}

bool Engine::step() {
  drain_commands();
  finish_lower_tier_loads();
  // A launched step is on the device: the next one is planned now, while it runs, unless planning
  // could preempt (a running sequence finds no block) or tier work waits; then its tokens come first.
  if (!launched_.empty() &&
      (launched_.size() > 1 || kv_.num_available_blocks() < static_cast<int32_t>(scheduler_.num_running()) ||
       kv_.has_pending_transfers() || kv_.has_blocks_to_zero())) {
    collect_all_steps();
    return true;
  }
  return run_step(scheduler_.schedule());
}

bool Engine::run_step(StepPlan plan) {
  const auto scheduled_at = Clock::now();
  // Planned beside a launched step: its inputs may be that step's pending tokens.
  std::vector<PendingInput> pending;
  if (!launched_.empty()) {
    hold(plan);
    pending = pending_inputs(plan);
  }
  // Requests whose first admission is this step (their timelines follow this step's transfers).
  std::vector<RequestState*> first_admitted;
  for (Sequence* seq : plan.admitted) {
    RequestState* req = seq->request;
    if (!req->admitted_once) {
      req->admitted_once = true;
      --num_queued_;
      thread_stats_.cached_prompt_tokens += std::max(0, req->cached_tokens);
      req->timeline.admitted_s = seconds_between(req->arrival_time, scheduled_at);
      req->timeline.admitted_with = static_cast<int32_t>(plan.admitted.size());
      first_admitted.push_back(req);
    }
  }
  // kFailedPrecondition, not kResourceExhausted: waiting will never help (request.h).
  for (Sequence* seq : plan.unschedulable)
    fail_request(seq->request,
                 failed_precondition_error("the request's {} tokens can never fit in the KV cache: with nothing "
                                           "else running only {} of its {} blocks ({} tokens each) can be freed",
                                           seq->tokens.size(), kv_.num_available_blocks(), kv_num_blocks_,
                                           kv_block_size_));
  // Rows are sampled where the logits are (on the runner's device) unless the
  // request needs the host sampler; only those rows' logits come back. A chunk
  // that returns prompt logits has a row per token (push_prompt_rows), the last
  // of which is also its sampling row (a host row) when the chunk ends the prompt.
  // A constrained row sampled on the device gets its mask from device_masks_ when the runner
  // asks, after it has queued the forward: the masks are computed while the device works.
  std::vector<runtime::RowSampling> rows;
  rows.reserve(plan.chunks.size());
  device_masks_.reset(static_cast<size_t>(plan.batch.num_logit_rows()));
  std::vector<std::pair<size_t, const Sequence*>> edited;  // device rows whose logit edits come later
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (chunk.all_logits) {
      push_prompt_rows(chunk, rows);
      continue;
    }
    if (chunk.logit_rows() == 0) continue;
    runtime::RowSampling last;
    if (chunk.produces_logits) last = row_sampling_for(chunk.sequence);
    if (last.on_device && chunk.sequence->constraint) {
      last.mask_source = &device_masks_;
      device_masks_.add(rows.size(), chunk.sequence);
    }
    if (last.on_device && needs_logit_edits(chunk.sequence)) edited.emplace_back(rows.size(), chunk.sequence);
    rows.push_back(last);
  }
  // Overlapped: launched, with tier work and zeroing (which want the device idle) left to synchronous steps.
  // Rows with logit edits need every earlier token first (their lists): never launched.
  const bool launch = overlap_ && !plan.empty() && !kv_.has_pending_transfers() && !kv_.has_blocks_to_zero() &&
                      edited.empty() && launchable(plan, rows);
  const bool collected = !launch && !launched_.empty();
  if (collected) {
    // This step needs the launched ones' tokens first: its pending inputs are known after them.
    collect_all_steps();
    for (const PendingInput& p : pending)
      plan.batch.token_ids[static_cast<size_t>(p.token_index)] = std::max(0, p.seq->tokens[static_cast<size_t>(p.position)]);
    pending.clear();
  }
  // Not launched, so every token drawn before this step is in its sequence's history by now.
  fill_logit_edits(edited, rows);
  // The step's moves between the tiers (promotions of host hits, write-backs
  // of evicted blocks, swaps) run before its forward. If they fail, the
  // sequences whose K/V was lost start over and this plan is dropped: its
  // sequences run next step (nothing was committed).
  step_transfer_blocks_[0] = step_transfer_blocks_[1] = 0;
  if (!run_transfers().ok()) {
    if (plan.held) unhold(plan);
    publish_stats(-1);
    flush_outputs();
    return true;
  }
  const int h2d = static_cast<int>(kv::TransferDirection::kHostToDevice);
  const bool step_moved = step_transfer_blocks_[0] + step_transfer_blocks_[1] > 0;
  const auto transfers_enqueued = Clock::now();
  for (RequestState* req : first_admitted) {
    req->timeline.admission_h2d_blocks = step_transfer_blocks_[h2d];
    req->timeline.admission_d2h_blocks = step_transfer_blocks_[1 - h2d];
    if (step_moved) req->timeline.load_enqueued_s = seconds_between(req->arrival_time, transfers_enqueued);
  }
  if (plan.empty()) {
    if (plan.held) unhold(plan);
    publish_stats(-1);
    flush_outputs();
    if (collected) return true;  // the collected tokens may be the next step's work
    // A sequence that preempted itself (it could not grow, nothing else to take blocks from) waits to be
    // admitted again: the next step's plan does that, it is no reason to go idle.
    if (!plan.preempted.empty()) return true;
    if (loader_ == nullptr || loader_->in_flight() == 0) return false;
    // Only sequences waiting for their lower-tier reads: sleep until one is in or a command comes.
    std::unique_lock lock(mutex_);
    work_ready_.wait_for(lock, std::chrono::milliseconds(20), [&] {
      return loads_finished_ || stop_thread_ || !pending_submits_.empty() || !pending_aborts_.empty() ||
             !pending_tasks_.empty();
    });
    return true;
  }

  const auto start = Clock::now();
  ++thread_stats_.steps;
  for (const ScheduledChunk& chunk : plan.chunks) {
    RequestTimeline& t = chunk.sequence->request->timeline;
    if (chunk.sequence->request->first_token_seen) continue;
    ++t.steps_before_first_token;
    if (t.first_step_start_s >= 0) continue;
    t.first_step_start_s = seconds_between(chunk.sequence->request->arrival_time, start);
    t.first_step_sequences = static_cast<int32_t>(plan.chunks.size());
    t.first_step_tokens = plan.batch.num_tokens();
  }
  if (launch) {
    for (const PendingInput& p : pending) {
      plan.batch.deferred_tokens.push_back(DeferredToken{p.token_index, p.seq->pending_row});
      plan.batch.token_ids[static_cast<size_t>(p.token_index)] = 0;
    }
    const Status launched = launch_step(plan, rows, start);
    if (launched.ok()) {
      // The older step's tokens are read while the device runs this one.
      if (launched_.size() > 1) collect_step();
      return true;
    }
    finish_step(plan, rows, launched, {}, start, false);
    return true;
  }
  StatusOr<runtime::StepResult> result = runner_.execute(plan.batch, rows);
  if (step_moved && !first_admitted.empty()) {
    // The forward waited for the step's copies, so the runner knows when they ended (if it reports it).
    const auto done = runner_.last_transfer_done_at();
    if (done && *done >= scheduled_at)
      for (RequestState* req : first_admitted) req->timeline.load_done_s = seconds_between(req->arrival_time, *done);
  }
  finish_step(plan, rows, std::move(result), {}, start, false);
  return true;
}

bool Engine::launchable(const StepPlan& plan, std::span<const runtime::RowSampling> rows) const {
  // A launched step returns tokens only (no scores).
  for (const runtime::RowSampling& row : rows)
    if (!row.on_device || row.masked() || row.reports_score()) return false;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const RequestState* req = chunk.sequence->request;
    if (chunk.all_logits || req->kv_compression.enabled() || req->request.sampling.max_tokens == 0) return false;
  }
  return true;
}

std::vector<Engine::PendingInput> Engine::pending_inputs(const StepPlan& plan) const {
  std::vector<PendingInput> out;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Sequence* seq = plan.chunks[i].sequence;
    if (seq->pending_tokens == 0) continue;
    const SequenceSlice& slice = plan.batch.sequences[i];
    for (int32_t t = 0; t < slice.num_new_tokens; ++t)
      if (plan.batch.token_ids[static_cast<size_t>(slice.token_offset + t)] == kPendingToken)
        out.push_back(PendingInput{slice.token_offset + t, seq, seq->num_computed + t});
  }
  return out;
}

void Engine::hold(StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) ++chunk.sequence->steps_in_flight;
  plan.held = true;
}

void Engine::unhold(StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    Sequence* seq = chunk.sequence;
    if (--seq->steps_in_flight > 0 || !seq->kv_release_pending) continue;
    seq->kv_release_pending = false;
    scheduler_.release_kv(seq, seq->kv_release_aborted);
  }
  plan.held = false;
}

Status Engine::launch_step(StepPlan& plan, std::vector<runtime::RowSampling> rows, Clock::time_point start) {
  PAGODA_RETURN_IF_ERROR(runner_.launch(plan.batch, rows));
  if (!launched_.empty()) ++thread_stats_.overlapped_steps;
  if (!plan.held) hold(plan);
  scheduler_.advance(plan);
  // Each row's token stays on the device until the step is collected: its sequence holds a pending
  // token meanwhile, which the next step may take as its input (ForwardBatch::deferred_tokens).
  LaunchedStep step{std::move(plan), std::move(rows), {}, start};
  step.positions.assign(step.rows.size(), -1);
  size_t row = 0;
  for (const ScheduledChunk& chunk : step.plan.chunks) {
    if (chunk.logit_rows() == 0) continue;
    Sequence* seq = chunk.sequence;
    seq->tokens.push_back(kPendingToken);
    ++seq->pending_tokens;
    seq->pending_row = static_cast<int32_t>(row);
    step.positions[row++] = static_cast<int32_t>(seq->tokens.size()) - 1;
    const SamplingParams& params = seq->request->request.sampling;
    if (seq->num_output_tokens() >= params.max_tokens || static_cast<int32_t>(seq->tokens.size()) >= max_context_)
      seq->last_token_pending = true;
  }
  launched_.push_back(std::move(step));
  return ok_status();
}

void Engine::collect_step() {
  LaunchedStep step = std::move(launched_.front());
  launched_.pop_front();
  StatusOr<runtime::StepResult> result = runner_.collect();
  finish_step(step.plan, step.rows, std::move(result), step.positions, step.start, true);
}

void Engine::collect_all_steps() {
  while (!launched_.empty()) collect_step();
}

void Engine::finish_step(StepPlan& plan, std::span<const runtime::RowSampling> rows,
                         StatusOr<runtime::StepResult> result, std::span<const int32_t> positions,
                         Clock::time_point start, bool launched) {
  const auto forward_end = Clock::now();
  for (const ScheduledChunk& chunk : plan.chunks) {
    RequestTimeline& t = chunk.sequence->request->timeline;
    if (t.first_step_end_s < 0) t.first_step_end_s = seconds_between(chunk.sequence->request->arrival_time, forward_end);
  }
  const size_t vocab = static_cast<size_t>(vocab_size_);
  if (result.ok()) {
    size_t host_rows = 0, scored_rows = 0;
    for (const runtime::RowSampling& row : rows) {
      scored_rows += row.reports_score() ? 1 : 0;
      host_rows += row.on_device || row.scored() ? 0 : 1;
    }
    if (result->host_logits.size() != host_rows * vocab || result->tokens.size() != rows.size() ||
        result->logprobs.size() != rows.size() || result->scores.size() != scored_rows)
      result = internal_error("the model runner returned {} logits, {} tokens, {} scores for {} rows ({} sampled on "
                              "the host, {} scored)", result->host_logits.size(), result->tokens.size(),
                              result->scores.size(), rows.size(), host_rows, scored_rows);
    for (size_t r = 0; result.ok() && r < rows.size(); ++r)
      if (rows[r].on_device && (launched || !device_masks_.dead_end(r)) &&
          (result->tokens[r] < 0 || result->tokens[r] >= vocab_size_))
        result = internal_error("the model runner sampled token {} for row {}, outside the vocabulary [0, {})",
                                result->tokens[r], r, vocab_size_);
  }
  Status committed = result.ok() ? (launched ? scheduler_.commit_kv(plan) : scheduler_.commit(plan)) : result.status();
  if (!committed.ok()) {
    for (const ScheduledChunk& chunk : plan.chunks)
      if (chunk.sequence->status != SequenceStatus::kFinished)
        fail_request(chunk.sequence->request, internal_error("model step failed: {}", committed.to_string()));
    if (plan.held) unhold(plan);
    publish_stats(seconds_between(start, Clock::now()));
    flush_outputs();
    return;
  }
  size_t row = 0, host_row = 0, score_row = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    Sequence* seq = chunk.sequence;
    std::span<const float> logits_row;
    size_t r = 0;
    bool on_device = false;
    const size_t chunk_rows = static_cast<size_t>(chunk.logit_rows());
    const size_t chunk_scored = static_cast<size_t>(
        std::count_if(rows.begin() + static_cast<std::ptrdiff_t>(row),
                      rows.begin() + static_cast<std::ptrdiff_t>(row + chunk_rows),
                      [](const runtime::RowSampling& s) { return s.reports_score(); }));
    // A sampled row's score (top logprobs) is the chunk's last; prompt rows are never sampled on the device.
    const runtime::RowScore* sampled_score =
        !chunk.all_logits && chunk_scored > 0 ? &result->scores[score_row + chunk_scored - 1] : nullptr;
    if (chunk.all_logits && seq->status == SequenceStatus::kRunning) {
      if (chunk_scored > 0) {  // the rows that predict prompt tokens came back scored (push_prompt_rows)
        add_prompt_scores(seq, std::span<const runtime::RowScore>(result->scores).subspan(score_row, chunk_scored));
      } else {  // every row of such a chunk is a host row
        add_prompt_rows(seq, std::span<const float>(result->host_logits.data() + host_row * vocab, chunk_rows * vocab));
      }
    }
    score_row += chunk_scored;
    for (size_t i = 0; i < chunk_rows; ++i) {
      r = row++;
      on_device = rows[r].on_device;
      if (!on_device && !rows[r].scored())
        logits_row = std::span<const float>(result->host_logits.data() + host_row++ * vocab, vocab);
    }
    if (chunk.all_logits) seq->prompt_logits_done += chunk.num_new_tokens;
    if (!chunk.produces_logits || seq->status != SequenceStatus::kRunning) continue;
    if (on_device) {
      if (!launched && device_masks_.dead_end(r)) {
        fail_request(seq->request, internal_error("structured output: no token can continue the output (choice {})",
                                                  seq->choice_index));
        continue;
      }
      const int32_t token = result->tokens[r];
      if (seq->constraint && !seq->constraint->accept(token)) {
        fail_request(seq->request, internal_error("structured output: the device sampled token {}, outside the mask "
                                                  "(choice {})", token, seq->choice_index));
        continue;
      }
      SampledToken sampled{token, result->logprobs[r], {}};
      if (sampled_score != nullptr) {
        sampled.top_logprobs.reserve(sampled_score->top_tokens.size());
        for (size_t j = 0; j < sampled_score->top_tokens.size(); ++j)
          sampled.top_logprobs.push_back({sampled_score->top_tokens[j], sampled_score->top_logprobs[j]});
      }
      append_token(seq, sampled, launched ? positions[r] : -1);
      if (seq->constraint) jump_forward(seq);
      continue;
    }
    RequestState* req = seq->request;
    if (req->request.sampling.max_tokens == 0) {  // scoring only (prompt rows, no output tokens)
      finish_sequence(seq, FinishReason::kLength);
      continue;
    }
    if (req->request.return_logits) {
      std::vector<float>& out = delta_for(seq).logits;
      out.insert(out.end(), logits_row.begin(), logits_row.end());
    }
    if (req->request.sampling.n > 1 && !req->forked) fork_children(seq, logits_row);
    sample_into(seq, logits_row);
  }
  if (plan.held) unhold(plan);
  compact_sequences(plan);
  // With tiers below the host, the write-backs this step decided (blocks it
  // filled) run now when nothing is left running: otherwise they would wait
  // for the next request, and a server stopped meanwhile would never store them.
  if (config_.lower_tiers != nullptr && scheduler_.num_running() == 0 && scheduler_.num_waiting() == 0 &&
      kv_.has_pending_transfers())
    (void)run_transfers();
  // Stats before outputs, here and above: a client that sees its request end
  // also sees its blocks freed in /metrics. Overlapped steps count from one's end to the next's.
  const auto end = Clock::now();
  const double seconds = launched && last_step_end_ ? seconds_between(*last_step_end_, end) : seconds_between(start, end);
  last_step_end_ = launched ? std::optional<Clock::time_point>(end) : std::nullopt;
  publish_stats(seconds);
  flush_outputs();
}

void Engine::compact_sequences(const StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    Sequence* seq = chunk.sequence;
    const runtime::KvCompressionConfig& c = seq->request->kv_compression;
    if (!c.enabled() || seq->status != SequenceStatus::kRunning || !seq->in_kv || seq->swapped) continue;
    if (seq->num_computed < seq->prompt_length && !c.compact_during_prefill) continue;
    if (seq->num_cached_slots() <= runtime::kv_compaction_trigger(c, kv_num_layers_, kv_block_size_)) continue;
    if (Status s = compact_sequence(seq); !s.ok())
      fail_request(seq->request, internal_error("token eviction failed: {}", s.to_string()));
  }
}

Status Engine::compact_sequence(Sequence* seq) {
  const runtime::KvCompressionConfig& c = seq->request->kv_compression;
  const int32_t slots = seq->num_cached_slots();
  const int32_t kept = std::min(slots, runtime::kv_compaction_capacity(c, kv_num_layers_));
  StatusOr<kv::SequenceCompaction> r = kv_.compact_sequence(seq->id, kept);
  // No room for the fresh blocks now: the sequence keeps its cache and tries again next step.
  if (r.status().code() == StatusCode::kResourceExhausted) {
    ++thread_stats_.kv_compactions_deferred;
    return ok_status();
  }
  PAGODA_RETURN_IF_ERROR(r.status());
  // Blocks handed over from another tenant are zeroed, and write-backs of the
  // blocks the allocation evicted run, before the runner writes the new ones.
  PAGODA_RETURN_IF_ERROR(run_transfers());
  runtime::KvCompaction job;
  job.kv_state = seq->id;
  job.config = c;
  // Only the blocks the copy reads and writes: the reserved tail may be in both tables.
  job.old_block_table.assign(r->old_blocks.begin(), r->old_blocks.begin() + kv_.blocks_for_tokens(slots));
  job.old_length = slots;
  job.new_block_table.assign(r->new_blocks.begin(), r->new_blocks.begin() + kv_.blocks_for_tokens(kept));
  job.new_length = kept;
  PAGODA_RETURN_IF_ERROR(runner_.compact_kv(job));
  seq->kv_evicted += slots - kept;
  ++thread_stats_.kv_compactions;
  thread_stats_.kv_evicted_slots += slots - kept;
  return ok_status();
}

Status Engine::zero_blocks_changing_tenant() {
  std::vector<kv::BlockId> blocks = kv_.take_blocks_to_zero();
  if (blocks.empty() || !runner_.capabilities().zeroes_blocks) return ok_status();
  thread_stats_.kv_blocks_zeroed += static_cast<int64_t>(blocks.size());
  return runner_.zero_blocks(blocks);
}

Status Engine::run_transfers() {
  // A block another tenant held is zeroed before anything (a host->device
  // transfer, a copy, the forward) writes it.
  PAGODA_RETURN_IF_ERROR(zero_blocks_changing_tenant());
  const std::vector<kv::BlockTransfer> moves = kv_.take_transfers();
  if (moves.empty()) return ok_status();
  std::vector<runtime::BlockTransfer> runner_moves;
  runner_moves.reserve(moves.size());
  for (const kv::BlockTransfer& t : moves)
    runner_moves.push_back(runtime::BlockTransfer{static_cast<runtime::TransferDirection>(t.direction), t.device_block,
                                                  t.host_block});
  if (spiller_) {
    // A spill not yet read must not see its host block overwritten by these transfers.
    std::vector<int32_t> written;
    for (const kv::BlockTransfer& t : moves)
      if (t.direction == kv::TransferDirection::kDeviceToHost) written.push_back(t.host_block);
    spiller_->wait_for(written);
  }
  Status moved = runner_.transfer_blocks(runner_moves);
  for (const kv::BlockTransfer& t : moves) ++step_transfer_blocks_[static_cast<int>(t.direction)];
  if (moved.ok()) {
    spill_to_lower_tiers(moves);
    return moved;
  }
  ++thread_stats_.transfer_failures;
  for (kv::SequenceId id : kv_.transfers_failed(moves)) {
    auto it = sequences_.find(id);
    if (it != sequences_.end() && it->second->status != SequenceStatus::kFinished) scheduler_.restart(it->second.get());
  }
  return moved;
}

void Engine::spill_to_lower_tiers(std::span<const kv::BlockTransfer> moves) {
  if (!spiller_) return;
  // After the whole list ran, a host block holds what its last transfer wrote,
  // which is what the manager's metadata (decided at once) says it holds. The
  // spiller reads it once the copies are done, while this thread goes on to
  // the forward.
  std::vector<LowerTierSpiller::Spill> spills;
  for (const kv::BlockTransfer& t : moves) {
    if (t.direction != kv::TransferDirection::kDeviceToHost) continue;
    const std::optional<kv::StableKey> key = kv_.host_block_stable_key(t.host_block);
    if (key) spills.push_back(LowerTierSpiller::Spill{t.host_block, *key});
  }
  spiller_->submit(std::move(spills));
}

bool Engine::start_lower_tier_load(Sequence* seq) {
  kvstore::LowerTiers* tiers = config_.lower_tiers;
  if (tiers == nullptr || tiers->empty() || loader_ == nullptr) return false;
  if (seq->request->request.wants_prompt_rows()) return false;  // computes its whole prompt (Scheduler::prefix_reuse)
  const std::string& ns = seq->request->request.tenant_namespace;
  const int64_t max_blocks = (static_cast<int64_t>(seq->tokens.size()) - 1) / kv_block_size_;
  if (max_blocks <= 0) return false;
  seq->block_hashes.extend(seq->tokens);
  const kv::PrefixMatch match = kv_.match_prefix(ns, seq->tokens, seq->block_hashes.hashes());
  const auto have = static_cast<int32_t>(match.blocks.size());
  if (have >= max_blocks) return false;
  std::vector<kv::StableKey> keys = kv_.stable_keys(ns, seq->tokens, static_cast<int32_t>(max_blocks));
  if (static_cast<int64_t>(keys.size()) != max_blocks) return false;
  keys.erase(keys.begin(), keys.begin() + have);
  // The run the disk's index holds (in memory: no I/O here).
  size_t disk_run = 0;
  if (kvstore::BlockStore* disk = tiers->disk(); disk != nullptr)
    while (disk_run < keys.size() && disk->probably_holds(keys[disk_run])) ++disk_run;
  const bool redis = tiers->redis() != nullptr;
  if (disk_run == 0 && !redis) return false;  // a miss costs nothing
  auto load = std::make_unique<LowerTierLoader::Load>();
  load->sequence = seq->id;
  load->first_block = have;
  if (disk_run > 0) {
    // Pending write-backs are handed to the runner first: a host block they
    // target may be reclaimed by the reservation below.
    if (!run_transfers().ok()) return false;
    load->disk_hosts = kv_.reserve_host_blocks(static_cast<int32_t>(disk_run));
    if (spiller_) spiller_->wait_for(load->disk_hosts);  // a reclaimed block may still be due to be spilled
    StatusOr<std::vector<std::span<std::byte>>> memory = runner_.host_blocks_for_writing(load->disk_hosts);
    if (memory.ok()) {
      load->disk_memory = std::move(*memory);
    } else if (memory.status().code() == StatusCode::kUnimplemented) {
      // Its host blocks are not one piece of memory: read into a buffer, written into them when the load is back.
      const size_t bb = tiers->block_bytes();
      load->disk_staging.resize(load->disk_hosts.size() * bb);
      for (size_t i = 0; i < load->disk_hosts.size(); ++i)
        load->disk_memory.push_back(std::span(load->disk_staging).subspan(i * bb, bb));
    } else {
      kv_.release_host_blocks(load->disk_hosts);
      return false;
    }
  }
  // Redis continues the run only past a whole disk run (the host tier may have given fewer blocks).
  load->try_redis = redis && load->disk_hosts.size() == disk_run;
  if (load->disk_hosts.empty() && !load->try_redis) return false;
  load->keys = std::move(keys);
  loader_->submit(std::move(load));
  ++thread_stats_.lower_tier_loads;
  return true;
}

void Engine::finish_lower_tier_loads() {
  if (loader_ == nullptr) return;
  {
    std::lock_guard lock(mutex_);
    loads_finished_ = false;
  }
  for (const std::unique_ptr<LowerTierLoader::Load>& load : loader_->take_finished()) {
    const std::span<const int32_t> hosts(load->disk_hosts);
    auto it = sequences_.find(load->sequence);
    Sequence* seq = it == sequences_.end() ? nullptr : it->second.get();
    if (seq == nullptr || seq->status != SequenceStatus::kWaiting || seq->request->aborted) {
      kv_.release_host_blocks(hosts);  // aborted meanwhile: every reserved block goes back, read or not
      continue;
    }
    const std::string& ns = seq->request->request.tenant_namespace;
    auto disk_read = static_cast<size_t>(load->disk_read);
    if (!load->disk_staging.empty()) {
      // Staged: the blocks go into the reserved host blocks now (a failed write ends the run there).
      const size_t bb = config_.lower_tiers->block_bytes();
      for (size_t i = 0; i < disk_read; ++i) {
        if (!runner_.write_host_block(hosts[i], std::span(load->disk_staging).subspan(i * bb, bb)).ok()) {
          disk_read = i;
          break;
        }
      }
    }
    kv_.release_host_blocks(hosts.subspan(disk_read));  // past a failed or corrupt read: recomputed
    int32_t loaded =
        kv_.adopt_reserved_host_blocks(ns, seq->tokens, load->first_block, hosts.first(disk_read), /*origin=*/1);
    if (load->redis_read > 0 && disk_read == static_cast<size_t>(load->disk_read) && run_transfers().ok()) {
      // Redis's blocks arrived in the load's buffer: copied into fresh host blocks here.
      const size_t bb = config_.lower_tiers->block_bytes();
      const std::vector<int32_t> fresh = kv_.adopt_host_blocks(
          ns, seq->tokens, load->first_block + load->disk_read, load->redis_read, /*origin=*/2);
      if (spiller_) spiller_->wait_for(fresh);
      for (size_t i = 0; i < fresh.size(); ++i) {
        if (!runner_.write_host_block(fresh[i], std::span(load->redis_data).subspan(i * bb, bb)).ok()) {
          // Never read: the cache forgets these blocks (and what hangs below them).
          std::vector<kv::BlockTransfer> lost;
          for (size_t j = i; j < fresh.size(); ++j)
            lost.push_back(kv::BlockTransfer{kv::TransferDirection::kDeviceToHost, 0, fresh[j]});
          kv_.transfers_failed(lost);
          break;
        }
        ++loaded;
      }
    }
    thread_stats_.lower_tier_blocks_loaded += loaded;
    scheduler_.enqueue(seq);
  }
}

void Engine::settle_lower_tier_loads() {
  if (loader_ == nullptr) return;
  loader_->wait_idle();
  finish_lower_tier_loads();
}

Status Engine::copy_blocks_on_runner(std::span<const kv::BlockCopy> copies) {
  // A fork's blocks may have come from evictions whose write-backs are pending
  // (and from other tenants: run_transfers zeroes those first).
  PAGODA_RETURN_IF_ERROR(run_transfers());
  std::vector<runtime::BlockCopy> moves;
  moves.reserve(copies.size());
  for (const kv::BlockCopy& c : copies) moves.push_back(runtime::BlockCopy{c.src, c.dst});
  return runner_.copy_blocks(moves);
}

void Engine::run_until_idle() {
  while (step() || !requests_.empty()) {
  }
}

}  // namespace pagoda::engine
