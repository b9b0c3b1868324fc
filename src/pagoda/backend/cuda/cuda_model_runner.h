#pragma once
// The engine's seam on the GPU: a CudaModel plus the CudaKvPool it reads and
// writes, behind runtime::ModelRunner. The pool is sized from free GPU memory
// after the model (weights + scratch) is on the device, like vLLM's
// --gpu-memory-utilization; the sizing line (kv_pool_report) is printed to
// stderr at start. The engine's KV manager must be built with the block size
// and count of kv_geometry().
//
// Host tier (CudaRunnerOptions::num_host_blocks > 0): a pinned host pool of
// blocks of the same shape (cuda_host_kv_pool.h); transfer_blocks() queues the
// copies on its copy streams, ordered after the previous step and before the
// next one on the model's stream. Layer by layer (the default): when a list
// allows it, the copies go one layer at a time and the next execute()'s
// forward waits for layer l's copies only before its layer l touches the KV
// (cuda_model.h), so a host hit's load overlaps the step's compute;
// copy_blocks() first waits for all of them.
//
// Zero on free (zero_blocks): blocks passing to another tenant are cleared on a
// side stream ordered between the model stream's work before and after
// (block_zeroer.h).
//
// Thread safety: the engine thread only (ModelRunner's contract).

#include <cstdint>
#include <deque>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/backend/cuda/block_zeroer.h"
#include "pagoda/backend/cuda/cuda_host_kv_pool.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_kv_scores.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::cuda {

struct CudaRunnerOptions {
  double gpu_memory_utilization = 0.9;  // fraction of total GPU memory pagoda may hold
  int32_t num_blocks = 0;               // > 0: exactly this many KV blocks (tests)
  bool print_report = true;             // the KV pool line on stderr
  int32_t num_host_blocks = 0;          // > 0: a pinned host pool of this many blocks (the host tier)
  bool layer_by_layer = true;           // host tier loads overlap the forward layer by layer
  // The host tier's copy kernel holds at most this many CTAs per launch (0: one per block, layer and
  // slice), so that a load beside a forward leaves the forward the other SMs (docs/BENCHMARKS.md).
  int32_t copy_kernel_ctas = 32;
  // Token eviction's per-head budgets (pyramidkv, entropy): the compaction, the
  // scoring pass and the CUDA-core decode skip holes, and a step with holes
  // runs eagerly on the fast attention's decode (docs/KV_CACHE.md). On by
  // default; false makes the runner (compact_kv) and the engine refuse those
  // two policies by name. Never on for MLA, a sliding window or a KV shared
  // across layers (capabilities()).
  bool kv_head_budgets = true;
  // Prompt scoring on the device (runtime::RowSampling::score_token, sampling.h score_rows): a scored
  // prompt row returns its score instead of its logits. PAGODA_DEVICE_SCORING=0 turns it off (the engine
  // then scores the rows' logits on the host, as before; an A/B and a fallback).
  bool scores_on_device = true;
  // Logit rules and penalties on the device (runtime::RowSampling::logit_edits, sampling.h apply_logit_edits):
  // such a row is drawn there instead of copying its logits out. PAGODA_DEVICE_LOGIT_EDITS=0 turns it off
  // (host sampling, as before).
  bool edits_logits_on_device = true;
};

class CudaModelRunner final : public runtime::ModelRunner {
 public:
  static StatusOr<std::unique_ptr<CudaModelRunner>> create(std::unique_ptr<CudaModel> model,
                                                           const CudaRunnerOptions& options = {});

