#pragma once
// Tensor parallelism on the GPU (docs/TENSOR_PARALLEL.md): one ModelRunner over
// N ranks, each a CudaModelRunner holding one shard of the model
// (model/tensor_shard.h: column-parallel q/k/v and gate/up, row-parallel o and
// down, vocab-parallel embedding and lm_head, KV heads split or replicated),
// sliced on the host and uploaded rank by rank, with its own paged KV pool of
// the shard's KV heads on its own device and stream. As on the CPU
// (cpu_tensor_parallel_runner.h) the engine sees one runner: one KV manager
// and one scheduler drive all ranks, every rank's pool has the same number of
// blocks, so one block table names the same tokens on every rank. execute()
// runs the step on every rank at once, rank r on its own host thread
// (parallel/rank_threads.h; rank 0 on the caller's) with its device current;
// the ranks join through DeviceCommunicators enqueued on their streams.
// Rank 0's result is returned (every rank holds the gathered logits; the
// others only take the cheap argmax and drop it). Block copies, zeroing and
// host-tier transfers are applied to every rank.
//
// Communicators: NCCL with one GPU per rank (the real path; needs NCCL found
// beside the CUDA toolkit), or the same-device communicator
// (same_device_communicator.h) that puts all N ranks on one GPU, for tests
// only. Steps run eagerly by default. CUDA graphs across the ranks (one per
// rank and bucket, as at TP=1 in cuda_model.h: the ranks capture at the same
// step and each replays its own graph on its own stream) are EXPERIMENTAL and
// opt-in through the environment, PAGODA_TP_CUDA_GRAPHS=1: on the same-device
// communicator their first GPU run hung, and capture over NCCL is untested
// (docs/TENSOR_PARALLEL.md).
//
// A host block, as read_host_block / write_host_block see it, is the ranks'
// host blocks one after another in rank order. Token eviction: streaming
// only (compact_kv compacts every rank's pool, each its own KV heads, with
// the same kept tokens); the scored policies are refused (kv_attention_scores
// is false: with replicated KV heads the ranks' scores would need summing).
// Not supported: DeepSeek (MLA / MoE) and fp8 checkpoints (refused by
// check_tensor_parallel).
//
// Thread safety: one caller thread, as every ModelRunner; read_host_block
// also as ModelRunner allows (runtime/model_runner.h).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/parallel/device_communicator.h"
#include "pagoda/parallel/rank_threads.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda::cuda {

// True when the environment asks for the experimental CUDA graphs at TP>1
// (PAGODA_TP_CUDA_GRAPHS=1); read at each call. Thread safety: any thread.
bool tensor_parallel_cuda_graphs_requested();

struct CudaTensorParallelOptions {
  CudaModelOptions model;     // every rank's
  CudaRunnerOptions runner;   // every rank's; num_blocks 0: rank 0's pool is sized from free memory,
                              // and every other rank gets as many blocks
  // Tests only: every rank on CUDA device 0 through the same-device
  // communicator; num_blocks must then be given. Otherwise rank r runs on
  // devices[r] (empty: 0..N-1) over NCCL.
  bool same_device = false;
  std::vector<int32_t> devices;
};

