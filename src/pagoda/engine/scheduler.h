#pragma once
// Continuous batching: decides, every step, which sequences run and how many
// of their tokens, under a token budget and a cap on running sequences.
//
// Rank: a sequence ranks by its request's priority (GenerationRequest::priority,
// lower first), then by arrival; with every priority 0 (the default) that is
// plain FCFS. "Older" below means ranked ahead.
//
// Policy, in order:
//  1. Running sequences, decodes first, then unfinished prefills, each group in
//     rank order (FCFS with decode priority). A prefill takes a chunk of at
//     most the remaining budget (chunked prefill mixes with decodes).
//  2. When a running sequence needs a KV block and none is free, the
//     lowest-ranked (youngest) running sequence that is not yet in this step is
//     preempted (it goes back to the front of its priority's queue, its tokens kept). If it is the only
//     candidate, it preempts itself. By recompute, its blocks are freed and its
//     K/V computed again when it resumes; by swap (with a host tier), its K/V
//     moves to the host tier and comes back before it resumes, never
//     recomputed (a swap that does not fit in the host tier falls back to
//     recompute).
//  3. Waiting sequences are admitted in rank order while budget, running
//     slots (n per request, for its forks) and KV blocks allow; the queue head
//     blocks the rest (no overtaking), except a sequence whose tenant is at its
//     own KV block cap (KvCacheManager::set_namespace_block_limit): it stays
//     queued and later ones may pass it, so one tenant's cap never stalls the
//     others. Nothing is admitted in a step that preempted. With
//     prefill_join_limit > 0, nothing is admitted into a step whose prefill
//     chunks already hold that many tokens either: the newcomer starts in the
//     next step (see SchedulerConfig).
// Overlapped steps: a sequence that a launched step still carries
// (Sequence::steps_in_flight) is never preempted; if it cannot grow it sits
// the step out and is planned once that step is collected.
// Progress: the highest-ranked running sequence is never preempted for a lower
// one, so it always advances (a waiting request never preempts a running one:
// priority orders the queue and picks victims, as vLLM's priority policy does); a request that could never fit in the KV cache even
// alone is reported as failed instead of waiting forever.
//
// The scheduler asks the KV manager yes/no questions and commits; it never
// touches KV memory or logits.
//
// Thread safety: engine thread only.

#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/engine/sequence.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/forward_batch.h"

namespace pagoda::engine {

enum class PreemptionMode : uint8_t { kRecompute, kSwap };
std::string_view preemption_mode_name(PreemptionMode mode);  // "recompute", "swap"

struct SchedulerConfig {
  int32_t max_running_sequences = 64;  // >= 1
  int32_t max_tokens_per_step = 512;   // >= 1: prefill chunk + decode tokens per forward
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;  // kSwap needs a KV manager with a host tier
  // > 0: a waiting sequence is not admitted into a step whose prefill chunks
  // (every chunk but single-token decodes) already hold this many tokens; it
  // is admitted in a later step, where it may start alone. Requests that
  // arrive together then take their first steps one after another instead of
  // all sharing one long step: with prefills large enough to keep the device
  // busy alone (hundreds of tokens on a GPU), the first one's first token
  // comes after its own prefill, not after everyone's, throughput is
  // unchanged, and a host-tier hit's load is not waited on by the other
  // requests' first steps. Decode rows are never held back, and a long prompt
  // still takes the whole budget. The price: with many requests arriving at
  // once the same prompts take more steps (one prefill each), each also
  // running every decode row. 0 (default): the token budget alone decides.
  int32_t prefill_join_limit = 0;
  // >= 1: the most prompt positions a sequence that wants a logits row for each
  // (GenerationRequest::wants_prompt_rows: prompt logprobs) computes in one step.
  // Each such row crosses to the host and is reduced there while the engine's
  // loop waits (a vocabulary's worth of work a row), so a long scored prompt
  // takes many short steps instead of one that stalls every other sequence's
  // decode. Per sequence: several scored prompts take this many rows each.
  int32_t max_prompt_rows_per_step = 128;
};

struct ScheduledChunk {
  Sequence* sequence = nullptr;
  int32_t num_new_tokens = 0;
  bool produces_logits = false;  // the chunk reaches the last token: sample after it
  // wants_prompt_rows(): every new token gets a logits row (the last one is
  // also the sampling row when produces_logits).
  bool all_logits = false;
  // Logits rows this chunk adds to the step's output.
  int32_t logit_rows() const { return all_logits ? num_new_tokens : (produces_logits ? 1 : 0); }
};

struct StepPlan {
  ForwardBatch batch;
  std::vector<ScheduledChunk> chunks;    // same order as batch.sequences
  std::vector<Sequence*> preempted;      // this step
  std::vector<Sequence*> admitted;       // this step, first time or after preemption
  std::vector<Sequence*> unschedulable;  // can never fit the KV cache: fail them
  // The engine holds its sequences' KV blocks until it has finished the step (overlapped steps).
  bool held = false;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, kv::KvCacheManager& kv);

  // Appends to the back of its priority's part of the queue (new request) or
  // puts it at the front of that part (recompute of a fork that could not share blocks).
  void enqueue(Sequence* seq, bool at_front = false);
  // A sequence already registered with the KV manager (a successful fork).
  void add_running(Sequence* seq);
  // Drops a finished or aborted sequence and releases its KV blocks, or,
  // with release_kv false (a launched step still writes them), keeps them
  // until release_kv().
  void remove(Sequence* seq, bool aborted, bool release_kv = true);
  void release_kv(Sequence* seq, bool aborted);
  // Its K/V was lost (a failed transfer): frees its KV blocks and queues it to
  // be recomputed from its first token, ahead of new requests.
  void restart(Sequence* seq);

  StepPlan schedule();
  // After the forward: the chunks' K/V is written.
  Status commit(const StepPlan& plan);
  // Overlapped steps, commit() in two halves: advance() at launch (the
  // sequences count the chunks as computed, so the next step can be planned
  // before this one ends), commit_kv() at collect (the KV manager marks them
  // written, and full blocks enter the prefix cache only then).
  void advance(const StepPlan& plan);
  Status commit_kv(const StepPlan& plan);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  int64_t num_preemptions() const { return num_preemptions_; }  // both modes
  int64_t num_swap_preemptions() const { return num_swap_preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Sequence* seq, StepPlan& plan);
  void drop_kv(Sequence* seq);
  void requeue(Sequence* seq);
  // Admits a waiting sequence that was swapped out; false if it must wait.
  bool admit_swapped(Sequence* seq, int32_t& budget, StepPlan& plan, std::vector<Sequence*>& planned);
  Sequence* pick_victim(const std::vector<Sequence*>& planned, Sequence* requester) const;
  // Tokens of seq's next chunk within `budget` (max_prompt_rows_per_step for prompt rows).
  int32_t chunk_tokens(const Sequence* seq, int32_t budget) const;
  void add_chunk(Sequence* seq, int32_t num_new_tokens, StepPlan& plan);
  // Where a waiting sequence stands against its tenant's KV block cap
  // (KvCacheManager::namespace_room).
  kv::NamespaceRoom tenant_kv_room(Sequence* seq) const;
  // kSkip for a request that wants a row for every prompt position (wants_prompt_rows).
  static kv::PrefixReuse prefix_reuse(const Sequence* seq);

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // rank order
  int64_t num_preemptions_ = 0;
  int64_t num_swap_preemptions_ = 0;
};

}  // namespace pagoda::engine
