#pragma once
// The engine: owns the request queue, the scheduler and the sampling state,
// and drives the model one step at a time on its own thread.
//
//   Engine engine(config, runner, kv);
//   engine.start();
//   auto stream = engine.submit(request);          // any thread
//   while (auto out = (*stream)->next(100ms)) ...  // deltas until finished
//   engine.abort((*stream)->id());                 // any thread; frees blocks within a step
//   engine.shutdown(grace);                        // finish in-flight, then abort the rest
//
// Without start(), tests drive it synchronously with step() / run_until_idle().
//
// Thread safety: submit, abort, drop_*, stats and shutdown are safe from any
// thread. The runner and KV manager are used from the engine thread only
// (or the thread calling step()).

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <optional>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <span>
#include <utility>
#include <unordered_map>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/engine/latency_histogram.h"
#include "pagoda/engine/logit_rules.h"
#include "pagoda/engine/overlap_steps.h"
#include "pagoda/runtime/model_runner.h"
#include "pagoda/engine/request.h"
#include "pagoda/engine/request_timeline.h"
#include "pagoda/engine/scheduler.h"
#include "pagoda/engine/sequence.h"
#include "pagoda/engine/text_decoder.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kvstore/lower_tiers.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::engine {

class LowerTierLoader;
class LowerTierSpiller;

struct EngineConfig {
  SchedulerConfig scheduler;
  // Overlapped steps (ModelRunner::launch): while the device runs a step, the
  // engine plans and launches the next one, and it reads a step's tokens
  // while the device runs the next, so the host's share of a step
  // (scheduling, KV bookkeeping, detokenizing, streaming) hides behind the
  // device's. A step runs synchronously, as without overlap, when it needs
  // the host between steps: rows sampled on the host or under a grammar,
  // token eviction, tier transfers or block zeroing, a possible preemption.
  // A sequence that stops on a token the engine sees a step late has one row
  // computed for nothing. kAuto: on when the runner's launch() returns before
  // the device is done (RunnerCapabilities::overlaps_steps) and no tiers below
  // the host read host blocks beside the engine; kOn: on whenever those tiers
  // are absent, on any runner (the default launch() runs the step at once:
  // tests of the engine's side); kOff: never. Off by default until the GPU
  // path is measured (docs/CUDA_BACKEND.md, "Overlapped steps").
  OverlapSteps overlap_steps = OverlapSteps::kOff;
  // Requests submitted but not yet started; submit() past it is kResourceExhausted.
  int32_t max_queued_requests = 256;
  // Makes one decoder per sequence; default: token ids as " <id>".
  TextDecoderFactory text_decoder_factory;
  // KV tiers below the host tier (disk, redis), or null. Must outlive the
  // engine; needs a host tier, stable keys in the KV manager and a runner
  // with host_block_access. A request's prompt blocks missing from the device
  // and host tiers are looked up there when it arrives and read into the host
  // tier by reader threads (engine/lower_tier_loader.h) while the other
  // sequences keep stepping; the request is scheduled once they are in (then
  // promoted like any host hit). Every block the host tier receives is handed
  // to them to write (their own threads do the I/O).
  kvstore::LowerTiers* lower_tiers = nullptr;
  // Reader threads for lower-tier hits (>= 1).
  int32_t lower_tier_readers = 4;
  // Token eviction for requests that do not set their own
  // (GenerationRequest::kv_compression); default none.
  runtime::KvCompressionConfig kv_compression;
  // Request timelines (request_timeline.h): called on the engine thread with
  // each request's timeline when its first token is out (must be quick and
  // must not call back into the engine); log_timelines also writes each as one
  // line to stderr (the debug view).
  std::function<void(const RequestTimeline&)> timeline_sink;
  bool log_timelines = false;
};

