#include "pagoda/engine/scheduler.h"

#include <algorithm>
#include <cassert>

namespace pagoda::engine {
namespace {

int32_t priority_of(const Sequence* seq) { return seq->request->request.priority; }

// The scheduling order: lower priority values first, then arrival (FCFS within a priority).
bool ranks_before(const Sequence* a, const Sequence* b) {
  if (priority_of(a) != priority_of(b)) return priority_of(a) < priority_of(b);
  return a->arrival_order < b->arrival_order;
}

void insert_by_rank(std::vector<Sequence*>& running, Sequence* seq) {
  running.insert(std::upper_bound(running.begin(), running.end(), seq, ranks_before), seq);
}

}  // namespace

std::string_view preemption_mode_name(PreemptionMode mode) {
  return mode == PreemptionMode::kSwap ? "swap" : "recompute";
}

Scheduler::Scheduler(SchedulerConfig config, kv::KvCacheManager& kv) : config_(config), kv_(kv) {}

void Scheduler::enqueue(Sequence* seq, bool at_front) {
  seq->status = SequenceStatus::kWaiting;
  // Behind every waiting sequence of its priority or a more urgent one (at_front: of a more urgent one).
  const int32_t priority = priority_of(seq);
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Sequence* w) {
    return at_front ? priority_of(w) >= priority : priority_of(w) > priority;
  });
  waiting_.insert(it, seq);
}

void Scheduler::add_running(Sequence* seq) {
  seq->status = SequenceStatus::kRunning;
  insert_by_rank(running_, seq);
}

void Scheduler::remove(Sequence* seq, bool aborted, bool release_kv) {
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  seq->status = SequenceStatus::kFinished;
  if (release_kv) this->release_kv(seq, aborted);
}

void Scheduler::release_kv(Sequence* seq, bool aborted) {
  if (seq->in_kv) {
    // Both keep the computed full blocks cached; abort is counted separately.
    Status s = aborted ? kv_.abort_sequence(seq->id) : kv_.free_sequence(seq->id);
    assert(s.ok());
    (void)s;
    seq->in_kv = false;
  }
  seq->num_computed = 0;
  seq->num_reserved = 0;
  seq->kv_evicted = 0;
  seq->swapped = false;
}

void Scheduler::drop_kv(Sequence* seq) {
  if (seq->in_kv) {
    Status s = kv_.free_sequence(seq->id);
    assert(s.ok());
    (void)s;
    seq->in_kv = false;
  }
  seq->swapped = false;
  seq->num_computed = 0;
  seq->num_reserved = 0;
  seq->kv_evicted = 0;  // recomputed from its first token: the runner's state starts afresh
}

void Scheduler::requeue(Sequence* seq) {
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  // Back to the queue among its priority's, in arrival order among the preempted, ahead of new requests.
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Sequence* w) {
    if (priority_of(w) != priority_of(seq)) return priority_of(w) > priority_of(seq);
    return w->arrival_order > seq->arrival_order || !w->request->admitted_once;
  });
  waiting_.insert(it, seq);
  seq->status = SequenceStatus::kWaiting;
}

void Scheduler::restart(Sequence* seq) {
  drop_kv(seq);
  requeue(seq);
}

void Scheduler::preempt(Sequence* seq, StepPlan& plan) {
  std::erase(running_, seq);
  // By swap when there is a host tier with room; by recompute otherwise.
  if (config_.preemption_mode == PreemptionMode::kSwap && seq->in_kv && kv_.swap_out(seq->id).ok()) {
    seq->swapped = true;
    ++num_swap_preemptions_;
  } else {
    drop_kv(seq);
  }
  requeue(seq);
  plan.preempted.push_back(seq);
  ++num_preemptions_;
}

bool Scheduler::admit_swapped(Sequence* seq, int32_t& budget, StepPlan& plan, std::vector<Sequence*>& planned) {
  const int32_t unreserved = static_cast<int32_t>(seq->tokens.size()) - seq->num_reserved;
  if (!kv_.can_swap_in(seq->id, unreserved)) return false;
  Status in = kv_.swap_in(seq->id);
  if (!in.ok()) return false;
  seq->swapped = false;
  if (unreserved > 0) {
    std::span<const int32_t> tail(seq->tokens.data() + seq->num_reserved, unreserved);
    if (!kv_.append_tokens(seq->id, tail).ok()) {  // not expected: can_swap_in counted these blocks
      drop_kv(seq);
      return false;
    }
    seq->num_reserved += unreserved;
  }
  // Not always the head: a sequence waiting on its own tenant's KV cap may stand before it.
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  seq->status = SequenceStatus::kRunning;
  insert_by_rank(running_, seq);
  plan.admitted.push_back(seq);
  const int32_t n = chunk_tokens(seq, budget);
  add_chunk(seq, n, plan);
  planned.push_back(seq);
  budget -= n;
  return true;
}