class CudaTensorParallelRunner final : public runtime::ModelRunner {
 public:
  // Shards `whole` (the weights of `config`, bound with f32_cache_bytes = 0)
  // over `size` ranks. Errors: check_tensor_parallel's (naming
  // --tensor-parallel-size), more ranks than GPUs (naming the flag and the
  // count), NCCL missing, same_device without num_blocks, a device list of
  // the wrong length, CUDA and sizing failures.
  static StatusOr<std::unique_ptr<CudaTensorParallelRunner>> create(const ModelConfig& config,
                                                                    std::shared_ptr<const ModelWeights> whole,
                                                                    int32_t size,
                                                                    const CudaTensorParallelOptions& options);
  // Random bf16 weights (`--load-format random`, for benchmarks of real
  // shapes): each rank makes its own shard's matrices on its GPU from
  // seed + rank, so a TP=N model is not TP=1's random model (its tokens
  // differ); every rank holds the whole vocabulary's embedding and lm_head
  // rows and uses its own range of them. Errors as create().
  static StatusOr<std::unique_ptr<CudaTensorParallelRunner>> create_random(const ModelConfig& config, uint64_t seed,
                                                                           int32_t size,
                                                                           const CudaTensorParallelOptions& options);
  ~CudaTensorParallelRunner() override;

  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch,
                                        std::span<const runtime::RowSampling> rows) override;
  // Greedy tokens only (rank 0's argmax), as CudaModelRunner::execute_greedy.
  StatusOr<std::vector<int32_t>> execute_greedy(const ForwardBatch& batch);
  Status copy_blocks(std::span<const runtime::BlockCopy> copies) override;
  Status zero_blocks(std::span<const int32_t> blocks) override;
  Status transfer_blocks(std::span<const runtime::BlockTransfer> transfers) override;
  runtime::TransferStats transfer_stats() const override;
  runtime::RunnerCapabilities capabilities() const override {
    return {.samples_on_device = true,
            .samples_masked_on_device = true,
            .zeroes_blocks = true,
            .host_kv_blocks = num_host_blocks_,
            .host_block_access = num_host_blocks_ > 0,
            .compacts_kv = ranks_.front()->capabilities().compacts_kv,
            .kv_attention_scores = false};
  }
  // Streaming eviction on every rank's pool (the kept tokens ignore scores, so
  // every rank keeps the same ones); other policies: kUnimplemented naming the
  // policy and the ranks.
  Status compact_kv(const runtime::KvCompaction& compaction) override;
  void release_kv_state(int64_t kv_state) override;
  Status read_host_block(int32_t host_block, std::span<std::byte> out) override;
  Status write_host_block(int32_t host_block, std::span<const std::byte> data) override;
  // Rank 0's pool shape with num_kv_heads summed over the ranks: the group's KV memory.
  const KvPoolShape& kv_geometry() const override { return geometry_; }
  int32_t vocab_size() const override { return config_.vocab_size; }
  int32_t max_context_length() const override { return ranks_.front()->max_context_length(); }
  std::vector<int32_t> eos_token_ids() const override { return config_.eos_token_ids; }

  // Every rank's CUDA graphs on or off (tests and benchmarks compare both);
  // `on` only counts when tensor_parallel_cuda_graphs_requested(), otherwise
  // every rank runs eagerly. create() and create_random() apply
  // options.model.use_cuda_graphs through this.
  void set_use_cuda_graphs(bool on);
  int32_t size() const { return static_cast<int32_t>(ranks_.size()); }
  CudaModelRunner& rank(int32_t r) { return *ranks_[static_cast<size_t>(r)]; }
  int32_t device(int32_t r) const { return devices_[static_cast<size_t>(r)]; }

 private:
  CudaTensorParallelRunner() = default;
  // create() and create_random(): make_rank(r, shard) builds rank r's model on the current device.
  using RankModelMaker = std::function<StatusOr<std::unique_ptr<CudaModel>>(int32_t, const TensorShard&)>;
  static StatusOr<std::unique_ptr<CudaTensorParallelRunner>> create_with(const ModelConfig& config, int32_t size,
                                                                         const CudaTensorParallelOptions& options,
                                                                         const RankModelMaker& make_rank);
  // job(r) on every rank at once, each with its device current; the first error by rank order.
  Status run_on_ranks(const std::function<Status(int32_t)>& job);
  // job(r) for each rank in turn on the calling thread, with rank r's device current.
  Status for_each_rank(const std::function<Status(int32_t)>& job);
  size_t host_block_bytes() const;

  ModelConfig config_;
  KvPoolShape geometry_;
  int32_t num_host_blocks_ = 0;
  std::vector<int32_t> devices_;
  // Declared before the ranks: the models use them until they are gone.
  std::vector<std::unique_ptr<parallel::DeviceCommunicator>> comms_;
  std::vector<std::unique_ptr<CudaModelRunner>> ranks_;
  std::unique_ptr<parallel::RankThreads> threads_;
};

}  // namespace pagoda::cuda
