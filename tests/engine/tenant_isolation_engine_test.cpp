// Tenant isolation through the engine: a block that passes from one tenant to
// another is zeroed on the runner before the new tenant's sequence touches it,
// and a tenant held back by its own KV cap does not hold back other tenants.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "fake_model_runner.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing::FakeModelRunner;
using testing_support::drain;
using testing_support::Harness;

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p(length);
  for (int32_t i = 0; i < length; ++i) p[i] = (i * 5 + salt * 11 + 1) % 64;
  return p;
}

GenerationRequest request_for(const std::string& ns, std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.tenant_namespace = ns;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Runs a FakeModelRunner and keeps, beside its pool, which tenant wrote each
// slot. Every block a sequence's table names must hold nothing another tenant
// wrote; zero_blocks() clears a block's marks (when the runner claims it can).
class TenantTrackingRunner final : public runtime::ModelRunner {
 public:
  TenantTrackingRunner(int32_t num_blocks, int32_t block_size, bool can_zero)
      : inner_(num_blocks, block_size), block_size_(block_size), can_zero_(can_zero),
        writer_(static_cast<size_t>(num_blocks) * block_size, -1) {}

  int32_t current_tenant = 0;  // the test runs one tenant's requests at a time
  int64_t foreign_reads = 0;   // slots of another tenant inside a sequence's blocks
  int64_t zeroed = 0;

  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch,
                                        std::span<const runtime::RowSampling> rows) override {
    for (const SequenceSlice& s : batch.sequences) {
      for (int32_t block : s.block_table)
        for (int32_t i = 0; i < block_size_; ++i) {
          const int32_t w = writer_[static_cast<size_t>(block) * block_size_ + i];
          foreign_reads += (w >= 0 && w != current_tenant) ? 1 : 0;
        }
      for (int32_t i = 0; i < s.num_new_tokens; ++i) {
        const int32_t pos = s.num_cached_tokens + i;
        writer_[static_cast<size_t>(s.block_table[pos / block_size_]) * block_size_ + pos % block_size_] =
            current_tenant;
      }
    }
    return inner_.execute(batch, rows);
  }
  Status copy_blocks(std::span<const runtime::BlockCopy> copies) override {
    for (const auto& c : copies)
      std::copy_n(writer_.begin() + static_cast<size_t>(c.src) * block_size_, block_size_,
                  writer_.begin() + static_cast<size_t>(c.dst) * block_size_);
    return inner_.copy_blocks(copies);
  }
  Status zero_blocks(std::span<const int32_t> blocks) override {
    for (int32_t b : blocks) std::fill_n(writer_.begin() + static_cast<size_t>(b) * block_size_, block_size_, -1);
    zeroed += static_cast<int64_t>(blocks.size());
    return ok_status();
  }
  runtime::RunnerCapabilities capabilities() const override { return {.zeroes_blocks = can_zero_}; }
  const KvPoolShape& kv_geometry() const override { return inner_.kv_geometry(); }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t max_context_length() const override { return inner_.max_context_length(); }
  std::vector<int32_t> eos_token_ids() const override { return inner_.eos_token_ids(); }

 private:
  FakeModelRunner inner_;
  int32_t block_size_;
  bool can_zero_;
  std::vector<int32_t> writer_;
};

// Tenant 0 fills most of the pool and leaves it cached; tenant 1 then runs
// and gets those blocks (evicted from 0's cache). Returns the runner's counts.
std::pair<int64_t, int64_t> foreign_reads_and_zeroed(bool runner_zeroes, int64_t* engine_zeroed) {
  constexpr int32_t kBlocks = 16, kBlockSize = 4;
  TenantTrackingRunner runner(kBlocks, kBlockSize, runner_zeroes);
  kv::KvCacheConfig kc;
  kc.num_blocks = kBlocks;
  kc.block_size = kBlockSize;
  auto kv = std::move(kv::KvCacheManager::create(kc)).value();
  Engine engine(EngineConfig{}, runner, *kv);
  for (int tenant = 0; tenant < 2; ++tenant) {
    runner.current_tenant = tenant;
    for (int r = 0; r < 3; ++r) {
      // 10-token prompts + 9 generated: 5 blocks each, the last one partly written.
      auto stream = engine.submit(request_for(tenant == 0 ? "a" : "b", prompt_of(10, 10 * tenant + r), 9));
      EXPECT_TRUE(stream.ok());
      engine.run_until_idle();
      EXPECT_TRUE(drain(**stream).finished);
      EXPECT_TRUE(engine.verify_integrity().ok());
    }
  }
  *engine_zeroed = engine.stats().kv_blocks_zeroed;
  return {runner.foreign_reads, runner.zeroed};
}

