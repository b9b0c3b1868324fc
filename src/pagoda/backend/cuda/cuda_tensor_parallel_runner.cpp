#include "pagoda/backend/cuda/cuda_tensor_parallel_runner.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/backend/cuda/same_device_communicator.h"
#ifdef PAGODA_HAVE_NCCL
#include "pagoda/parallel/nccl_communicator.h"
#endif

namespace pagoda::cuda {
namespace {

StatusOr<std::vector<std::unique_ptr<parallel::DeviceCommunicator>>> make_communicators(
    const std::vector<int32_t>& devices, bool same_device) {
  if (same_device) return make_same_device_communicators(static_cast<int32_t>(devices.size()), devices.front());
#ifdef PAGODA_HAVE_NCCL
  PAGODA_ASSIGN_OR_RETURN(auto nccl, parallel::make_nccl_communicators(devices));
  std::vector<std::unique_ptr<parallel::DeviceCommunicator>> comms;
  for (auto& c : nccl) comms.push_back(std::move(c));
  return comms;
#else
  return unimplemented_error("--tensor-parallel-size {} on cuda: this build has no NCCL (not found beside the CUDA "
                             "toolkit)", devices.size());
#endif
}

}  // namespace

bool tensor_parallel_cuda_graphs_requested() {
  const char* value = std::getenv("PAGODA_TP_CUDA_GRAPHS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

StatusOr<std::unique_ptr<CudaTensorParallelRunner>> CudaTensorParallelRunner::create(
    const ModelConfig& config, std::shared_ptr<const ModelWeights> whole, int32_t size,
    const CudaTensorParallelOptions& options) {
  return create_with(config, size, options,
                     [&](int32_t r, const TensorShard& shard) -> StatusOr<std::unique_ptr<CudaModel>> {
                       PAGODA_ASSIGN_OR_RETURN(const ModelWeights weights, shard_model_weights(config, whole, shard));
                       CudaModelOptions o = options.model;
                       o.show_progress = options.model.show_progress && r == 0;
                       return CudaModel::from_weights(shard_config(config, shard), weights, o);
                     });
}

StatusOr<std::unique_ptr<CudaTensorParallelRunner>> CudaTensorParallelRunner::create_random(
    const ModelConfig& config, uint64_t seed, int32_t size, const CudaTensorParallelOptions& options) {
  return create_with(config, size, options,
                     [&](int32_t r, const TensorShard& shard) -> StatusOr<std::unique_ptr<CudaModel>> {
                       return CudaModel::create_random(shard_config(config, shard), seed + static_cast<uint64_t>(r),
                                                       options.model);
                     });
}

StatusOr<std::unique_ptr<CudaTensorParallelRunner>> CudaTensorParallelRunner::create_with(
    const ModelConfig& config, int32_t size, const CudaTensorParallelOptions& options,
    const RankModelMaker& make_rank) {
  PAGODA_RETURN_IF_ERROR(check_tensor_parallel(config, size));
  std::unique_ptr<CudaTensorParallelRunner> runner(new CudaTensorParallelRunner());
  runner->config_ = config;
  if (options.same_device) {
    if (options.runner.num_blocks <= 0)
      return invalid_argument_error("tensor parallelism on one device: give every rank's num_blocks");
    runner->devices_.assign(static_cast<size_t>(size), 0);
  } else if (!options.devices.empty()) {
    if (options.devices.size() != static_cast<size_t>(size))
      return invalid_argument_error("--tensor-parallel-size {}: {} devices listed", size, options.devices.size());
    runner->devices_ = options.devices;
  } else {
    int count = 0;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
    if (size > count)
      return invalid_argument_error("--tensor-parallel-size {}: more ranks than the {} visible GPU(s) (one rank per "
                                    "GPU)", size, count);
    for (int32_t r = 0; r < size; ++r) runner->devices_.push_back(r);
  }
  PAGODA_ASSIGN_OR_RETURN(runner->comms_, make_communicators(runner->devices_, options.same_device));

  // Every rank's weights go up first, so that rank 0's pool is sized after all of them on a shared device.
  std::vector<std::unique_ptr<CudaModel>> models;
  for (int32_t r = 0; r < size; ++r) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner->devices_[static_cast<size_t>(r)]));
    const TensorShard shard = tensor_shard(config, r, size);
    PAGODA_ASSIGN_OR_RETURN(auto model, make_rank(r, shard));
    PAGODA_RETURN_IF_ERROR(model->attach_tensor_parallel(shard, runner->comms_[static_cast<size_t>(r)].get()));
    models.push_back(std::move(model));
  }
  CudaRunnerOptions runner_options = options.runner;
  for (int32_t r = 0; r < size; ++r) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner->devices_[static_cast<size_t>(r)]));
    runner_options.print_report = options.runner.print_report && r == 0;
    PAGODA_ASSIGN_OR_RETURN(auto rank_runner,
                            CudaModelRunner::create(std::move(models[static_cast<size_t>(r)]), runner_options));
    // Every rank's pool has rank 0's number of blocks.
    runner_options.num_blocks = rank_runner->num_blocks();
    runner->ranks_.push_back(std::move(rank_runner));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(runner->devices_.front()));
  runner->geometry_ = runner->ranks_.front()->kv_geometry();
  runner->geometry_.num_kv_heads = 0;
  for (const auto& rank : runner->ranks_) runner->geometry_.num_kv_heads += rank->kv_geometry().num_kv_heads;
  runner->num_host_blocks_ = options.runner.num_host_blocks;
  // Eager steps unless the experimental graphs are asked for (see the header).
  runner->set_use_cuda_graphs(options.model.use_cuda_graphs);
  runner->threads_ = std::make_unique<parallel::RankThreads>(size);
  return runner;
}

