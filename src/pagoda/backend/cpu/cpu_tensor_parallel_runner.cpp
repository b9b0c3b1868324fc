#include "pagoda/backend/cpu/cpu_tensor_parallel_runner.h"

#include <algorithm>

#include "pagoda/backend/cpu/quantize_weights.h"
#include "pagoda/model/kv_geometry.h"
#include "pagoda/model/tensor_shard.h"
#include "pagoda/parallel/thread_communicator.h"

namespace pagoda {

StatusOr<std::unique_ptr<CpuTensorParallelRunner>> CpuTensorParallelRunner::create(
    const ModelConfig& config, std::shared_ptr<const ModelWeights> whole, int32_t size, const Options& options) {
  PAGODA_RETURN_IF_ERROR(check_tensor_parallel(config, size));
  std::unique_ptr<CpuTensorParallelRunner> runner(new CpuTensorParallelRunner());
  runner->config_ = config;
  PAGODA_ASSIGN_OR_RETURN(runner->comms_, parallel::make_thread_communicators(size));
  const size_t threads = options.threads_per_rank > 0
                             ? options.threads_per_rank
                             : std::max<size_t>(1, ThreadPool::process().size() / static_cast<size_t>(size));
  for (int32_t r = 0; r < size; ++r) {
    const TensorShard shard = tensor_shard(config, r, size);
    PAGODA_ASSIGN_OR_RETURN(ModelWeights weights, shard_model_weights(config, whole, shard));
    const ModelConfig local = shard_config(config, shard);
    if (options.quantization) {
      PAGODA_RETURN_IF_ERROR(quantize_model_weights(local, weights, *options.quantization));
      weights.owned_slices.clear();  // every row-parallel slice now lives in its quantized copy
    }
    auto model = std::make_shared<CpuModel>(local, std::move(weights));
    model->attach_tensor_parallel(shard, runner->comms_[static_cast<size_t>(r)].get());
    PAGODA_ASSIGN_OR_RETURN(auto rank_runner,
                            CpuModelRunner::create(std::move(model), options.num_blocks, options.block_size,
                                                   options.key_dtype, options.value_dtype, options.num_host_blocks));
    runner->ranks_.push_back(std::move(rank_runner));
    runner->pools_.push_back(std::make_unique<ThreadPool>(threads));
  }
  runner->geometry_ = runner->ranks_.front()->kv_geometry();
  runner->geometry_.num_kv_heads = 0;
  for (const auto& rank : runner->ranks_) runner->geometry_.num_kv_heads += rank->kv_geometry().num_kv_heads;
  runner->num_host_blocks_ = options.num_host_blocks;
  runner->threads_ = std::make_unique<parallel::RankThreads>(size);
  return runner;
}

int64_t CpuTensorParallelRunner::blocks_for_memory_per_rank(const ModelConfig& config, int32_t size, int64_t bytes,
                                                            int32_t block_size, DType key_dtype, DType value_dtype) {
  // Rank 0 holds as many KV heads as any rank.
  const ModelConfig rank0 = shard_config(config, tensor_shard(config, 0, size));
  const size_t per_token = model_kv_pool_shape(rank0, 1, block_size, key_dtype, value_dtype).bytes_per_token();
  if (per_token == 0 || block_size <= 0) return 0;
  return bytes / static_cast<int64_t>(per_token * static_cast<size_t>(block_size));
}

CpuTensorParallelRunner::~CpuTensorParallelRunner() { threads_.reset(); }

Status CpuTensorParallelRunner::run_on_ranks(const std::function<Status(int32_t)>& job) {
  return threads_->run([&](int32_t r) {
    ThreadPool::ScopedCurrent pool(pools_[static_cast<size_t>(r)].get());
    return job(r);
  });
}

StatusOr<runtime::StepResult> CpuTensorParallelRunner::execute(const ForwardBatch& batch,
                                                               std::span<const runtime::RowSampling> rows) {
  PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
  runtime::StepResult result;
  PAGODA_RETURN_IF_ERROR(run_on_ranks([&](int32_t r) -> Status {
    auto step = ranks_[static_cast<size_t>(r)]->execute(batch, rows);
    if (!step.ok()) return step.status();
    if (r == 0) result = std::move(*step);  // every rank holds the gathered logits
    return ok_status();
  }));
  return result;
}

Status CpuTensorParallelRunner::copy_blocks(std::span<const runtime::BlockCopy> copies) {
  for (auto& rank : ranks_) PAGODA_RETURN_IF_ERROR(rank->copy_blocks(copies));
  return ok_status();
}

Status CpuTensorParallelRunner::zero_blocks(std::span<const int32_t> blocks) {
  for (auto& rank : ranks_) PAGODA_RETURN_IF_ERROR(rank->zero_blocks(blocks));
  return ok_status();
}

Status CpuTensorParallelRunner::transfer_blocks(std::span<const runtime::BlockTransfer> transfers) {
  for (auto& rank : ranks_) PAGODA_RETURN_IF_ERROR(rank->transfer_blocks(transfers));
  return ok_status();
}

Status CpuTensorParallelRunner::read_host_block(int32_t host_block, std::span<std::byte> out) {
  size_t total = 0;
  for (const auto& rank : ranks_) total += rank->host_block_bytes();
  if (out.size() != total)
    return invalid_argument_error("read_host_block: {} bytes given, a block of the {} ranks is {}", out.size(), size(),
                                  total);
  size_t at = 0;
  for (auto& rank : ranks_) {
    PAGODA_RETURN_IF_ERROR(rank->read_host_block(host_block, out.subspan(at, rank->host_block_bytes())));
    at += rank->host_block_bytes();
  }
  return ok_status();
}

Status CpuTensorParallelRunner::write_host_block(int32_t host_block, std::span<const std::byte> data) {
  size_t total = 0;
  for (const auto& rank : ranks_) total += rank->host_block_bytes();
  if (data.size() != total)
    return invalid_argument_error("write_host_block: {} bytes given, a block of the {} ranks is {}", data.size(),
                                  size(), total);
  if (host_block < 0 || host_block >= num_host_blocks_)
    return out_of_range_error("write_host_block: block {} outside the host pool of {}", host_block, num_host_blocks_);
  size_t at = 0;
  for (auto& rank : ranks_) {
    PAGODA_RETURN_IF_ERROR(rank->write_host_block(host_block, data.subspan(at, rank->host_block_bytes())));
    at += rank->host_block_bytes();
  }
  return ok_status();
}

runtime::TransferStats CpuTensorParallelRunner::transfer_stats() const {
  runtime::TransferStats total;
  for (const auto& rank : ranks_) {
    const runtime::TransferStats s = rank->transfer_stats();
    for (int d = 0; d < runtime::kNumTransferDirections; ++d) {
      total.blocks[d] += s.blocks[d];
      total.bytes[d] += s.bytes[d];
      total.seconds[d] += s.seconds[d];
    }
    total.failed_calls += s.failed_calls;
  }
  return total;
}

}  // namespace pagoda
