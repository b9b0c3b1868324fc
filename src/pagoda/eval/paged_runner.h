#pragma once
// PagedRunner: runs one token sequence at a time through the CPU model and the normal paged KV
// path: a KvCacheManager hands out blocks, the tokens go through the model in prefill chunks of
// `prefill_chunk` tokens (each chunk attends to the earlier chunks' K/V through the block table
// only), and decode steps append one token at a time. So the KV settings under test (block size,
// KV dtype) act exactly as they do when serving. The prefix cache is off: every call starts from
// an empty cache, as the perplexity protocol requires.
//
// Thread safety: one call at a time (the model's scratch buffers and the pool are shared).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/backend/cpu_kv_pool.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/model/cpu_model.h"

namespace pagoda::eval {

struct PagedRunnerOptions {
  int32_t block_size = 16;                // tokens per KV block
  std::optional<DType> kv_dtype;          // nullopt ("auto"): the model's own KV dtype (f32 on CPU)
  std::optional<DType> key_dtype;         // overrides kv_dtype for K only (e.g. K int8, V int4)
  std::optional<DType> value_dtype;       // overrides kv_dtype for V only
  int32_t prefill_chunk = 256;            // tokens per forward while prefilling (>= 1)
  int64_t max_sequence_tokens = 1024;     // the longest sequence run() / greedy() will see
};

struct GreedyOutput {
  std::vector<int32_t> tokens;             // generated ids (the stop id included when hit)
  std::vector<std::vector<float>> logits;  // logits that chose each generated token
};

class PagedRunner {
 public:
  // `model` must outlive the runner. Errors: bad options (kInvalidArgument, e.g. a dtype that
  // is not a KV dtype).
  static StatusOr<std::unique_ptr<PagedRunner>> create(CpuModel& model,
                                                       const PagedRunnerOptions& options);

  // Logits for every position of `tokens` (row i predicts tokens[i + 1]), [n, vocab] row-major
  // into `logits`. Errors: empty or too long a sequence, ids outside the vocabulary.
  Status score(std::span<const int32_t> tokens, std::vector<float>& logits);

  // Greedy decoding after `prompt`: up to max_new_tokens, stopping after any id in stop_ids.
  StatusOr<GreedyOutput> greedy(std::span<const int32_t> prompt, int32_t max_new_tokens,
                                std::span<const int32_t> stop_ids);

  int32_t vocab_size() const { return model_.config().vocab_size; }
  const PagedRunnerOptions& options() const { return options_; }
  DType key_dtype() const { return pool_.shape().key_dtype; }
  DType value_dtype() const { return pool_.shape().value_dtype; }
  // KV manager invariants (tests call it after each run).
  Status verify_integrity() const { return kv_->verify_integrity(); }

 private:
  PagedRunner(CpuModel& model, PagedRunnerOptions options, std::unique_ptr<kv::KvCacheManager> kv,
              CpuKvPool pool);
  // Forwards tokens [begin, end) of the sequence already registered as `seq`, whose first
  // `begin` tokens have K/V in the pool.
  Status forward_range(kv::SequenceId seq, std::span<const int32_t> tokens, int64_t begin,
                       int64_t end, bool all_logits, std::vector<float>& logits);
  Status check_tokens(std::span<const int32_t> tokens, int64_t extra) const;

  CpuModel& model_;
  PagedRunnerOptions options_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  CpuKvPool pool_;
  kv::SequenceId next_sequence_ = 1;
  ForwardBatch batch_;
};

}  // namespace pagoda::eval