CudaTensorParallelRunner::~CudaTensorParallelRunner() {
  threads_.reset();
  // Each rank's streams and buffers are released with its device current.
  for (size_t r = ranks_.size(); r-- > 0;) {
    cudaSetDevice(devices_[r]);
    ranks_[r].reset();
  }
  if (!devices_.empty()) cudaSetDevice(devices_.front());
}

Status CudaTensorParallelRunner::run_on_ranks(const std::function<Status(int32_t)>& job) {
  return threads_->run([&](int32_t r) -> Status {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[static_cast<size_t>(r)]));
    return job(r);
  });
}

Status CudaTensorParallelRunner::for_each_rank(const std::function<Status(int32_t)>& job) {
  Status status = ok_status();
  for (int32_t r = 0; r < size() && status.ok(); ++r) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[static_cast<size_t>(r)]));
    status = job(r);
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_.front()));
  return status;
}

StatusOr<runtime::StepResult> CudaTensorParallelRunner::execute(const ForwardBatch& batch,
                                                                std::span<const runtime::RowSampling> rows) {
  PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
  runtime::StepResult result;
  PAGODA_RETURN_IF_ERROR(run_on_ranks([&](int32_t r) -> Status {
    if (r == 0) {
      PAGODA_ASSIGN_OR_RETURN(result, ranks_.front()->execute(batch, rows));
      return ok_status();
    }
    // The same forward and collectives; the sampling (and any token mask source) is rank 0's alone.
    return ranks_[static_cast<size_t>(r)]->execute_greedy(batch).status();
  }));
  return result;
}

StatusOr<std::vector<int32_t>> CudaTensorParallelRunner::execute_greedy(const ForwardBatch& batch) {
  std::vector<int32_t> tokens;
  PAGODA_RETURN_IF_ERROR(run_on_ranks([&](int32_t r) -> Status {
    PAGODA_ASSIGN_OR_RETURN(auto got, ranks_[static_cast<size_t>(r)]->execute_greedy(batch));
    if (r == 0) tokens = std::move(got);
    return ok_status();
  }));
  return tokens;
}

