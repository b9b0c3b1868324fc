#include "pagoda/backend/cpu/cpu_model_runner.h"

#include <cstring>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "pagoda/runtime/cross_layer_share.h"
#include "pagoda/runtime/host_block_layout.h"

namespace pagoda {

CpuModelRunner::CpuModelRunner(std::shared_ptr<CpuModel> model, CpuKvPool pool)
    : model_(std::move(model)),
      pool_(std::move(pool)),
      eviction_(pool_.shape().num_layers, pool_.shape().num_kv_heads) {}

void CpuModelRunner::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::create(std::shared_ptr<CpuModel> model,
                                                                  int32_t num_blocks, int32_t block_size,
                                                                  DType key_dtype, DType value_dtype,
                                                                  int32_t num_host_blocks, int32_t cross_layer_share) {
  if (!model) return invalid_argument_error("CpuModelRunner needs a model");
  if (num_host_blocks < 0) return invalid_argument_error("host KV pool: {} blocks", num_host_blocks);
  KvPoolShape shape = model->kv_pool_shape(num_blocks, block_size, key_dtype, value_dtype);
  if (cross_layer_share != 1) {
    PAGODA_RETURN_IF_ERROR(runtime::validate_cross_layer_share(cross_layer_share, model->config().num_layers,
                                                               "--kv-cross-layer-share"));
    if (model->config().mla)
      return invalid_argument_error("--kv-cross-layer-share {}: not for an MLA model (it caches one latent per layer)",
                                    cross_layer_share);
    if (num_host_blocks > 0 && cross_layer_share > 1)
      return invalid_argument_error("--kv-cross-layer-share {} cannot be combined with a host KV tier "
                                    "(--kv-offload-memory): a shared block's norm records have no host form yet",
                                    cross_layer_share);
    shape.cross_layer_share = cross_layer_share;
  }
  PAGODA_ASSIGN_OR_RETURN(CpuKvPool pool, CpuKvPool::create(shape));
  std::unique_ptr<CpuModelRunner> runner(new CpuModelRunner(std::move(model), std::move(pool)));
  if (num_host_blocks > 0) {
    const size_t block_bytes = runtime::host_block_layout(shape).block_bytes();
    // calloc: the pages are the kernel's zero pages until a block is first written.
    runner->host_pool_.reset(static_cast<std::byte*>(std::calloc(static_cast<size_t>(num_host_blocks), block_bytes)));
    if (!runner->host_pool_)
      return resource_exhausted_error("cannot allocate a host KV pool of {} blocks x {} bytes ({} MiB)",
                                      num_host_blocks, block_bytes,
                                      (static_cast<size_t>(num_host_blocks) * block_bytes) >> 20);
    runner->num_host_blocks_ = num_host_blocks;
    runner->host_block_bytes_ = block_bytes;
  }
  return runner;
}

int64_t CpuModelRunner::blocks_for_memory(const CpuModel& model, int64_t bytes, int32_t block_size,
                                          DType key_dtype, DType value_dtype, int32_t cross_layer_share) {
  KvPoolShape shape = model.kv_pool_shape(1, block_size, key_dtype, value_dtype);
  shape.cross_layer_share = cross_layer_share;
  const size_t per_token = shape.bytes_per_token();
  if (per_token == 0 || block_size <= 0) return 0;
  return bytes / static_cast<int64_t>(per_token * block_size);
}

StatusOr<runtime::StepResult> CpuModelRunner::execute(const ForwardBatch& batch,
                                                      std::span<const runtime::RowSampling> rows) {
  PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
  runtime::StepResult out;
  std::vector<CpuSequenceEviction*> eviction;
  for (const SequenceSlice& s : batch.sequences) {
    if (s.kv_state == 0) continue;
    if (!capabilities().compacts_kv) return unimplemented_error("this model cannot run token eviction");
    eviction = eviction_.prepare(batch);
    break;
  }
  PAGODA_RETURN_IF_ERROR(model_->forward(batch, pool_, out.host_logits, eviction));
  const size_t num_rows = static_cast<size_t>(batch.num_logit_rows());
  out.tokens.assign(num_rows, 0);
  out.logprobs.assign(num_rows, 0.0f);
  return out;
}

Status CpuModelRunner::compact_kv(const runtime::KvCompaction& compaction) {
  if (!capabilities().compacts_kv) return runtime::ModelRunner::compact_kv(compaction);
  return eviction_.compact(compaction, pool_);
}

Status CpuModelRunner::copy_blocks(std::span<const runtime::BlockCopy> copies) {
  const KvPoolShape& shape = pool_.shape();
  for (const runtime::BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= shape.num_blocks || c.dst < 0 || c.dst >= shape.num_blocks)
      return out_of_range_error("block copy {} -> {} outside the pool of {} blocks", c.src, c.dst, shape.num_blocks);
    pool_.copy_block(c.src, c.dst);  // data and scale records, every layer
  }
  return ok_status();
}