// A consistent snapshot for /metrics and tests.
struct EngineStats {
  int64_t num_waiting = 0;          // sequences in the queue (incl. preempted)
  int64_t num_queued_requests = 0;  // requests not yet started (the bounded queue)
  int64_t num_running = 0;
  int64_t num_requests_in_flight = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;       // both modes
  int64_t swap_preemptions = 0;  // of which by swap (scheduler.h)
  int64_t transfer_failures = 0;  // transfer_blocks calls that failed (their sequences recomputed)
  int64_t requests_submitted = 0;
  int64_t requests_rejected_queue_full = 0;
  int64_t requests_finished_stop = 0;
  int64_t requests_finished_length = 0;
  int64_t requests_aborted = 0;
  int64_t requests_failed = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t jump_forward_tokens = 0;  // of which a constraint forced (TokenConstraint::forced_tokens)
  int64_t kv_blocks_zeroed = 0;  // blocks zeroed on the runner as they passed between tenants
  int64_t kv_compactions = 0;     // token eviction: sequences compacted
  int64_t kv_evicted_slots = 0;   // cache slots those compactions freed
  int64_t kv_compactions_deferred = 0;  // due, but no room for the fresh blocks yet (tried again next step)
  int64_t overlapped_steps = 0;   // steps launched while the one before still ran (EngineConfig::overlap_steps)
  kv::KvStats kv;
  runtime::TransferStats transfers;  // the runner's, between its device and host pools
  std::array<kvstore::TierIoStats, 2> lower_tiers{};  // [0] disk, [1] redis (enabled false when off)
  int64_t lower_tier_blocks_loaded = 0;  // blocks loaded into the host tier from disk or redis
  int64_t lower_tier_loads = 0;          // requests that waited for a lower-tier read
  int64_t lower_tier_loads_in_flight = 0;  // gauge: requests waiting for their reads now
  LatencyHistogram time_to_first_token;
  LatencyHistogram inter_token_latency;
  LatencyHistogram step_time;
};

class Engine {
 public:
  // `runner` and `kv` must outlive the engine. kInvalidArgument when the KV
  // manager's blocks are not the runner's (block size or count differ from
  // runner.kv_geometry(), or its host tier from the runner's host pool,
  // capabilities().host_kv_blocks): every step would otherwise name memory
  // that the runner does not hold; and for preemption by swap without a host
  // tier.
  static StatusOr<std::unique_ptr<Engine>> create(EngineConfig config, runtime::ModelRunner& runner,
                                                  kv::KvCacheManager& kv);
  // As create(), for callers that built both from one geometry (tests).
  Engine(EngineConfig config, runtime::ModelRunner& runner, kv::KvCacheManager& kv);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void start();
  // Stops accepting, lets in-flight requests finish for up to `grace`, aborts
  // the rest, joins the thread. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  // Validates (prompt ids in vocabulary, prompt + max_tokens within the
  // context and the KV cache, sampling params) and enqueues. Errors:
  // kInvalidArgument (bad request), kOutOfRange (prompt + max_tokens longer
  // than the context length or the whole KV cache), kResourceExhausted (queue
  // full), kFailedPrecondition (shutting down). Failures after this returns
  // arrive on the stream (RequestOutput::error_code, request.h).
  StatusOr<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Aborts a request (no-op if unknown or finished). Its blocks are freed at the
  // start of the next step; its stream gets a final delta with finish "abort".
  void abort(RequestId id);

  // Drops cached blocks (see KvCacheManager::drop_conversation / drop_namespace).
  // Run on the engine thread; block until done.
  StatusOr<int32_t> drop_conversation(const std::string& tenant_namespace, std::vector<int32_t> tokens,
                                      int64_t keep_prefix_tokens);
  StatusOr<int32_t> drop_namespace(const std::string& tenant_namespace);
  // One namespace's own KV figures (KvCacheManager::namespace_usage); read on
  // the engine thread, blocks until done.
  kv::NamespaceKvUsage namespace_usage(const std::string& tenant_namespace);
  // Runs `read` with the KV manager on the engine thread between steps and
  // blocks until it returns: for readers of KV state outside the engine (the
  // server's KV event feed drains events and takes snapshots through it).
  // `read` must not keep the reference, nor call back into the engine.
  void visit_kv_cache(const std::function<void(kv::KvCacheManager&)>& read);

