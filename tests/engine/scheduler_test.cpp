// The scheduler alone, over a real KV manager: which sequence is preempted,
// that nobody overtakes the queue head, and that a step that preempted admits
// nothing. Sequences advance as the engine would move them (commit, then one
// sampled token appended).

#include "pagoda/engine/scheduler.h"

#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/engine/sequence.h"

namespace pagoda::engine {
namespace {

constexpr int32_t kBlockSize = 4;

class SchedulerTest : public ::testing::Test {
 protected:
  void make(int32_t num_blocks, SchedulerConfig config = {}, int32_t num_host_blocks = 0) {
    kv::KvCacheConfig kc;
    kc.num_blocks = num_blocks;
    kc.num_host_blocks = num_host_blocks;
    kc.block_size = kBlockSize;
    kv_ = std::move(kv::KvCacheManager::create(kc)).value();
    scheduler_ = std::make_unique<Scheduler>(config, *kv_);
  }
  // A new request of `prompt_tokens` distinct tokens, queued at the back (of its priority's part).
  Sequence* submit(int32_t prompt_tokens, int32_t priority = 0) {
    auto req = std::make_unique<RequestState>();
    req->id = static_cast<RequestId>(requests_.size() + 1);
    req->request.priority = priority;
    auto seq = std::make_unique<Sequence>();
    seq->id = static_cast<kv::SequenceId>(sequences_.size() + 1);
    seq->request = req.get();
    seq->arrival_order = seq->id;
    seq->block_hashes = kv::BlockHashes(kBlockSize);
    seq->tokens.resize(static_cast<size_t>(prompt_tokens));
    std::iota(seq->tokens.begin(), seq->tokens.end(), static_cast<int32_t>(seq->id) * 1000);
    seq->prompt_length = prompt_tokens;
    req->sequences.push_back(seq.get());
    Sequence* raw = seq.get();
    scheduler_->enqueue(raw);
    requests_.push_back(std::move(req));
    sequences_.push_back(std::move(seq));
    return raw;
  }
  // One engine step: schedule, "run", commit, and append a token to every
  // sequence whose chunk reached its end.
  StepPlan step() {
    StepPlan plan = scheduler_->schedule();
    for (Sequence* s : plan.admitted) s->request->admitted_once = true;
    EXPECT_TRUE(scheduler_->commit(plan).ok());
    for (const ScheduledChunk& c : plan.chunks)
      if (c.produces_logits) c.sequence->tokens.push_back(7);
    EXPECT_TRUE(kv_->verify_integrity().ok()) << kv_->verify_integrity().to_string();
    return plan;
  }

  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<RequestState>> requests_;
  std::vector<std::unique_ptr<Sequence>> sequences_;
};

bool contains(const std::vector<Sequence*>& v, const Sequence* s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST_F(SchedulerTest, VictimIsTheYoungestRunningSequenceNotAlreadyInTheStep) {
  make(/*num_blocks=*/5);
  Sequence* a = submit(4);
  Sequence* b = submit(4);
  Sequence* c = submit(8);
  StepPlan first = step();
  ASSERT_EQ(first.admitted.size(), 3u);  // 4 of 5 blocks in use, every sequence one token past a block
  StepPlan second = step();
  // a takes the last free block; b needs one more: c (youngest) goes, not a.
  ASSERT_EQ(second.preempted.size(), 1u);
  EXPECT_EQ(second.preempted[0], c);
  EXPECT_EQ(c->status, SequenceStatus::kWaiting);
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_EQ(c->tokens.size(), 9u) << "a preempted sequence keeps its tokens";
  ASSERT_EQ(second.chunks.size(), 2u);
  EXPECT_EQ(second.chunks[0].sequence, a);
  EXPECT_EQ(second.chunks[1].sequence, b);
  EXPECT_EQ(scheduler_->num_preemptions(), 1);
}

TEST_F(SchedulerTest, TheOldestSequenceIsNeverPreemptedForAYoungerOne) {
  make(/*num_blocks=*/2);
  Sequence* a = submit(4);
  Sequence* b = submit(4);
  ASSERT_EQ(step().admitted.size(), 2u);
  // Both need a third block; a (older) gets it by preempting b, never the reverse.
  StepPlan plan = step();
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], b);
  EXPECT_EQ(a->status, SequenceStatus::kRunning);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].sequence, a);
}