Sequence* Scheduler::pick_victim(const std::vector<Sequence*>& planned, Sequence* requester) const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* s = *it;
    if (s == requester) continue;
    if (std::find(planned.begin(), planned.end(), s) != planned.end()) continue;
    if (ranks_before(s, requester)) break;  // never preempt an older (or more urgent) one
    if (s->steps_in_flight > 0) continue;  // a launched step still writes its blocks
    return s;
  }
  return requester;
}

int32_t Scheduler::chunk_tokens(const Sequence* seq, int32_t budget) const {
  const int32_t n = std::min(seq->num_pending(), budget);
  if (!seq->request->request.wants_prompt_rows() || seq->num_computed >= seq->prompt_length) return n;
  // Recomputing after a preemption: up to the first position whose row has not gone out, so that
  // the next chunk starts there (only a chunk that starts there emits rows: add_chunk).
  if (seq->num_computed < seq->prompt_logits_done) return std::min(n, seq->prompt_logits_done - seq->num_computed);
  return std::min({n, std::max(1, config_.max_prompt_rows_per_step), seq->prompt_length - seq->num_computed});
}

void Scheduler::add_chunk(Sequence* seq, int32_t num_new_tokens, StepPlan& plan) {
  ForwardBatch& batch = plan.batch;
  SequenceSlice slice;
  slice.token_offset = batch.num_tokens();
  slice.num_new_tokens = num_new_tokens;
  // Cache slots, not positions: after token eviction fewer (sequence.h).
  slice.num_cached_tokens = seq->num_cached_slots();
  const runtime::KvCompressionConfig& compression = seq->request->kv_compression;
  if (compression.enabled()) {
    slice.kv_state = seq->id;
    slice.kv_state_reset = seq->kv_state_fresh;
    seq->kv_state_fresh = false;
    // h2o scores every query; the observation-window policies the last
    // `window` queries (their scores start afresh at each compaction).
    if (runtime::kv_policy_accumulates(compression.policy))
      slice.score_from_index = 0;
    else if (runtime::kv_policy_uses_scores(compression.policy)) {
      // The window ends where the next compaction may happen: after this step,
      // or, while the prompt is prefilled whole first, at the prompt's end.
      int32_t end = slice.num_cached_tokens + num_new_tokens;
      if (!compression.compact_during_prefill && seq->num_computed + num_new_tokens < seq->prompt_length)
        end = seq->prompt_length - seq->kv_evicted;
      slice.score_from_index = std::max(0, end - compression.window);
    }
  }
  for (int32_t i = 0; i < num_new_tokens; ++i) {
    batch.token_ids.push_back(seq->tokens[seq->num_computed + i]);
    batch.positions.push_back(seq->num_computed + i);
  }
  const bool reaches_end = seq->num_computed + num_new_tokens == static_cast<int32_t>(seq->tokens.size());
  // Prompt logits once per position: not again for a recompute after preemption.
  const bool all_logits = seq->request->request.wants_prompt_rows() &&
                          seq->num_computed == seq->prompt_logits_done &&
                          seq->num_computed + num_new_tokens <= seq->prompt_length;
  slice.logits_for_last_token = reaches_end;
  slice.logits_for_all_new_tokens = all_logits;
  // Tables are append-only (kv_cache_manager.h): this prefix stays valid.
  auto table = kv_.block_table(seq->id);
  assert(table.ok());
  const int32_t needed = kv_.blocks_for_tokens(seq->num_cached_slots() + num_new_tokens);
  slice.block_table.assign(table->begin(), table->begin() + std::min<size_t>(needed, table->size()));
  batch.sequences.push_back(std::move(slice));
  plan.chunks.push_back({seq, num_new_tokens, reaches_end, all_logits});
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = config_.max_tokens_per_step;
  std::vector<Sequence*> planned;
  // Tokens of this step's prefill chunks (every chunk but single-token decodes): prefill_join_limit.
  auto prefill_tokens = [&plan] {
    int32_t n = 0;
    for (const ScheduledChunk& c : plan.chunks)
      if (c.produces_logits ? c.num_new_tokens > 1 : c.num_new_tokens > 0) n += c.num_new_tokens;
    return n;
  };

  // 1. Running: decodes first, then prefill chunks, each in rank order (priority, then arrival).
  std::vector<Sequence*> order = running_;
  std::stable_partition(order.begin(), order.end(), [](const Sequence* s) { return s->num_pending() == 1; });
  for (Sequence* seq : order) {
    if (budget == 0) break;
    if (seq->status != SequenceStatus::kRunning) continue;  // preempted earlier in this loop
    if (seq->last_token_pending) continue;  // its last token is on the device: it ends when that comes
    const int32_t unreserved = static_cast<int32_t>(seq->tokens.size()) - seq->num_reserved;
    if (unreserved > 0 && seq->steps_in_flight > 0) {
      // A launched step still writes its blocks: it is never preempted now. If it cannot grow (the
      // pool, or its tenant's cap), it sits this step out and is planned again once that step is in.
      std::span<const int32_t> tail(seq->tokens.data() + seq->num_reserved, unreserved);
      if (!kv_.append_tokens(seq->id, tail).ok()) continue;
      seq->num_reserved += unreserved;
    } else if (unreserved > 0) {
      while (kv_.blocks_needed_to_append(seq->id, unreserved) > kv_.num_available_blocks()) {
        Sequence* victim = pick_victim(planned, seq);
        preempt(victim, plan);
        if (victim == seq) break;
      }
      if (seq->status != SequenceStatus::kRunning) continue;
      std::span<const int32_t> tail(seq->tokens.data() + seq->num_reserved, unreserved);
      if (!kv_.append_tokens(seq->id, tail).ok()) {
        preempt(seq, plan);
        continue;
      }
      seq->num_reserved += unreserved;
    }
    const int32_t n = chunk_tokens(seq, budget);
    add_chunk(seq, n, plan);
    planned.push_back(seq);
    budget -= n;
  }

  // 2. Waiting, in rank order; the head blocks the rest, except a sequence held back
  // only by its own tenant's KV cap: that one waits without blocking others.
  if (plan.preempted.empty()) {
    size_t next = 0;
    while (budget > 0 && next < waiting_.size()) {
      Sequence* seq = waiting_[next];
      RequestState* req = seq->request;
      const int32_t slots = (!req->forked && req->request.sampling.n > 1) ? req->request.sampling.n : 1;
      if (static_cast<int32_t>(running_.size()) + slots > config_.max_running_sequences && !running_.empty()) break;
      // A swapped-out decode (one token to go) is no prefill: it is never held back.
      if (config_.prefill_join_limit > 0 && seq->num_pending() > 1 && prefill_tokens() >= config_.prefill_join_limit)
        break;
      if (seq->swapped) {
        if (admit_swapped(seq, budget, plan, planned)) continue;
        if (!running_.empty() || !plan.chunks.empty()) break;
        // Nothing else holds device blocks and it still cannot come back (its
        // blocks plus the tokens to append exceed the pool): recompute instead.
        drop_kv(seq);
      }
      const std::string& ns = req->request.tenant_namespace;
      seq->block_hashes.extend(seq->tokens);
      const std::span<const uint64_t> hashes = seq->block_hashes.hashes();
      if (const kv::NamespaceRoom room = tenant_kv_room(seq); room != kv::NamespaceRoom::kFits) {
        if (room == kv::NamespaceRoom::kWaitForOwnBlocks) {
          ++next;
          continue;
        }
        waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
        plan.unschedulable.push_back(seq);
        continue;
      }
      if (!kv_.can_allocate_sequence(ns, seq->tokens, hashes, prefix_reuse(seq))) {
        // With nothing running every block is free or evictable: it can never fit.
        if (running_.empty() && plan.chunks.empty()) {
          waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
          plan.unschedulable.push_back(seq);
          continue;
        }
        break;
      }
      auto match = kv_.allocate_sequence(seq->id, ns, seq->tokens, hashes, prefix_reuse(seq));
      if (!match.ok()) break;
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
      seq->in_kv = true;
      seq->kv_state_fresh = true;
      seq->num_computed = match->cached_tokens;
      seq->num_reserved = static_cast<int32_t>(seq->tokens.size());
      if (req->cached_tokens < 0) {
        req->cached_tokens = match->cached_tokens;
        req->timeline.host_hit_tokens = match->host_blocks * kv_.block_size();
      }
      seq->status = SequenceStatus::kRunning;
      insert_by_rank(running_, seq);
      plan.admitted.push_back(seq);
      const int32_t n = chunk_tokens(seq, budget);
      add_chunk(seq, n, plan);
      planned.push_back(seq);
      budget -= n;
    }
  }
  return plan;
}

