#pragma once
// The order a host-tier transfer list (ModelRunner::transfer_blocks) may run
// in: batches whose transfers touch distinct blocks, so a batch can run all at
// once (every copy of it in flight together), one batch after another.
//
// A transfer joins the batch after the last one that touched its device block
// or its host block, so every block's transfers keep their list order (a
// block written by one transfer and read or overwritten by a later one is in
// an earlier batch) while unrelated transfers move up. Within a batch, list
// order. A full device pool's list, "write X back to the host, load another
// block into X" for many X, is two batches, however long.
//
// Thread safety: a pure function.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/runtime/model_runner.h"

namespace pagoda::runtime {

struct TransferBatch {
  // Per direction (indexed by TransferDirection): the blocks of each transfer, pairwise.
  std::vector<int32_t> device_blocks[kNumTransferDirections];
  std::vector<int32_t> host_blocks[kNumTransferDirections];

  int64_t size() const {
    return static_cast<int64_t>(device_blocks[0].size() + device_blocks[1].size());
  }
};

std::vector<TransferBatch> plan_transfer_batches(std::span<const BlockTransfer> transfers);

}  // namespace pagoda::runtime
