#pragma once
// Tensor parallelism on the CPU (docs/TENSOR_PARALLEL.md): one ModelRunner
// over N ranks, each a CpuModelRunner holding one shard of the model
// (model/tensor_shard.h) and its own paged KV pool of the shard's KV heads.
// The engine sees one runner: one KV manager and one scheduler drive all
// ranks, and every rank's pool has the same blocks, so one block table names
// the same tokens on every rank. execute() runs the batch on all ranks at
// once, rank r on its own thread (rank 0 on the caller's) with its own
// ThreadPool, the ranks joining through the CPU threads' communicators
// (parallel/thread_communicator.h); the logits every rank then holds are
// rank 0's to return. Block copies, zeroing and host-tier transfers are
// applied to every rank's pools.
//
// The CPU ranks exist to test the sharding where CI runs (TP=N reproduces
// TP=1) and to be the reference for the GPU ranks; they share one machine's
// cores and memory bandwidth, so they are not faster than TP=1.
//
// A host block, as read_host_block / write_host_block see it (the disk and
// redis tiers), is the ranks' host blocks one after another in rank order:
// host_block_layout(kv_geometry()).block_bytes() in all. Not supported: token
// eviction (compacts_kv is false).
//
// Thread safety: one caller thread, as every ModelRunner; read_host_block
// also as ModelRunner allows (runtime/model_runner.h).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/core/thread_pool.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"
#include "pagoda/parallel/communicator.h"
#include "pagoda/parallel/rank_threads.h"
#include "pagoda/runtime/model_runner.h"

namespace pagoda {

class CpuTensorParallelRunner final : public runtime::ModelRunner {
 public:
  struct Options {
    int32_t num_blocks = 0;  // of every rank's pool
    int32_t block_size = 16;
    DType key_dtype = DType::kF32;
    DType value_dtype = DType::kF32;
    int32_t num_host_blocks = 0;   // of every rank's host pool (0: none)
    size_t threads_per_rank = 0;   // 0: the process pool's threads / ranks, at least 1
    // --quantization (kInt8, kInt4 or kFP8E4M3): each rank quantizes its own shard
    // (backend/cpu/quantize_weights.h). int8/int4 blocks of 32 columns are the
    // TP=1 blocks wherever a row-parallel slice starts at a multiple of 32;
    // fp8's per-row scales of o_proj / down_proj are taken over the rank's
    // columns only.
    std::optional<DType> quantization;
  };

  // Shards `whole` (the weights of `config`) over `size` ranks. Errors:
  // check_tensor_parallel's (naming --tensor-parallel-size), weights that
  // cannot be sharded, pool sizes as CpuModelRunner::create.
  static StatusOr<std::unique_ptr<CpuTensorParallelRunner>> create(const ModelConfig& config,
                                                                   std::shared_ptr<const ModelWeights> whole,
                                                                   int32_t size, const Options& options);
  // Blocks of every rank's pool that fit in `bytes` of KV memory per rank.
  static int64_t blocks_for_memory_per_rank(const ModelConfig& config, int32_t size, int64_t bytes,
                                            int32_t block_size, DType key_dtype, DType value_dtype);
  ~CpuTensorParallelRunner() override;

  StatusOr<runtime::StepResult> execute(const ForwardBatch& batch,
                                        std::span<const runtime::RowSampling> rows) override;
  Status copy_blocks(std::span<const runtime::BlockCopy> copies) override;
  Status zero_blocks(std::span<const int32_t> blocks) override;
  Status transfer_blocks(std::span<const runtime::BlockTransfer> transfers) override;
  runtime::TransferStats transfer_stats() const override;
  runtime::RunnerCapabilities capabilities() const override {
    return {.zeroes_blocks = true, .host_kv_blocks = num_host_blocks_, .host_block_access = num_host_blocks_ > 0};
  }
  Status read_host_block(int32_t host_block, std::span<std::byte> out) override;
  Status write_host_block(int32_t host_block, std::span<const std::byte> data) override;
  // Rank 0's pool shape with num_kv_heads summed over the ranks (replicated
  // heads counted on every rank that holds them): the group's KV memory.
  const KvPoolShape& kv_geometry() const override { return geometry_; }
  int32_t vocab_size() const override { return config_.vocab_size; }
  int32_t max_context_length() const override { return config_.max_position_embeddings; }
  std::vector<int32_t> eos_token_ids() const override { return config_.eos_token_ids; }

  int32_t size() const { return static_cast<int32_t>(ranks_.size()); }
  const CpuModelRunner& rank(int32_t r) const { return *ranks_[static_cast<size_t>(r)]; }
  size_t threads_per_rank() const { return pools_.front()->size(); }

 private:
  CpuTensorParallelRunner() = default;
  // Runs job(r) for every rank concurrently, rank r on its thread and pool;
  // the first error by rank order.
  Status run_on_ranks(const std::function<Status(int32_t)>& job);

  ModelConfig config_;
  KvPoolShape geometry_;
  int32_t num_host_blocks_ = 0;
  // Declared before the ranks: the models use them until they are gone.
  std::vector<std::unique_ptr<parallel::Communicator>> comms_;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
  std::vector<std::unique_ptr<CpuModelRunner>> ranks_;
  std::unique_ptr<parallel::RankThreads> threads_;
};

}  // namespace pagoda