Status CpuModelRunner::zero_blocks(std::span<const int32_t> blocks) {
  const KvPoolShape& shape = pool_.shape();
  for (int32_t b : blocks)
    if (b < 0 || b >= shape.num_blocks) return out_of_range_error("block {} outside the pool of {} blocks", b, shape.num_blocks);
  for (int32_t b : blocks) pool_.zero_block(b);  // every layer, K and V, data and scale records
  return ok_status();
}

Status CpuModelRunner::read_host_block(int32_t host_block, std::span<std::byte> out) {
  if (host_block < 0 || host_block >= num_host_blocks_)
    return out_of_range_error("read_host_block: block {} outside the host pool of {}", host_block, num_host_blocks_);
  if (out.size() != host_block_bytes_)
    return invalid_argument_error("read_host_block: {} bytes given, a block is {}", out.size(), host_block_bytes_);
  std::memcpy(out.data(), host_pool_.get() + static_cast<size_t>(host_block) * host_block_bytes_, host_block_bytes_);
  return ok_status();
}

Status CpuModelRunner::write_host_block(int32_t host_block, std::span<const std::byte> data) {
  if (host_block < 0 || host_block >= num_host_blocks_)
    return out_of_range_error("write_host_block: block {} outside the host pool of {}", host_block, num_host_blocks_);
  if (data.size() != host_block_bytes_)
    return invalid_argument_error("write_host_block: {} bytes given, a block is {}", data.size(), host_block_bytes_);
  std::memcpy(host_pool_.get() + static_cast<size_t>(host_block) * host_block_bytes_, data.data(), host_block_bytes_);
  return ok_status();
}

StatusOr<std::vector<std::span<std::byte>>> CpuModelRunner::host_blocks_for_writing(
    std::span<const int32_t> blocks) {
  std::vector<std::span<std::byte>> out;
  out.reserve(blocks.size());
  for (int32_t b : blocks) {
    if (b < 0 || b >= num_host_blocks_)
      return out_of_range_error("host_blocks_for_writing: block {} outside the host pool of {}", b, num_host_blocks_);
    // Transfers run synchronously here: none is in flight.
    out.emplace_back(host_pool_.get() + static_cast<size_t>(b) * host_block_bytes_, host_block_bytes_);
  }
  return out;
}

Status CpuModelRunner::transfer_blocks(std::span<const runtime::BlockTransfer> transfers) {
  if (transfers.empty()) return ok_status();
  if (num_host_blocks_ == 0) return runtime::ModelRunner::transfer_blocks(transfers);
  PAGODA_RETURN_IF_ERROR(runtime::check_block_transfers(transfers, pool_.shape().num_blocks, num_host_blocks_));
  for (const runtime::BlockTransfer& t : transfers) {
    const auto start = std::chrono::steady_clock::now();
    std::byte* chunk = host_pool_.get() + static_cast<size_t>(t.host_block) * host_block_bytes_;
    if (t.direction == runtime::TransferDirection::kDeviceToHost) pool_.export_block(t.device_block, chunk);
    else pool_.import_block(t.device_block, chunk);
    const int d = static_cast<int>(t.direction);
    transfer_stats_.seconds[d] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++transfer_stats_.blocks[d];
    transfer_stats_.bytes[d] += static_cast<int64_t>(host_block_bytes_);
  }
  last_transfer_done_ = std::chrono::steady_clock::now();
  return ok_status();
}

}  // namespace pagoda
