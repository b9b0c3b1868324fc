#pragma once
// Token eviction's compaction on the GPU pool (docs/KV_CACHE.md "Token
// eviction"): a gather that copies (slot, KV head) vectors of one layer, codes
// and scale records as they are (so any KV dtype), from a sequence's old slots
// to its fresh ones. One warp per move; the runner launches it once per layer.
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

// Flat slots are block * block_size + offset in the block.
struct KvVectorMove {
  int64_t src_slot = 0;
  int64_t dst_slot = 0;
  int32_t head = 0;  // -1: skipped (a hole of a per-head compaction stays unwritten)
  int32_t unused = 0;
};

// Copies `count` moves (a device array; slots and heads already checked) of
// `layer`'s K and V vectors and their scale records, on `stream`. Sources and
// destinations must be disjoint (the destinations are fresh blocks).
cudaError_t kv_move_vectors(const DevicePagedKvLayer& layer, const KvVectorMove* moves, int64_t count,
                            cudaStream_t stream);

}  // namespace pagoda::cuda
