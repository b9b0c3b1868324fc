#include "pagoda/backend/cuda/cuda_model_runner.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/cuda_check.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda::cuda {

StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::create(std::unique_ptr<CudaModel> model,
                                                                   const CudaRunnerOptions& options) {
  KvPoolShape shape = model->kv_pool_shape(options.num_blocks);
  if (shape.cross_layer_share != 1) {
    const int32_t k = shape.cross_layer_share;
    PAGODA_RETURN_IF_ERROR(runtime::validate_cross_layer_share(k, shape.num_layers, "--kv-cross-layer-share"));
    if (shape.latent) return invalid_argument_error("--kv-cross-layer-share {}: not for an MLA model", k);
    for (DType dtype : {shape.key_dtype, shape.value_dtype}) {
      if (dtype != DType::kBF16 && dtype != DType::kFP8E4M3)
        return unimplemented_error("--kv-cross-layer-share {}: on --device cuda with a bf16 or fp8 KV cache only, "
                                   "not {}", k, dtype_name(dtype));
    }
    if (options.num_host_blocks > 0)
      return invalid_argument_error("--kv-cross-layer-share {} cannot be combined with --kv-offload-memory: a shared "
                                    "block's norm records have no host form yet", k);
  }
  std::string report;
  if (options.num_blocks <= 0) {
    PAGODA_ASSIGN_OR_RETURN(KvPoolSizing sizing,
                            size_kv_pool_from_free_memory(shape, options.gpu_memory_utilization));
    shape.num_blocks = sizing.num_blocks;
    report = sizing.report;
  } else {
    report = fmt::format("KV pool: {} blocks x {} tokens (fixed)", shape.num_blocks, shape.block_size);
  }
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvPool> pool, CudaKvPool::create(shape));
  std::unique_ptr<CudaHostKvPool> host;
  if (options.num_host_blocks > 0) {
    PAGODA_ASSIGN_OR_RETURN(host, CudaHostKvPool::create(shape, options.num_host_blocks));
    host->set_copy_kernel_ctas(options.copy_kernel_ctas);
  }
  if (options.print_report) std::fprintf(stderr, "%s\n", report.c_str());
  auto runner =
      std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(model), std::move(pool), std::move(report)));
  runner->host_ = std::move(host);
  runner->layer_by_layer_ = options.layer_by_layer;
  runner->kv_head_budgets_ = options.kv_head_budgets;
  const char* scoring = std::getenv("PAGODA_DEVICE_SCORING");
  runner->scores_on_device_ = options.scores_on_device && !(scoring != nullptr && std::strcmp(scoring, "0") == 0);
  const char* edits = std::getenv("PAGODA_DEVICE_LOGIT_EDITS");
  runner->edits_logits_on_device_ =
      options.edits_logits_on_device && !(edits != nullptr && std::strcmp(edits, "0") == 0);
  PAGODA_ASSIGN_OR_RETURN(runner->zeroer_, BlockZeroer::create());
  const ModelConfig& mc = runner->model_->config();
  runner->scores_ = std::make_unique<CudaKvScores>(mc.num_layers, mc.num_kv_heads, mc.num_q_heads);
  runner->model_->set_kv_scores(runner->scores_.get());
  return runner;
}

namespace {
GpuSamplingParams gpu_sampling_params(const runtime::RowSampling& row) {
  return GpuSamplingParams{row.temperature, row.top_k, row.top_p, row.min_p, row.seed, row.step};
}
}  // namespace

void CudaModelRunner::hand_layer_waits_to_model() {
  if (host_ && host_->layer_waits_pending()) model_->set_kv_layer_waits(host_->take_layer_waits());
}

