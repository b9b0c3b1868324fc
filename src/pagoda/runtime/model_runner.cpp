#include "pagoda/runtime/model_runner.h"

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
  }
  return ok_status();
}

Status ModelRunner::transfer_blocks(std::span<const BlockTransfer> transfers) {
  if (transfers.empty()) return ok_status();
  return unimplemented_error("this model runner has no host KV pool ({} block transfers asked)", transfers.size());
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