  EngineStats stats() const;
  int32_t vocab_size() const { return vocab_size_; }
  int32_t max_context_length() const { return max_context_; }
  int32_t kv_block_size() const { return kv_block_size_; }
  // Whether steps overlap (EngineConfig::overlap_steps resolved against the runner and the tiers).
  bool overlaps_steps() const { return overlap_; }
  // EngineConfig::max_queued_requests: submit() beyond it is kResourceExhausted.
  int32_t max_queued_requests() const { return config_.max_queued_requests; }

  // Synchronous driving (no thread): one step; false if there was nothing to do.
  bool step();
  void run_until_idle();
  // KV invariants, for tests (call between steps, not while the thread runs).
  Status verify_integrity() const { return kv_.verify_integrity(); }

 private:
  void loop();
  void drain_commands();
  void admit_request(std::unique_ptr<RequestState> state);
  void abort_request(RequestState* req);
  // Ends every unfinished choice of `req` with `reason` and reports `failure`
  // (not ok; its code is what callers act on, request.h) on the finished delta.
  // The first failure of a request is the one reported.
  void fail_request(RequestState* req, const Status& failure, FinishReason reason = FinishReason::kError);
  // Shutdown: fails every request still in the engine with kCancelled.
  void cancel_all_requests();
  // Runs `work` on the engine thread between steps and blocks until it is
  // done: KV-manager calls from other threads. Without a running engine
  // thread (never started, or exited) it runs here, one caller at a time; a
  // thread told to stop still runs what was queued before it exits, so work
  // never runs beside a step.
  int32_t run_on_engine_thread(std::function<int32_t()> work);
  // How the runner should sample this sequence's next row (on_device false:
  // it needs the host sampler).
  runtime::RowSampling row_sampling_for(const Sequence* seq) const;
  // Whether the sequence's next row has penalties or logit rules in force (RowSampling::logit_edits).
  bool needs_logit_edits(const Sequence* seq) const;
  // The logit edits of a step's device-sampled rows (rows[r] for each (r, sequence)): the rules' bans and
  // biases, the penalties' seen tokens and output counts. Called once every token drawn before the step
  // is known (the histories and outputs are complete).
  void fill_logit_edits(std::span<const std::pair<size_t, const Sequence*>> edited,
                        std::span<runtime::RowSampling> rows);
  // The masks of a step's constrained rows sampled on the device, filled when the runner asks
  // for them (after it has queued the forward: RowSampling::mask_source). A row whose
  // constraint allows nothing is recorded as a dead end; its device token is discarded and
  // the request fails after the step.
  class DeviceMasks final : public runtime::TokenMaskSource {
   public:
    // Starts a step of `num_rows` rows with no masked row.
    void reset(size_t num_rows);
    // Row `row` samples under `seq`'s constraint.
    void add(size_t row, Sequence* seq);
    bool dead_end(size_t row) const { return row < dead_.size() && dead_[row] != 0; }
    void fill_mask(size_t row, std::span<uint64_t> mask) override;

