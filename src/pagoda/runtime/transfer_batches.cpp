#include "pagoda/runtime/transfer_batches.h"

#include <algorithm>
#include <unordered_map>

namespace pagoda::runtime {

std::vector<TransferBatch> plan_transfer_batches(std::span<const BlockTransfer> transfers) {
  std::vector<TransferBatch> batches;
  // Block key (device id, or -1 - host id) -> the first batch a later transfer of it may join.
  std::unordered_map<int64_t, size_t> next_batch;
  next_batch.reserve(transfers.size() * 2);
  for (const BlockTransfer& t : transfers) {
    const int64_t device_key = t.device_block;
    const int64_t host_key = -1 - static_cast<int64_t>(t.host_block);
    const auto device_it = next_batch.find(device_key), host_it = next_batch.find(host_key);
    const size_t b = std::max(device_it == next_batch.end() ? 0 : device_it->second,
                              host_it == next_batch.end() ? 0 : host_it->second);
    if (b == batches.size()) batches.emplace_back();
    const int d = static_cast<int>(t.direction);
    batches[b].device_blocks[d].push_back(t.device_block);
    batches[b].host_blocks[d].push_back(t.host_block);
    next_batch[device_key] = b + 1;
    next_batch[host_key] = b + 1;
  }
  return batches;
}

}  // namespace pagoda::runtime