kv::NamespaceRoom Scheduler::tenant_kv_room(Sequence* seq) const {
  return kv_.namespace_room(seq->request->request.tenant_namespace, seq->tokens, seq->block_hashes.hashes(),
                            prefix_reuse(seq));
}

kv::PrefixReuse Scheduler::prefix_reuse(const Sequence* seq) {
  // Prompt rows (prompt logprobs, the harness's prompt logits) need every prompt position computed.
  return seq->request->request.wants_prompt_rows() ? kv::PrefixReuse::kSkip : kv::PrefixReuse::kRead;
}

void Scheduler::advance(const StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) chunk.sequence->num_computed += chunk.num_new_tokens;
}

Status Scheduler::commit_kv(const StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    const Sequence* seq = chunk.sequence;
    // A sequence that ended meanwhile (aborted, failed, stopped a step late) keeps its blocks only
    // until the step is finished: what this step wrote for it is never offered to the prefix cache.
    if (!seq->in_kv || seq->status == SequenceStatus::kFinished) continue;
    PAGODA_RETURN_IF_ERROR(kv_.mark_computed(seq->id, chunk.num_new_tokens));
  }
  return ok_status();
}

Status Scheduler::commit(const StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    Sequence* seq = chunk.sequence;
    if (!seq->in_kv || seq->status == SequenceStatus::kFinished) continue;  // ended while the forward ran
    PAGODA_RETURN_IF_ERROR(kv_.mark_computed(seq->id, chunk.num_new_tokens));
    seq->num_computed += chunk.num_new_tokens;
  }
  return ok_status();
}

}  // namespace pagoda::engine