   private:
    std::vector<Sequence*> sequences_;  // per row; null for rows without a deferred mask
    std::vector<char> dead_;
  };
  void sample_into(Sequence* seq, std::span<const float> logits);
  // The rows of a chunk that computes prompt positions prompt_logits_done, ..: to the request's
  // output as raw rows (return_prompt_logits) and as the next prompt tokens' scores
  // (sampling.prompt_logprobs; the last prompt position predicts no prompt token).
  void add_prompt_rows(const Sequence* seq, std::span<const float> rows);
  // The same from scores the runner computed where the logits are (runtime::RowSampling::score_token):
  // one per row that predicts a prompt token, in order.
  void add_prompt_scores(const Sequence* seq, std::span<const runtime::RowScore> scores);
  // A prompt-logits chunk's rows (one per token): each row that predicts a prompt token is scored by the
  // runner where it can (prompt_logprobs without raw prompt logits), the others come back as logits.
  void push_prompt_rows(const ScheduledChunk& chunk, std::vector<runtime::RowSampling>& rows) const;
  // What the request's logit rules read of the sequence (its known output, the eos ids).
  LogitRuleContext logit_rule_context(const Sequence* seq) const;
  // Structured outputs: samples with the sequence's token mask applied and moves its constraint
  // past the token; a dead end fails the request (kInternal).
  void sample_constrained(Sequence* seq, std::span<const float> logits);
  // Appends the tokens seq's constraint forces after the token just accepted (jump-forward).
  void jump_forward(Sequence* seq);
  // Runs the KV manager's copy-on-write copies on the runner's memory (after
  // the pending tier transfers, which must come first).
  Status copy_blocks_on_runner(std::span<const kv::BlockCopy> copies);
  // Zeroes, on the runner, the blocks the KV manager handed from one tenant to
  // another since the last call (KvCacheManager::take_blocks_to_zero); runs
  // first in run_transfers(), so before every transfer, block copy and
  // forward. A runner that cannot zero (RunnerCapabilities::zeroes_blocks
  // false) is skipped: docs/SECURITY.md says which.
  Status zero_blocks_changing_tenant();
  // Hands the KV manager's pending tier transfers to the runner, in order. On
  // failure the KV manager forgets what was lost and the sequences whose K/V
  // it was start over (recompute); the caller must not run a forward planned
  // before that.
  Status run_transfers();
  // Request timelines: the transfers run_transfers() handed to the runner
  // since the step began, per direction.
  int32_t step_transfer_blocks_[runtime::kNumTransferDirections] = {0, 0};
  void emit_timeline(RequestState* req);
  // Hands the host blocks that `moves` wrote (device->host) to the lower tiers.
  void spill_to_lower_tiers(std::span<const kv::BlockTransfer> moves);
  // Starts reading the blocks of seq's prompt that the device and host tiers
  // miss from the lower tiers (reserving host blocks for the disk's run);
  // false when there is nothing to read: schedule it at once.
  bool start_lower_tier_load(Sequence* seq);
  // Adopts the finished reads into the host tier and schedules their
  // sequences; the reserved blocks of aborted ones go back.
  void finish_lower_tier_loads();
  // Shutdown: waits for every read in flight, then gives its blocks back.
  void settle_lower_tier_loads();
  void fork_children(Sequence* parent, std::span<const float> logits);
  // Token eviction: compacts the sequences of this step whose cache passed
  // their policy's trigger (KvCacheManager::compact_sequence, then the
  // runner's compact_kv). A failure fails the request.
  void compact_sequences(const StepPlan& plan);
  Status compact_sequence(Sequence* seq);
  // Which settings a request runs under, checked: kInvalidArgument naming the
  // kv_compression field, or kUnimplemented when the runner cannot compact.
  StatusOr<runtime::KvCompressionConfig> resolve_kv_compression(const GenerationRequest& request) const;
  // Adds a token the engine now sees: appended, or, at `position` >= 0, in
  // place of the pending token a launched step sampled there.
  void append_token(Sequence* seq, const SampledToken& token, int32_t position = -1);
  // One step after scheduling: its transfers, then the forward, run (execute)
  // or launched (launch) when overlapped steps allow it.
  bool run_step(StepPlan plan);
  // The step's result: commits it and turns its rows into tokens, deltas and
  // finished requests. `launched`: it went through launch() (committed to the
  // KV manager only now); `positions`: then, per row, where its pending token
  // sits in the sequence's tokens.
  void finish_step(StepPlan& plan, std::span<const runtime::RowSampling> rows, StatusOr<runtime::StepResult> result,
                   std::span<const int32_t> positions, Clock::time_point start, bool launched);
  // Overlapped steps: a launched step, not yet collected.
  struct LaunchedStep {
    StepPlan plan;
    std::vector<runtime::RowSampling> rows;
    std::vector<int32_t> positions;  // per row: its pending token's index in the sequence's tokens
    Clock::time_point start;
  };
  // Whether `plan` may be launched (overlapped) instead of executed.
  bool launchable(const StepPlan& plan, std::span<const runtime::RowSampling> rows) const;
  // Launches `plan`; on success its sequences count its tokens as computed and hold a pending token per row.
  Status launch_step(StepPlan& plan, std::vector<runtime::RowSampling> rows, Clock::time_point start);
  // Collects the oldest launched step and finishes it.
  void collect_step();
  void collect_all_steps();
  // Planned steps hold their sequences: a sequence that finishes meanwhile keeps its KV blocks until
  // the last step that carries it is finished (a launched step may still write them).
  void hold(StepPlan& plan);
  void unhold(StepPlan& plan);
  // Inputs of `plan` that are tokens still pending on the device, to be taken from the launched step
  // (ForwardBatch::deferred_tokens) or, once collected, from the sequences.
  struct PendingInput {
    int32_t token_index;
    Sequence* seq;
    int32_t position;
  };
  std::vector<PendingInput> pending_inputs(const StepPlan& plan) const;
  void finish_sequence(Sequence* seq, FinishReason reason);
  ChoiceDelta& delta_for(Sequence* seq);
  void flush_outputs();
  Sequence* new_sequence(RequestState* req, int32_t choice_index);
  void publish_stats(double step_seconds);