// Priorities (vLLM's priority policy): the queue is admitted most urgent first, FCFS within a priority.
TEST_F(SchedulerTest, PriorityOrdersTheQueue) {
  SchedulerConfig config;
  config.max_running_sequences = 2;
  make(/*num_blocks=*/32, config);
  Sequence* a = submit(4);
  ASSERT_EQ(step().admitted.size(), 1u);
  Sequence* low = submit(4, /*priority=*/5);
  Sequence* urgent = submit(4, /*priority=*/-1);
  Sequence* plain = submit(4);
  Sequence* plain_later = submit(4);
  std::vector<Sequence*> admitted;
  for (Sequence* done : {a, urgent, plain, plain_later}) {
    StepPlan plan = step();
    ASSERT_EQ(plan.admitted.size(), 1u) << "one running slot frees a step";
    admitted.push_back(plan.admitted[0]);
    scheduler_->remove(done, /*aborted=*/false);
  }
  EXPECT_EQ(admitted, (std::vector<Sequence*>{urgent, plain, plain_later, low}));
}

// The victim is the least urgent running sequence (then the youngest), even when it is the oldest.
TEST_F(SchedulerTest, VictimIsTheLeastUrgentRunningSequence) {
  make(/*num_blocks=*/5);
  Sequence* a = submit(4, /*priority=*/2);
  Sequence* b = submit(4);
  Sequence* c = submit(8);
  ASSERT_EQ(step().admitted.size(), 3u);
  StepPlan second = step();
  // b takes the last free block; c needs one more: a (least urgent) goes, though it came first.
  ASSERT_EQ(second.preempted.size(), 1u);
  EXPECT_EQ(second.preempted[0], a);
  ASSERT_EQ(second.chunks.size(), 2u);
  EXPECT_EQ(second.chunks[0].sequence, b);
  EXPECT_EQ(second.chunks[1].sequence, c);
  // Back in the queue behind a newer but more urgent request.
  Sequence* d = submit(1);
  scheduler_->remove(b, /*aborted=*/false);
  scheduler_->remove(c, /*aborted=*/false);
  StepPlan third = step();
  ASSERT_EQ(third.admitted.size(), 2u);
  EXPECT_EQ(third.admitted[0], d);
  EXPECT_EQ(third.admitted[1], a);
}

TEST_F(SchedulerTest, TheMostUrgentSequenceIsNeverPreemptedForALessUrgentOne) {
  make(/*num_blocks=*/2);
  Sequence* a = submit(4, /*priority=*/1);
  Sequence* b = submit(4);
  ASSERT_EQ(step().admitted.size(), 2u);
  // Both need a third block; b (more urgent, though younger) gets it by preempting a.
  StepPlan plan = step();
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], a);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].sequence, b);
}

// A swapped-out sequence behind a queue head that waits for its own tenant's KV cap comes back from its own place:
// the head stays queued (it was once dropped from the queue and never ran).
TEST_F(SchedulerTest, ASwappedSequenceBehindATenantCappedHeadLeavesTheHeadQueued) {
  SchedulerConfig config;
  config.preemption_mode = PreemptionMode::kSwap;
  make(/*num_blocks=*/6, config, /*num_host_blocks=*/16);
  ASSERT_TRUE(kv_->set_namespace_block_limit("capped", 2).ok());
  Sequence* a = submit(5);  // 2 blocks, the capped tenant's whole cap, room to grow to 8 tokens
  a->request->request.tenant_namespace = "capped";
  Sequence* f = submit(11);  // 3 blocks
  Sequence* s = submit(4);   // 1 block, then a second one it cannot get
  ASSERT_EQ(step().admitted.size(), 3u);
  StepPlan second = step();
  ASSERT_EQ(second.preempted, (std::vector<Sequence*>{s}));
  ASSERT_TRUE(s->swapped);
  Sequence* x = submit(4, /*priority=*/-1);  // ahead of s in the queue, but its tenant is at its cap
  x->request->request.tenant_namespace = "capped";
  scheduler_->remove(f, /*aborted=*/false);
  StepPlan third = step();
  ASSERT_EQ(third.admitted, (std::vector<Sequence*>{s}));
  EXPECT_EQ(x->status, SequenceStatus::kWaiting);
  EXPECT_EQ(scheduler_->num_waiting(), 1u) << "the capped head is still queued";
  scheduler_->remove(a, /*aborted=*/false);
  StepPlan fourth = step();
  EXPECT_EQ(fourth.admitted, (std::vector<Sequence*>{x}));
}