StatusOr<runtime::StepResult> CudaModelRunner::execute(const ForwardBatch& batch,
                                                       std::span<const runtime::RowSampling> rows) {
  PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
  hand_layer_waits_to_model();
  runtime::StepResult out;
  if (rows.empty()) {
    const Status status = model_->forward(batch, *pool_, out.host_logits);
    model_->flush_kv_layer_waits();
    PAGODA_RETURN_IF_ERROR(status);
    out.tokens.assign(static_cast<size_t>(batch.num_logit_rows()), 0);
    out.logprobs.assign(static_cast<size_t>(batch.num_logit_rows()), 0.0f);
    return out;
  }
  std::vector<GpuSamplingParams> params(rows.size());
  std::vector<int32_t> host_rows;
  bool per_row = false;  // masks, scores or logit edits: the model reads `rows`
  for (size_t r = 0; r < rows.size(); ++r) {
    const runtime::RowSampling& row = rows[r];
    per_row = per_row || row.masked() || row.reports_score() || row.edited();
    if (row.scored()) continue;  // its score comes back, not its logits (its GPU draw is ignored)
    if (!row.on_device) {
      host_rows.push_back(static_cast<int32_t>(r));  // its GPU draw (greedy: cheapest) is ignored
      continue;
    }
    params[r] = gpu_sampling_params(row);
  }
  const Status status =
      model_->forward_sampled(batch, *pool_, params, host_rows, out.tokens, out.logprobs, out.host_logits,
                              per_row ? rows : std::span<const runtime::RowSampling>{}, &out.scores);
  model_->flush_kv_layer_waits();
  PAGODA_RETURN_IF_ERROR(status);
  return out;
}

void CudaModelRunner::settle(Launched& step) {
  if (!step.async) return;
  runtime::StepResult out;
  const Status status = model_->collect_launched(step.slot, step.rows, out.tokens, out.logprobs);
  step.result = status.ok() ? StatusOr<runtime::StepResult>(std::move(out)) : StatusOr<runtime::StepResult>(status);
  step.async = false;
}

Status CudaModelRunner::launch(const ForwardBatch& batch, std::span<const runtime::RowSampling> rows) {
  if (launched_.size() >= 2) return failed_precondition_error("launch: two steps are already launched");
  PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
  PAGODA_RETURN_IF_ERROR(runtime::check_launch(batch, rows, launched_.empty() ? 0 : launched_.back().rows));
  std::vector<GpuSamplingParams> params(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) params[r] = gpu_sampling_params(rows[r]);
  const int32_t num_rows = static_cast<int32_t>(rows.size());
  // Deferred tokens of a step that ran synchronously are known on the host: they go in as plain ids.
  const bool from_device = !launched_.empty() && launched_.back().async;
  const bool queue = model_->launchable(batch) && !(host_ && host_->layer_waits_pending());
  if (!queue)
    for (Launched& step : launched_) settle(step);  // a synchronous step waits for the queued ones
  ForwardBatch resolved;
  const ForwardBatch* run = &batch;
  if (!batch.deferred_tokens.empty() && !(queue && from_device)) {
    const std::optional<StatusOr<runtime::StepResult>>& previous = launched_.back().result;
    if (!previous->ok()) {
      launched_.push_back(Launched{false, 0, num_rows, previous->status()});
      return ok_status();
    }
    resolved = batch;
    for (const DeferredToken& d : batch.deferred_tokens)
      resolved.token_ids[static_cast<size_t>(d.token_index)] = (*previous)->tokens[static_cast<size_t>(d.source_row)];
    resolved.deferred_tokens.clear();
    run = &resolved;
  }
  if (queue) {
    const int slot = next_slot_;
    next_slot_ ^= 1;
    const Status status = model_->forward_launched(*run, *pool_, params, slot);
    if (status.ok()) {
      launched_.push_back(Launched{true, slot, num_rows, std::nullopt});
    } else {
      launched_.push_back(Launched{false, 0, num_rows, status});
    }
    return ok_status();
  }
  launched_.push_back(Launched{false, 0, num_rows, execute(*run, rows)});
  return ok_status();
}

StatusOr<runtime::StepResult> CudaModelRunner::collect() {
  if (launched_.empty()) return failed_precondition_error("collect: no launched step");
  Launched step = std::move(launched_.front());
  launched_.pop_front();
  settle(step);
  return std::move(*step.result);
}

StatusOr<std::vector<int32_t>> CudaModelRunner::execute_greedy(const ForwardBatch& batch) {
  std::vector<int32_t> tokens;
  hand_layer_waits_to_model();
  const Status status = model_->forward_greedy(batch, *pool_, tokens);
  model_->flush_kv_layer_waits();
  PAGODA_RETURN_IF_ERROR(status);
  return tokens;
}

Status CudaModelRunner::read_host_block(int32_t host_block, std::span<std::byte> out) {
  if (!host_) return runtime::ModelRunner::read_host_block(host_block, out);
  if (host_block < 0 || host_block >= host_->num_blocks())
    return out_of_range_error("read_host_block: block {} outside the host pool of {}", host_block, host_->num_blocks());
  if (out.size() != host_->block_bytes())
    return invalid_argument_error("read_host_block: {} bytes given, a block is {}", out.size(), host_->block_bytes());
  // The copy streams only: the forward that runs meanwhile never writes the host pool.
  PAGODA_RETURN_IF_ERROR(host_->wait_for_copies_on_host());
  std::memcpy(out.data(), host_->block(host_block), out.size());
  return ok_status();
}