  EngineConfig config_;
  runtime::ModelRunner& runner_;
  kv::KvCacheManager& kv_;
  Scheduler scheduler_;
  const int32_t vocab_size_;
  const int32_t max_context_;
  const std::vector<int32_t> eos_ids_;
  // Copied at construction: submit() runs on client threads and must not touch the KV manager.
  const int32_t kv_block_size_;
  const int64_t kv_num_blocks_;
  const bool runner_compacts_kv_;
  const bool runner_kv_scores_;  // RunnerCapabilities::kv_attention_scores
  const bool runner_kv_head_budgets_;  // RunnerCapabilities::kv_head_budgets
  const int32_t kv_num_layers_;
  // Reads spilled host blocks for the tiers below the host off this thread (null without such tiers).
  std::unique_ptr<LowerTierSpiller> spiller_;
  // Reads lower-tier hits off this thread (null without such tiers). After
  // spiller_: destroyed first, as it waits for its readers.
  std::unique_ptr<LowerTierLoader> loader_;
  // Keys the device draws of unseeded requests (with the request id): differs per engine.
  const uint64_t unseeded_salt_;

  // Shared with submitters.
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::vector<std::unique_ptr<RequestState>> pending_submits_;
  std::vector<RequestId> pending_aborts_;
  std::vector<std::function<void()>> pending_tasks_;
  bool loads_finished_ = false;  // the loader has a finished load to hand back
  std::atomic<int64_t> num_queued_{0};
  std::atomic<int64_t> num_in_flight_{0};
  std::atomic<RequestId> next_request_id_{1};
  std::atomic<int64_t> rejected_queue_full_{0};
  bool accepting_ = true;
  bool stop_thread_ = false;
  // kRunning from start() until the loop has run its last queued task.
  enum class ThreadState { kNotStarted, kRunning, kExited };
  ThreadState thread_state_ = ThreadState::kNotStarted;
  std::condition_variable idle_;  // notified when requests finish (shutdown's grace wait)
  std::mutex inline_mutex_;       // serializes KV work run inline when no engine thread runs
  std::thread thread_;

  // Engine-thread state.
  std::unordered_map<RequestId, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<kv::SequenceId, std::unique_ptr<Sequence>> sequences_;
  kv::SequenceId next_sequence_id_ = 1;
  uint64_t next_arrival_ = 1;
  std::unordered_map<RequestId, RequestOutput> step_outputs_;
  std::vector<RequestState*> finished_requests_;
  std::vector<uint64_t> constraint_mask_;    // scratch of sample_constrained
  std::vector<int32_t> forced_tokens_;       // scratch of jump_forward
  DeviceMasks device_masks_;                 // this step's device-sampled constrained rows
  std::vector<runtime::LogitEdit> logit_edits_;  // this step's edited rows' lists (fill_logit_edits)
  std::vector<float> constrained_logits_;   // scratch of sample_constrained
  bool overlap_ = false;                    // EngineConfig::overlap_steps, resolved
  std::deque<LaunchedStep> launched_;       // oldest first; at most two
  std::optional<Clock::time_point> last_step_end_;  // overlapped steps' step time: end to end

  // Counters owned by the engine thread, published under stats_mutex_.
  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  EngineStats thread_stats_;
};

}  // namespace pagoda::engine