TEST_F(SchedulerTest, NothingIsAdmittedInAStepThatPreempted) {
  make(/*num_blocks=*/5);
  submit(4);
  submit(4);
  Sequence* c = submit(8);
  step();
  Sequence* d = submit(1);  // would fit once c's blocks are freed
  StepPlan plan = step();
  ASSERT_TRUE(contains(plan.preempted, c));
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(d->status, SequenceStatus::kWaiting);
  // The preempted sequence is ahead of the new request in the queue.
  StepPlan next = step();
  if (!next.admitted.empty()) {
    EXPECT_EQ(next.admitted[0], c);
  }
}

TEST_F(SchedulerTest, ASmallRequestDoesNotOvertakeABlockedQueueHead) {
  make(/*num_blocks=*/4);
  Sequence* a = submit(8);  // 2 blocks, running
  step();
  ASSERT_EQ(a->status, SequenceStatus::kRunning);
  Sequence* big = submit(12);  // 3 blocks: does not fit beside a
  Sequence* small = submit(2);  // 1 block: would fit
  StepPlan plan = step();
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(big->status, SequenceStatus::kWaiting);
  EXPECT_EQ(small->status, SequenceStatus::kWaiting);
  // Once a finishes, the head goes first.
  scheduler_->remove(a, /*aborted=*/false);
  StepPlan after = step();
  ASSERT_FALSE(after.admitted.empty());
  EXPECT_EQ(after.admitted[0], big);
}

TEST_F(SchedulerTest, ARequestThatCanNeverFitIsReportedNotQueuedForever) {
  make(/*num_blocks=*/2);
  Sequence* huge = submit(12);
  StepPlan plan = scheduler_->schedule();
  ASSERT_EQ(plan.unschedulable.size(), 1u);
  EXPECT_EQ(plan.unschedulable[0], huge);
  EXPECT_EQ(scheduler_->num_waiting(), 0u);
}

TEST_F(SchedulerTest, BlockTablesInThePlanNeverChangeUnderARunningSequence) {
  make(/*num_blocks=*/16);
  Sequence* a = submit(9);
  Sequence* b = submit(9);  // same length, other tokens
  b->tokens = a->tokens;    // identical prompts: b's full blocks duplicate a's
  StepPlan first = step();
  ASSERT_EQ(first.chunks.size(), 2u);
  const std::vector<int32_t> b_table = first.chunks[1].sequence == b ? first.batch.sequences[1].block_table
                                                                     : first.batch.sequences[0].block_table;
  StepPlan second = step();
  for (size_t i = 0; i < second.chunks.size(); ++i) {
    if (second.chunks[i].sequence != b) continue;
    const auto& table = second.batch.sequences[i].block_table;
    ASSERT_GE(table.size(), b_table.size());
    EXPECT_TRUE(std::equal(b_table.begin(), b_table.end(), table.begin())) << "b's table changed";
  }
}


// prefill_join_limit: requests that arrive together take their first steps one
// after another (each after its own prefill, not everyone's); decodes still
// join, and without the limit they all share the first step.
TEST_F(SchedulerTest, PrefillJoinLimitStartsTogetherArrivingPromptsOneAfterAnother) {
  SchedulerConfig config;
  config.max_tokens_per_step = 512;
  make(64, config);
  Sequence* a = submit(20);
  Sequence* b = submit(20);
  StepPlan shared = step();
  EXPECT_EQ(shared.chunks.size(), 2u) << "no limit: both prefills in one step";

  config.prefill_join_limit = 16;
  make(64, config);
  a = submit(20);
  b = submit(20);
  Sequence* c = submit(3);
  StepPlan first = step();
  ASSERT_EQ(first.chunks.size(), 1u);
  EXPECT_EQ(first.chunks[0].sequence, a);
  StepPlan second = step();
  ASSERT_EQ(second.chunks.size(), 2u) << "a's decode joins b's prefill";
  EXPECT_EQ(second.chunks[0].sequence, a);
  EXPECT_EQ(second.chunks[0].num_new_tokens, 1);
  EXPECT_EQ(second.chunks[1].sequence, b);
  StepPlan third = step();
  ASSERT_EQ(third.chunks.size(), 3u) << "below the limit (decodes only) c is admitted";
  EXPECT_EQ(third.chunks[2].sequence, c);

  // A prompt alone still takes the whole budget, chunked as before.
  make(64, config);
  Sequence* longer = submit(200);
  StepPlan alone = step();
  ASSERT_EQ(alone.chunks.size(), 1u);
  EXPECT_EQ(alone.chunks[0].sequence, longer);
  EXPECT_EQ(alone.chunks[0].num_new_tokens, 200);
}

}  // namespace
}  // namespace pagoda::engine
