#pragma once
// The seam between whoever schedules work (the engine) and a model on any
// backend. One entry point runs one planned step: execute(batch, rows) returns
// the sampled token of every row the runner may sample where the logits are
// (`RowSampling::on_device`) and the logits of every other row. The engine owns
// scheduling and KV block ids; the runner owns weights and KV memory, whose
// shape it states in kv_geometry() so the engine can check, once at
// construction, that its KV manager hands out blocks of the same size and
// number.
//
// Host tier: a runner may also own a second KV pool in host memory
// (capabilities().host_kv_blocks blocks of the same shape; pinned on a GPU)
// and move blocks between it and its device pool when the KV manager says so
// (transfer_blocks). A host block is one contiguous chunk holding the block's
// K and V codes and scales of every layer (runtime/host_block_layout.h), so a
// block moves as one unit whatever the device layout is.
//
// Thread safety: called from one thread (the engine's) only.

#include <chrono>
#include <cstddef>
#include <deque>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/runtime/forward_batch.h"
#include "pagoda/runtime/kv_compression.h"
#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda::runtime {

// How one logits row is sampled by the runner: the sampler's temperature (0:
// argmax), min-p, top-k and top-p (engine/sampler.h order and semantics), and
// a counter-based key: the draw depends only on (seed, step) and the row, so a
// seeded request is reproducible whatever else is batched with it. Only set
// on_device when RunnerCapabilities::samples_on_device.
//
// `allowed` (structured outputs; only on on_device rows, only when
// RunnerCapabilities::samples_masked_on_device): the tokens the row may
// produce, one bit per token id, 64 per word, least significant bit first,
// ceil(vocab / 64) words; the other tokens' logits count as -inf for the draw
// and for the reported logprob. It points into the caller's memory and must
// stay valid for the execute() call only. Null: every token.
//
// `mask_source` (same conditions; exclusive with `allowed`): the row's mask is
// not ready yet. The runner calls mask_source->fill_mask(row, words) once for
// the row during execute(), from the calling thread, after it has queued the
// forward, so computing the masks on the host overlaps the device's work.
// `row` is the row's index in `rows`.
//
// `score_token` (prompt scoring; never with on_device, only when
// RunnerCapabilities::scores_on_device): the row's logits stay where they are
// and the runner returns the RowScore of that given token instead (the CPU's
// engine::score_token: its logprob in the raw row, its rank and the
// score_top_k most likely tokens), so a prompt scored token by token moves a
// few bytes a row instead of the vocabulary's logits. On an on_device row
// (top logprobs of a sampled token), score_top_k > 0 asks for the RowScore of
// the token the runner drew, under the same conditions.
//
// Logit edits (on_device rows only, only when RunnerCapabilities::
// edits_logits_on_device): the request's logit rules (engine/logit_rules.h:
// bans and biases, allowed_token_ids excepted) and penalties
// (engine::Sampler), as one entry per token they touch, applied in the host's
// order: a banned token's logit becomes -inf, else a bias is added; then a
// seen token's (prompt or output, kSeen) is divided by repetition_penalty
// where positive (multiplied where not); then, with output_count > 0, it is
// lowered by frequency_penalty x output_count + presence_penalty. Only the
// draw sees them: the row's reported logprob and scores stay those of the raw
// row (masked where masked). The span points into the caller's memory, valid
// for the execute() call only; such rows are never launched (the list needs
// every token drawn before the step).
class TokenMaskSource;
struct LogitEdit {
  enum Flags : uint8_t { kSeen = 1, kBanned = 2, kBiased = 4 };
  int32_t token = 0;         // distinct within a row
  int32_t output_count = 0;  // > 0: frequency and presence apply
  float bias = 0.0f;         // with kBiased: logit_bias
  uint8_t flags = 0;
};
struct RowSampling {
  bool on_device = false;  // false: the runner returns this row's logits instead
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;  // per sequence
  uint64_t step = 0;  // the sequence's output index
  const uint64_t* allowed = nullptr;
  TokenMaskSource* mask_source = nullptr;
  int32_t score_token = -1;  // >= 0: a scored row (above)
  int32_t score_top_k = 0;   // [0, kMaxScoreTopK]
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::span<const LogitEdit> logit_edits;
  bool masked() const { return allowed != nullptr || mask_source != nullptr; }
  bool scored() const { return score_token >= 0; }
  bool edited() const { return !logit_edits.empty(); }
  // The row has a RowScore in StepResult::scores: a scored prompt row, or a sampled row with top logprobs.
  bool reports_score() const { return scored() || (on_device && score_top_k > 0); }
};
inline constexpr int32_t kMaxScoreTopK = 20;