void CudaTensorParallelRunner::set_use_cuda_graphs(bool on) {
  const bool graphs = on && tensor_parallel_cuda_graphs_requested();
  for (auto& rank : ranks_) rank->model().set_use_cuda_graphs(graphs);
}

Status CudaTensorParallelRunner::copy_blocks(std::span<const runtime::BlockCopy> copies) {
  return for_each_rank([&](int32_t r) { return ranks_[static_cast<size_t>(r)]->copy_blocks(copies); });
}

Status CudaTensorParallelRunner::zero_blocks(std::span<const int32_t> blocks) {
  return for_each_rank([&](int32_t r) { return ranks_[static_cast<size_t>(r)]->zero_blocks(blocks); });
}

Status CudaTensorParallelRunner::transfer_blocks(std::span<const runtime::BlockTransfer> transfers) {
  return for_each_rank([&](int32_t r) { return ranks_[static_cast<size_t>(r)]->transfer_blocks(transfers); });
}

Status CudaTensorParallelRunner::compact_kv(const runtime::KvCompaction& compaction) {
  if (!capabilities().compacts_kv) return runtime::ModelRunner::compact_kv(compaction);
  if (compaction.config.policy != runtime::KvCompressionPolicy::kStreaming)
    return unimplemented_error("--kv-compression {} with --tensor-parallel-size {}: only streaming eviction runs "
                               "over the ranks (a scored policy needs every rank's scores of a KV head joined)",
                               runtime::kv_compression_policy_name(compaction.config.policy), size());
  return for_each_rank([&](int32_t r) { return ranks_[static_cast<size_t>(r)]->compact_kv(compaction); });
}

void CudaTensorParallelRunner::release_kv_state(int64_t kv_state) {
  (void)for_each_rank([&](int32_t r) {
    ranks_[static_cast<size_t>(r)]->release_kv_state(kv_state);
    return ok_status();
  });
}

size_t CudaTensorParallelRunner::host_block_bytes() const {
  size_t total = 0;
  for (const auto& rank : ranks_)
    if (const CudaHostKvPool* host = std::as_const(*rank).host_pool(); host != nullptr)
      total += host->block_bytes();
  return total;
}

Status CudaTensorParallelRunner::read_host_block(int32_t host_block, std::span<std::byte> out) {
  if (num_host_blocks_ == 0) return runtime::ModelRunner::read_host_block(host_block, out);
  if (out.size() != host_block_bytes())
    return invalid_argument_error("read_host_block: {} bytes given, a block of the {} ranks is {}", out.size(), size(),
                                  host_block_bytes());
  size_t at = 0;
  for (auto& rank : ranks_) {
    const size_t bytes = rank->host_pool()->block_bytes();
    PAGODA_RETURN_IF_ERROR(rank->read_host_block(host_block, out.subspan(at, bytes)));
    at += bytes;
  }
  return ok_status();
}

Status CudaTensorParallelRunner::write_host_block(int32_t host_block, std::span<const std::byte> data) {
  if (num_host_blocks_ == 0) return runtime::ModelRunner::write_host_block(host_block, data);
  if (data.size() != host_block_bytes())
    return invalid_argument_error("write_host_block: {} bytes given, a block of the {} ranks is {}", data.size(),
                                  size(), host_block_bytes());
  if (host_block < 0 || host_block >= num_host_blocks_)
    return out_of_range_error("write_host_block: block {} outside the host pool of {}", host_block, num_host_blocks_);
  size_t at = 0;
  for (auto& rank : ranks_) {
    const size_t bytes = rank->host_pool()->block_bytes();
    PAGODA_RETURN_IF_ERROR(rank->write_host_block(host_block, data.subspan(at, bytes)));
    at += bytes;
  }
  return ok_status();
}

runtime::TransferStats CudaTensorParallelRunner::transfer_stats() const {
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

}  // namespace pagoda::cuda