Status CudaModelRunner::write_host_block(int32_t host_block, std::span<const std::byte> data) {
  if (!host_) return runtime::ModelRunner::write_host_block(host_block, data);
  if (host_block < 0 || host_block >= host_->num_blocks())
    return out_of_range_error("write_host_block: block {} outside the host pool of {}", host_block, host_->num_blocks());
  if (data.size() != host_->block_bytes())
    return invalid_argument_error("write_host_block: {} bytes given, a block is {}", data.size(), host_->block_bytes());
  // A copy still in flight may read (a load) or write (a write-back) this host block: those streams finish first.
  PAGODA_RETURN_IF_ERROR(host_->wait_for_copies_on_host());
  std::memcpy(host_->block(host_block), data.data(), data.size());
  return ok_status();
}

StatusOr<std::vector<std::span<std::byte>>> CudaModelRunner::host_blocks_for_writing(
    std::span<const int32_t> blocks) {
  if (!host_) return runtime::ModelRunner::host_blocks_for_writing(blocks);
  std::vector<std::span<std::byte>> out;
  out.reserve(blocks.size());
  for (int32_t b : blocks) {
    if (b < 0 || b >= host_->num_blocks())
      return out_of_range_error("host_blocks_for_writing: block {} outside the host pool of {}", b, host_->num_blocks());
    out.emplace_back(static_cast<std::byte*>(host_->block(b)), host_->block_bytes());
  }
  // A copy handed over earlier may still read (a load) or write (a write-back) one of these blocks.
  PAGODA_RETURN_IF_ERROR(host_->wait_for_copies_on_host());
  return out;
}

Status CudaModelRunner::transfer_blocks(std::span<const runtime::BlockTransfer> transfers) {
  if (transfers.empty()) return ok_status();
  if (!host_) return runtime::ModelRunner::transfer_blocks(transfers);
  PAGODA_RETURN_IF_ERROR(runtime::check_block_transfers(transfers, pool_->shape().num_blocks, host_->num_blocks()));
  if (!layer_by_layer_) {
    // The pool waits for whatever of a failed call was queued before it returns.
    return host_->transfer(transfers, *pool_, model_->stream());
  }
  // The copies' layer events reach the model at the next execute(); anything else waits for all of them.
  return host_->transfer_layered(transfers, *pool_, model_->stream()).status();
}

Status CudaModelRunner::zero_blocks(std::span<const int32_t> blocks) {
  // A layer-by-layer write-back queued by this step's transfers may still be reading a block
  // that is now being zeroed: the model stream waits for every copy first.
  if (host_) PAGODA_RETURN_IF_ERROR(host_->wait_all(model_->stream()));
  return zeroer_->zero(*pool_, blocks, model_->stream());
}

Status CudaModelRunner::copy_blocks(std::span<const runtime::BlockCopy> copies) {
  if (host_) PAGODA_RETURN_IF_ERROR(host_->wait_all(model_->stream()));
  PAGODA_RETURN_IF_ERROR(pool_->copy_blocks(copies, model_->stream()));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream()));
  return ok_status();
}

Status CudaModelRunner::compact_kv(const runtime::KvCompaction& c) {
  if (!capabilities().compacts_kv) return runtime::ModelRunner::compact_kv(c);
  // Per-head budgets leave holes that only the CUDA-core decode and the scoring pass skip: refused
  // when CudaRunnerOptions::kv_head_budgets is off.
  if (!kv_head_budgets_ && (c.config.policy == runtime::KvCompressionPolicy::kPyramidKV ||
                            c.config.policy == runtime::KvCompressionPolicy::kEntropy))
    return unimplemented_error("compact_kv: policy {} gives each head its own budget, and this runner was built with "
                               "CudaRunnerOptions::kv_head_budgets off (h2o, snapkv and streaming run here)",
                               runtime::kv_compression_policy_name(c.config.policy));
  // A layer-by-layer copy of this step's transfers may still read or write these blocks.
  if (host_) PAGODA_RETURN_IF_ERROR(host_->wait_all(model_->stream()));
  // Every policy's kept tokens are chosen and gathered on the device; this returns once queued.
  return scores_->compact(c, *pool_, compact_moves_, model_->stream());
}

}  // namespace pagoda::cuda