// A scored row's result (RowSampling::score_token): the token's log-softmax in
// the raw row, its rank (the tokens whose logit is >= its own, itself
// included), and the top tokens, best first, ties to the lower id.
struct RowScore {
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
};

// Computes deferred token masks (RowSampling::mask_source) when the runner asks.
class TokenMaskSource {
 public:
  // Writes row `row`'s allowed-token bits (RowSampling::allowed's layout) to
  // `mask`, whose ceil(vocab / 64) words hold garbage on entry.
  virtual void fill_mask(size_t row, std::span<uint64_t> mask) = 0;

 protected:
  ~TokenMaskSource() = default;
};

struct StepResult {
  // Per logits row (batch.num_logit_rows()): the token and its log-probability
  // under the raw distribution (log-softmax of the logits); set for on_device
  // rows, 0 for the others.
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  // vocab_size() floats per row that is neither on_device nor scored, in row order.
  std::vector<float> host_logits;
  // One per row that reports_score(), in row order (a sampled row's: of the token drawn).
  std::vector<RowScore> scores;
};

// Copies block src's K/V (data and scales, every layer) to block dst.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

enum class TransferDirection : uint8_t { kDeviceToHost = 0, kHostToDevice = 1 };
inline constexpr int kNumTransferDirections = 2;

// Copies one block between the device pool and the host pool: every layer, K
// and V, codes and scales, bytes as they are. host_block indexes the host pool.
struct BlockTransfer {
  TransferDirection direction = TransferDirection::kDeviceToHost;
  int32_t device_block = 0;
  int32_t host_block = 0;
};

// What transfer_blocks() has moved since the runner was made, per direction
// (indexed by TransferDirection). seconds: time the copies took (on a GPU,
// measured on the copy stream by events, so it excludes queueing).
struct TransferStats {
  int64_t blocks[kNumTransferDirections] = {0, 0};
  int64_t bytes[kNumTransferDirections] = {0, 0};
  double seconds[kNumTransferDirections] = {0.0, 0.0};
  int64_t failed_calls = 0;
};

// One sequence's compaction (token eviction, runtime/kv_compression.h): its
// cache indices [0, old_length) under old_block_table are rewritten into
// new_block_table as the compacted region [0, new_length): per (layer, KV
// head) the kept tokens in order, then holes. The tables cover exactly
// [0, old_length) and [0, new_length) and share no block.
struct KvCompaction {
  int64_t kv_state = 0;
  KvCompressionConfig config;
  std::vector<int32_t> old_block_table;
  int32_t old_length = 0;
  std::vector<int32_t> new_block_table;
  int32_t new_length = 0;
};
// The checks every runner's compact_kv makes before anything moves: a named
// sequence, new_length <= old_length, tables long enough for their lengths,
// ids in [0, num_blocks) (kOutOfRange) and no block in both tables.
Status check_kv_compaction(const KvCompaction& compaction, int32_t num_blocks, int32_t block_size);

