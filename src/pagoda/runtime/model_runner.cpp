#include "pagoda/runtime/model_runner.h"

namespace pagoda::runtime {

Status check_row_sampling(const ForwardBatch& batch, std::span<const RowSampling> rows,
                          const RunnerCapabilities& capabilities) {
  if (rows.empty()) return ok_status();
  if (static_cast<int64_t>(rows.size()) != batch.num_logit_rows())
    return invalid_argument_error("{} sampling rows for a batch of {} logits rows", rows.size(),
                                  batch.num_logit_rows());
  if (!capabilities.samples_on_device)
    for (const RowSampling& row : rows)
      if (row.on_device) return unimplemented_error("this model runner does not sample on the device");
  return ok_status();
}

}  // namespace pagoda::runtime
