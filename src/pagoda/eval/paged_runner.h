#pragma once
// PagedRunner: runs one token sequence at a time through the engine, over any
// runtime::ModelRunner (the CPU reference or the GPU), so the KV settings under
// test (block size, KV dtype, the runner's kernels) act exactly as they do when
// serving: the engine's scheduler cuts the prompt into chunks of
// `prefill_chunk` tokens (each chunk attends to the earlier chunks' K/V through
// the block table only) and decodes one token per step. The prefix cache is
// off: every call starts from an empty cache, as the perplexity protocol
// requires.
//
// Thread safety: one call at a time.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::eval {

struct PagedRunnerOptions {
  // How the caller should build the runner's KV pool (the runner's
  // kv_geometry() is what counts once built).
  int32_t block_size = 16;                // tokens per KV block
  std::optional<DType> kv_dtype;          // nullopt ("auto"): the device's own KV dtype
  std::optional<DType> key_dtype;         // overrides kv_dtype for K only (e.g. K int8, V int4)
  std::optional<DType> value_dtype;       // overrides kv_dtype for V only
  // How the engine drives it.
  int32_t prefill_chunk = 256;            // tokens per forward while prefilling (>= 1)
  int64_t max_sequence_tokens = 1024;     // the longest sequence run() / greedy() will see
  // With a runner that has a host tier (capabilities().host_kv_blocks), the
  // KV manager gets it too; preemption swaps there or recomputes.
  engine::PreemptionMode preemption_mode = engine::PreemptionMode::kRecompute;
  // Token eviction (runtime/kv_compression.h). greedy() prefills the whole
  // prompt, then compacts as serving does; score() compacts between prefill
  // chunks too (compact_during_prefill), so every chunk after the budget is
  // predicted from an evicted cache: perplexity under eviction.
  runtime::KvCompressionConfig kv_compression;

  // KV blocks a runner needs for max_sequence_tokens (one spare), plus, with
  // token eviction, the fresh blocks a compaction takes before it frees the
  // old ones (at most 2 x budget slots, the entropy policy's largest head).
  int32_t num_kv_blocks() const {
    const int64_t spare = kv_compression.enabled() ? (2 * int64_t{kv_compression.budget} + block_size - 1) / block_size + 1 : 0;
    return static_cast<int32_t>((max_sequence_tokens + block_size - 1) / block_size + 1 + spare);
  }
};

struct GreedyOutput {
  std::vector<int32_t> tokens;             // generated ids (the stop id included when hit)
  std::vector<std::vector<float>> logits;  // logits that chose each generated token
  double prefill_seconds = 0.0;            // submit to the first token
  double decode_seconds = 0.0;             // first token to the last
};

class PagedRunner {
 public:
  // Takes the runner. Errors (kInvalidArgument): bad options, or a runner whose
  // KV pool cannot hold max_sequence_tokens.
  static StatusOr<std::unique_ptr<PagedRunner>> create(std::unique_ptr<runtime::ModelRunner> runner,
                                                       const PagedRunnerOptions& options);

  // Logits for every position of `tokens` (row i predicts tokens[i + 1]), [n, vocab] row-major
  // into `logits`. Errors: empty or too long a sequence, ids outside the vocabulary.
  Status score(std::span<const int32_t> tokens, std::vector<float>& logits);

  // Greedy decoding after `prompt`: up to max_new_tokens, stopping after any id in stop_ids.
  StatusOr<GreedyOutput> greedy(std::span<const int32_t> prompt, int32_t max_new_tokens,
                                std::span<const int32_t> stop_ids);

  int32_t vocab_size() const { return runner_->vocab_size(); }
  const PagedRunnerOptions& options() const { return options_; }
  DType key_dtype() const { return runner_->kv_geometry().key_dtype; }
  DType value_dtype() const { return runner_->kv_geometry().value_dtype; }
  int32_t block_size() const { return runner_->kv_geometry().block_size; }
  const KvPoolShape& kv_geometry() const { return runner_->kv_geometry(); }
  // KV manager invariants (tests call it after each run).
  Status verify_integrity() const { return kv_->verify_integrity(); }
  engine::EngineStats engine_stats() const { return engine_->stats(); }
  const kv::KvCacheManager& kv_cache() const { return *kv_; }

 private:
  PagedRunner(std::unique_ptr<runtime::ModelRunner> runner, PagedRunnerOptions options,
              std::unique_ptr<kv::KvCacheManager> kv, std::unique_ptr<engine::Engine> engine);
  Status check_tokens(std::span<const int32_t> tokens, int64_t extra) const;
  // Submits and steps the engine until the request ends; every delta in order.
  // first_token_seconds: when given, the time from submit to the first generated token.
  StatusOr<std::vector<engine::RequestOutput>> run(engine::GenerationRequest request,
                                                   double* first_token_seconds = nullptr);

  std::unique_ptr<runtime::ModelRunner> runner_;
  PagedRunnerOptions options_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<engine::Engine> engine_;
};

}  // namespace pagoda::eval
