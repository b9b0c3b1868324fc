#include "pagoda/runtime/model_runner.h"

#include <unordered_set>

namespace pagoda::runtime {

Status check_row_sampling(const ForwardBatch& batch, std::span<const RowSampling> rows,
                          const RunnerCapabilities& capabilities) {
  if (rows.empty()) return ok_status();
  if (static_cast<int64_t>(rows.size()) != batch.num_logit_rows())
    return invalid_argument_error("{} sampling rows for a batch of {} logits rows", rows.size(),
                                  batch.num_logit_rows());
  for (const RowSampling& row : rows) {
    if (row.on_device && !capabilities.samples_on_device)
      return unimplemented_error("this model runner does not sample on the device");
    if (row.allowed != nullptr && row.mask_source != nullptr)
      return invalid_argument_error("a row with both a token mask and a mask source");
    if (row.masked() && !row.on_device)
      return invalid_argument_error("a token mask on a row that is not sampled on the device");
    if (row.masked() && !capabilities.samples_masked_on_device)
      return unimplemented_error("this model runner does not apply token masks on the device");
    if (row.edited() && !row.on_device)
      return invalid_argument_error("logit edits on a row that is not sampled on the device");
    if (row.edited() && !capabilities.edits_logits_on_device)
      return unimplemented_error("this model runner does not edit logits on the device");
    if (row.score_top_k < 0 || row.score_top_k > kMaxScoreTopK)
      return invalid_argument_error("score_top_k {} outside [0, {}]", row.score_top_k, kMaxScoreTopK);
    if (row.reports_score() && !capabilities.scores_on_device)
      return unimplemented_error("this model runner does not score rows");
    if (!row.scored()) continue;
    if (row.on_device || row.masked())
      return invalid_argument_error("a scored row (token {}) that is also sampled on the device", row.score_token);
  }
  return ok_status();
}

Status check_launch(const ForwardBatch& batch, std::span<const RowSampling> rows, int32_t previous_rows) {
  for (const RowSampling& row : rows)
    if (!row.on_device || row.mask_source != nullptr || row.edited() || row.reports_score())
      return invalid_argument_error(
          "launch: every row must be sampled on the device, without a mask source, logit edits or scores");
  int32_t last = -1;
  for (const DeferredToken& d : batch.deferred_tokens) {
    if (d.token_index <= last || d.token_index >= batch.num_tokens())
      return invalid_argument_error("launch: deferred token index {} is not ascending within [0, {})", d.token_index,
                                    batch.num_tokens());
    if (d.source_row < 0 || d.source_row >= previous_rows)
      return invalid_argument_error("launch: deferred token {} names row {} of a previous step with {} rows",
                                    d.token_index, d.source_row, previous_rows);
    last = d.token_index;
  }
  return ok_status();
}

Status ModelRunner::launch(const ForwardBatch& batch, std::span<const RowSampling> rows) {
  if (launched_.size() >= 2) return failed_precondition_error("launch: two steps are already launched");
  const int32_t previous_rows = launched_.empty() ? 0 : static_cast<int32_t>(last_launched_tokens_.size());
  PAGODA_RETURN_IF_ERROR(check_launch(batch, rows, previous_rows));
  StatusOr<StepResult> result = [&]() -> StatusOr<StepResult> {
    if (batch.deferred_tokens.empty()) return execute(batch, rows);
    ForwardBatch resolved = batch;
    for (const DeferredToken& d : batch.deferred_tokens)
      resolved.token_ids[static_cast<size_t>(d.token_index)] = last_launched_tokens_[static_cast<size_t>(d.source_row)];
    resolved.deferred_tokens.clear();
    return execute(resolved, rows);
  }();
  last_launched_tokens_ = result.ok() ? result->tokens : std::vector<int32_t>{};
  launched_.push_back(std::move(result));
  return ok_status();
}

StatusOr<StepResult> ModelRunner::collect() {
  if (launched_.empty()) return failed_precondition_error("collect: no launched step");
  StatusOr<StepResult> result = std::move(launched_.front());
  launched_.pop_front();
  return result;
}

Status ModelRunner::transfer_blocks(std::span<const BlockTransfer> transfers) {
  if (transfers.empty()) return ok_status();
  return unimplemented_error("this model runner has no host KV pool ({} block transfers asked)", transfers.size());
}

Status check_kv_compaction(const KvCompaction& c, int32_t num_blocks, int32_t bs) {
  if (c.kv_state == 0) return invalid_argument_error("compact_kv: kv_state 0 names no sequence");
  if (c.old_length < 0 || c.new_length < 0 || c.new_length > c.old_length)
    return invalid_argument_error("compact_kv: sequence {}: cannot compact {} tokens into {}", c.kv_state,
                                  c.old_length, c.new_length);
  if (static_cast<int64_t>(c.old_block_table.size()) * bs < c.old_length ||
      static_cast<int64_t>(c.new_block_table.size()) * bs < c.new_length)
    return invalid_argument_error("compact_kv: sequence {}: tables of {} and {} blocks for {} and {} tokens",
                                  c.kv_state, c.old_block_table.size(), c.new_block_table.size(), c.old_length,
                                  c.new_length);
  for (const auto* table : {&c.old_block_table, &c.new_block_table})
    for (int32_t b : *table)
      if (b < 0 || b >= num_blocks)
        return out_of_range_error("compact_kv: sequence {}: block {} outside the pool of {}", c.kv_state, b,
                                  num_blocks);
  const std::unordered_set<int32_t> old_ids(c.old_block_table.begin(), c.old_block_table.end());
  for (int32_t b : c.new_block_table)
    if (old_ids.contains(b))
      return invalid_argument_error("compact_kv: sequence {}: block {} is in both tables", c.kv_state, b);
  return ok_status();
}

Status check_block_transfers(std::span<const BlockTransfer> transfers, int32_t num_blocks, int32_t num_host_blocks) {
  for (const BlockTransfer& t : transfers) {
    if (t.device_block < 0 || t.device_block >= num_blocks || t.host_block < 0 || t.host_block >= num_host_blocks)
      return out_of_range_error("block transfer {} {} -> {} outside the pools ({} device blocks, {} host blocks)",
                                t.direction == TransferDirection::kDeviceToHost ? "device_to_host" : "host_to_device",
                                t.direction == TransferDirection::kDeviceToHost ? t.device_block : t.host_block,
                                t.direction == TransferDirection::kDeviceToHost ? t.host_block : t.device_block,
                                num_blocks, num_host_blocks);
  }
  return ok_status();
}

}  // namespace pagoda::runtime