TEST(ZeroOnFree, BlocksPassingToAnotherTenantAreZeroedBeforeItsSequenceUsesThem) {
  int64_t engine_zeroed = 0;
  const auto [foreign, zeroed] = foreign_reads_and_zeroed(/*runner_zeroes=*/true, &engine_zeroed);
  EXPECT_EQ(foreign, 0) << "a sequence's blocks held slots another tenant wrote";
  EXPECT_GT(zeroed, 0) << "the second tenant must have been handed the first one's blocks";
  EXPECT_EQ(engine_zeroed, zeroed);
}

TEST(ZeroOnFree, WithoutZeroingTheOtherTenantsSlotsAreStillThere) {
  // The control: the same run on a runner that cannot zero leaves the first
  // tenant's K/V inside blocks the second tenant's sequences hold (never read
  // by attention, but present in memory).
  int64_t engine_zeroed = 0;
  const auto [foreign, zeroed] = foreign_reads_and_zeroed(/*runner_zeroes=*/false, &engine_zeroed);
  EXPECT_GT(foreign, 0);
  EXPECT_EQ(zeroed, 0);
  EXPECT_EQ(engine_zeroed, 0);
}

// Tenant "a" (cap 7) sends a 6-block request from `first` and a 2-block one
// from `second` (both "a", or two salted users of it): the second must wait for
// a's own blocks, and "b", queued behind it, must pass it.
void second_request_of_a_waits_and_b_passes(const std::string& first, const std::string& second) {
  SchedulerConfig sched;
  sched.max_running_sequences = 8;
  Harness h(/*num_blocks=*/64, /*block_size=*/4, sched);
  EXPECT_TRUE(h.kv->set_namespace_block_limit("a", 7).ok());
  auto a1 = *h.engine->submit(request_for(first, prompt_of(24, 1), 4));  // 6 blocks, 7 at the end
  auto a2 = *h.engine->submit(request_for(second, prompt_of(8, 2), 4));  // 2 more: over a's cap for now
  auto b1 = *h.engine->submit(request_for("b", prompt_of(8, 3), 4));     // behind a2 in the queue
  ASSERT_TRUE(h.engine->step());
  EXPECT_EQ(h.engine->stats().num_running, 2) << "b must pass a2, which waits for a's own blocks";
  EXPECT_LE(h.kv->namespace_usage(first).group_blocks_held, 7);
  h.run_checked();
  for (auto* s : {&a1, &a2, &b1}) {
    const auto c = drain(**s);
    EXPECT_TRUE(c.finished);
    EXPECT_EQ(c.error_code, StatusCode::kOk) << c.error;
    EXPECT_EQ(c.usage.completion_tokens, 4);
  }
  EXPECT_LE(h.kv->namespace_usage("a").group_blocks_held, 7);
  EXPECT_TRUE(h.engine->verify_integrity().ok());
}

TEST(TenantKvCapInTheEngine, ATenantWaitingOnItsOwnCapDoesNotBlockOthers) {
  second_request_of_a_waits_and_b_passes("a", "a");
}

TEST(TenantKvCapInTheEngine, SaltedUsersOfOneTenantWaitOnTheirTenantsOneCap) {
  second_request_of_a_waits_and_b_passes("a/user:1", "a/user:2");
}

TEST(TenantKvCapInTheEngine, ARequestOverItsTenantsWholeCapFailsInsteadOfWaitingForever) {
  Harness h(/*num_blocks=*/64, /*block_size=*/4);
  EXPECT_TRUE(h.kv->set_namespace_block_limit("a", 3).ok());
  auto big = *h.engine->submit(request_for("a", prompt_of(20, 1), 2));  // 5 blocks of prompt alone
  auto other = *h.engine->submit(request_for("b", prompt_of(8, 2), 2));
  h.run_checked();
  const auto c = drain(*big);
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kFailedPrecondition) << c.error;
  EXPECT_EQ(drain(*other).error_code, StatusCode::kOk);
}

}  // namespace
}  // namespace pagoda::engine