struct RunnerCapabilities {
  bool samples_on_device = false;  // execute() honours RowSampling::on_device
  bool samples_masked_on_device = false;  // ... and RowSampling::allowed
  bool scores_on_device = false;          // execute() honours RowSampling::score_token and score_top_k
  bool edits_logits_on_device = false;    // execute() honours RowSampling::logit_edits and the penalties
  bool zeroes_blocks = false;      // zero_blocks() is implemented
  int32_t host_kv_blocks = 0;      // blocks in the host pool (0: no host tier); block shape as kv_geometry()
  bool host_block_access = false;  // read_host_block / write_host_block are implemented
  bool compacts_kv = false;        // compact_kv() and SequenceSlice's kv_state are honoured
  // ... with attention scores: every policy; without, streaming only (it needs no scores).
  bool kv_attention_scores = false;
  // ... and per-head budgets (pyramidkv, entropy): the attention skips the holes they leave.
  bool kv_head_budgets = false;
  // launch() returns before the device has finished the step, so the caller's
  // host work overlaps it (overlapped steps, ModelRunner::launch).
  bool overlaps_steps = false;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // Runs the forward. `rows` has one entry per logits row
  // (batch.num_logit_rows(), in the order ForwardBatch documents); empty means
  // every row returns logits. Errors: a batch that does not fit the pool
  // (runtime/batch_validation.h), an on_device row on a runner that cannot
  // sample (or a masked row on one that cannot mask), backend failures. Nothing is written to the pool on a validation error.
  virtual StatusOr<StepResult> execute(const ForwardBatch& batch, std::span<const RowSampling> rows) = 0;
  // Overlapped steps: launch() queues a step as execute() would run it and
  // returns without waiting for its result; collect() returns the oldest
  // launched step's result (or its error) and must be called once per
  // launch(), in order. At most two steps are launched and not collected.
  // Only a batch launched while the step before it is still uncollected may
  // carry deferred tokens (ForwardBatch::deferred_tokens, naming that step's
  // device-sampled rows), and only rows sampled on the device without a mask
  // source, logit edits or a score may be launched (the caller learns nothing
  // before collect(), and a launched step returns tokens and logprobs only).
  // Between a launch() and its collect(), the caller runs nothing else on the
  // device (execute, copy_blocks, zero_blocks, transfer_blocks, compact_kv),
  // and every block the launched steps name stays allocated to them.
  // The default runs the step at launch (deferred tokens taken from the
  // previous result) and keeps its result for collect(): right on every
  // runner, overlapping nothing; capabilities().overlaps_steps says a runner
  // does better.
  virtual Status launch(const ForwardBatch& batch, std::span<const RowSampling> rows);
  virtual StatusOr<StepResult> collect();
  // Copies blocks in every layer (copy-on-write forks); runs before the next execute().
  virtual Status copy_blocks(std::span<const BlockCopy> copies) = 0;
  // Zeroes device blocks in every layer, data and scales: blocks the KV
  // manager hands from one tenant to another (KvCacheManager::
  // take_blocks_to_zero). Runs before the next transfer_blocks(),
  // copy_blocks() or execute(), which may then write them.
  // Called only when capabilities().zeroes_blocks; the default refuses.
  virtual Status zero_blocks(std::span<const int32_t> blocks);
  // Moves blocks between the device pool and the host pool, in list order (a
  // block written by one transfer may be read or overwritten by a later one),
  // all before the next execute() or copy_blocks() touches the pool. May run
  // asynchronously (a GPU copy stream ordered before the next step's kernels).
  // An error means every transfer of the call must be treated as failed: their
  // destinations hold garbage. Ids are checked first (kOutOfRange, nothing
  // moved). Runners without a host pool: kUnimplemented for a non-empty list.
  virtual Status transfer_blocks(std::span<const BlockTransfer> transfers);
  virtual TransferStats transfer_stats() const { return {}; }
  // When every copy of the last transfer_blocks() call had completed (steady
  // clock), if the runner knows it yet: for request timelines (the engine's
  // debug view of where a host hit's time goes). Synchronous runners know it
  // on return; a GPU runner learns it from a callback on its copy streams.
  virtual std::optional<std::chrono::steady_clock::time_point> last_transfer_done_at() const { return std::nullopt; }
  // One host block's bytes (host_block_layout.h), for the tiers below the
  // host (disk, redis). read_host_block sees every transfer_blocks() call made
  // so far completed; write_host_block's bytes are in place before the next
  // transfer_blocks() reads them. `out` / `data` are exactly one block.
  // kOutOfRange / kInvalidArgument on a bad index or size. Called only when
  // capabilities().host_block_access; the defaults refuse.
  // Neither waits for the forward, only for the transfers. read_host_block
  // may be called from one thread other than the caller of the rest, while
  // any other call runs there, as long as none of them writes the block being
  // read (engine/lower_tier_spiller.h).
  virtual Status read_host_block(int32_t host_block, std::span<std::byte> out);
  virtual Status write_host_block(int32_t host_block, std::span<const std::byte> data);
  // The memory of host blocks, for readers that fill them in place from
  // other threads (engine/lower_tier_loader.h: disk reads straight into the
  // pinned pool). Returns once no transfer handed to the runner so far can
  // still read or write them; after that the caller owns the bytes until it
  // next names a block in a transfer_blocks() call, and any thread may write
  // them meanwhile (the runner never touches a host block no transfer names).
  // kOutOfRange on a bad index. Called only when
  // capabilities().host_block_access; the default refuses.
  virtual StatusOr<std::vector<std::span<std::byte>>> host_blocks_for_writing(std::span<const int32_t> host_blocks);
  // Token eviction: chooses each (layer, KV head)'s kept tokens from the
  // state under compaction.kv_state and rewrites them (KvCompaction). Runs
  // before the next execute(); the old blocks may be reused after it returns.
  // Errors: bad ids or lengths (kOutOfRange / kInvalidArgument); afterwards
  // the sequence's K/V must be treated as lost. Called only when
  // capabilities().compacts_kv; the default refuses.
  virtual Status compact_kv(const KvCompaction& compaction);
  // Forgets the state kept under kv_state (the sequence ended). No-op when unknown.
  virtual void release_kv_state(int64_t /*kv_state*/) {}