  // Rows flagged on_device are sampled on the GPU (sampling.h); only the other
  // rows' logits cross PCIe. No rows: every row's logits come back.
  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch,
                                        std::span<const runtime::RowSampling> rows) override;
  // Overlapped steps: a graph decode step (CudaModel::launchable) is queued
  // and launch() returns at once, its deferred tokens read on the device;
  // collect() waits for its tokens. Any other step runs synchronously at
  // launch, after the steps before it are done (their tokens read, which also
  // gives its deferred tokens), and collect() hands back its result.
  Status launch(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) override;
  StatusOr<runtime::StepResult> collect() override;
  Status copy_blocks(std::span<const runtime::BlockCopy> copies) override;
  Status transfer_blocks(std::span<const runtime::BlockTransfer> transfers) override;
  Status zero_blocks(std::span<const int32_t> blocks) override;
  runtime::TransferStats transfer_stats() const override { return host_ ? host_->stats() : runtime::TransferStats{}; }
  std::optional<std::chrono::steady_clock::time_point> last_transfer_done_at() const override {
    return host_ ? host_->last_done_at() : std::nullopt;
  }
  const KvPoolShape& kv_geometry() const override { return pool_->shape(); }
  // --kv-cross-layer-share K > 1 (kv_share_ops.h): no token eviction, no host tier.
  bool shared() const { return pool_->shape().cross_layer_share != 1; }
  runtime::RunnerCapabilities capabilities() const override {
    return {.samples_on_device = true,
            .samples_masked_on_device = true,
            .scores_on_device = scores_on_device_,
            .edits_logits_on_device = edits_logits_on_device_,
            .zeroes_blocks = true,
            .host_kv_blocks = host_ ? host_->num_blocks() : 0,
            .host_block_access = host_ != nullptr,
            .compacts_kv = !model_->config().mla && model_->config().sliding_window <= 0 && !shared(),
            .kv_attention_scores = !shared(),
            .kv_head_budgets =
                kv_head_budgets_ && !model_->config().mla && model_->config().sliding_window <= 0 && !shared(),
            .overlaps_steps = true};
  }
  // Token eviction (docs/KV_CACHE.md "Token eviction"): streaming, h2o and
  // snapkv, whose (layer, KV head)s all keep the same count, so the
  // compacted region has no holes. Streaming keeps the same tokens everywhere;
  // h2o and snapkv choose per (layer, KV head) from the scores the forward
  // adds (cuda_kv_scores.h). Every policy's kept indices and moves are built
  // on the device (kv_select.h) and a gather kernel (kv_compact.h) moves the
  // kept vectors, any KV dtype, into the fresh blocks: it returns once queued,
  // without waiting for the device. The forward needs nothing
  // more: new tokens take their true positions from the batch and their cache
  // index from the table. pyramidkv / entropy (per-head budgets, holes) unless
  // CudaRunnerOptions::kv_head_budgets is off (then kUnimplemented). Errors: bad
  // tables (check_kv_compaction).
  Status compact_kv(const runtime::KvCompaction& compaction) override;
  // Both wait for the host pool's copy streams (every queued transfer), not
  // for the model's stream: a forward in flight never touches the host pool,
  // so the disk / redis tiers' reads overlap it (engine/lower_tier_spiller.h).
  // read_host_block may run on another thread as ModelRunner says.
  Status read_host_block(int32_t host_block, std::span<std::byte> out) override;
  Status write_host_block(int32_t host_block, std::span<const std::byte> data) override;
  // Waits for the copy streams too; the pinned memory itself is handed out.
  StatusOr<std::vector<std::span<std::byte>>> host_blocks_for_writing(std::span<const int32_t> blocks) override;
  void release_kv_state(int64_t kv_state) override { scores_->release(kv_state); }
  CudaKvScores& kv_scores() { return *scores_; }
  int32_t vocab_size() const override { return model_->config().vocab_size; }
  int32_t max_context_length() const override { return model_->max_model_len(); }
  std::vector<int32_t> eos_token_ids() const override { return model_->config().eos_token_ids; }

  // Greedy decoding without logits leaving the GPU: one token per logits row.
  StatusOr<std::vector<int32_t>> execute_greedy(const ForwardBatch& batch);

  int32_t num_blocks() const { return pool_->shape().num_blocks; }
  int32_t block_size() const { return pool_->shape().block_size; }
  const std::string& kv_pool_report() const { return report_; }
  CudaModel& model() { return *model_; }
  CudaKvPool& pool() { return *pool_; }
  CudaHostKvPool* host_pool() { return host_.get(); }  // null without a host tier
  const CudaHostKvPool* host_pool() const { return host_.get(); }
  void set_layer_by_layer(bool on) { layer_by_layer_ = on; }
  bool layer_by_layer() const { return layer_by_layer_; }

 private:
  CudaModelRunner(std::unique_ptr<CudaModel> model, std::unique_ptr<CudaKvPool> pool, std::string report)
      : model_(std::move(model)), pool_(std::move(pool)), report_(std::move(report)) {}

  std::unique_ptr<CudaModel> model_;
  std::unique_ptr<CudaKvPool> pool_;
  // Launched steps, oldest first: queued on the device (async, in pinned slot `slot`) or already run.
  struct Launched {
    bool async = false;
    int slot = 0;
    int32_t rows = 0;
    std::optional<StatusOr<runtime::StepResult>> result;  // when not async
  };
  std::deque<Launched> launched_;
  int next_slot_ = 0;
  // Waits for a queued step and keeps its result.
  void settle(Launched& step);
  // The host pool's pending layer events go to the model's next forward.
  void hand_layer_waits_to_model();

  std::unique_ptr<CudaHostKvPool> host_;
  bool layer_by_layer_ = true;
  bool kv_head_budgets_ = false;  // CudaRunnerOptions::kv_head_budgets
  bool scores_on_device_ = false;  // CudaRunnerOptions::scores_on_device (and PAGODA_DEVICE_SCORING)
  bool edits_logits_on_device_ = false;  // CudaRunnerOptions::edits_logits_on_device (and PAGODA_DEVICE_LOGIT_EDITS)
  std::unique_ptr<BlockZeroer> zeroer_;
  DeviceBuffer compact_moves_;  // kv_compact.h's moves of the last compaction
  std::unique_ptr<CudaKvScores> scores_;  // token eviction's per-sequence scores; the model reads it
  std::string report_;
};

}  // namespace pagoda::cuda