  // The KV memory this runner holds: the engine's KV manager must use the same
  // block_size and num_blocks.
  virtual const KvPoolShape& kv_geometry() const = 0;
  virtual RunnerCapabilities capabilities() const { return {}; }
  virtual int32_t vocab_size() const = 0;
  virtual int32_t max_context_length() const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;

 private:
  // The default launch()'s results, oldest first, and the tokens of the last launched step.
  std::deque<StatusOr<StepResult>> launched_;
  std::vector<int32_t> last_launched_tokens_;
};

inline Status ModelRunner::zero_blocks(std::span<const int32_t> blocks) {
  return unimplemented_error("this model runner cannot zero KV blocks ({} asked)", blocks.size());
}

inline Status ModelRunner::compact_kv(const KvCompaction& compaction) {
  return unimplemented_error("this model runner cannot compact KV (policy {})",
                             kv_compression_policy_name(compaction.config.policy));
}

inline Status ModelRunner::read_host_block(int32_t host_block, std::span<std::byte>) {
  return unimplemented_error("this model runner cannot read host KV block {}", host_block);
}

inline Status ModelRunner::write_host_block(int32_t host_block, std::span<const std::byte>) {
  return unimplemented_error("this model runner cannot write host KV block {}", host_block);
}

inline StatusOr<std::vector<std::span<std::byte>>> ModelRunner::host_blocks_for_writing(
    std::span<const int32_t> host_blocks) {
  return unimplemented_error("this model runner cannot hand out {} host KV blocks", host_blocks.size());
}

// Rows of `rows` that the runner samples, checked against what it can do;
// kUnimplemented if any row is on_device on a runner without device sampling,
// kInvalidArgument if `rows` is neither empty nor one entry per logits row.
[[nodiscard]] Status check_row_sampling(const ForwardBatch& batch, std::span<const RowSampling> rows,
                                        const RunnerCapabilities& capabilities);
// The checks launch() makes: deferred tokens ascending within the batch,
// naming rows of the previous launched step (`previous_rows` of them; 0: no
// step to take them from), only on rows sampled on the device without a mask
// source (kInvalidArgument otherwise).
[[nodiscard]] Status check_launch(const ForwardBatch& batch, std::span<const RowSampling> rows,
                                  int32_t previous_rows);

// kOutOfRange naming the first transfer whose ids fall outside the pools.
[[nodiscard]] Status check_block_transfers(std::span<const BlockTransfer> transfers, int32_t num_blocks,
                                           int32_t num_host_blocks);

}  // namespace pagoda::runtime
