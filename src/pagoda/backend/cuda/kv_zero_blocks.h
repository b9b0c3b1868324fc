#pragma once
// One kernel that zeroes whole KV blocks of the device pool in every layer:
// K codes, V codes, K scales and V scales (zero on free between tenants,
// docs/SECURITY.md). A CTA per (block, layer) clears that layer's segments
// with 16-byte stores where alignment allows, so a list of blocks costs one
// launch per kKvZeroMaxBlocks blocks, whatever the layer count.
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/backend/cuda/kv_host_copy.h"

namespace pagoda::cuda {

// Blocks per launch: keeps the kernel's parameters under 4 KB.
constexpr int32_t kKvZeroMaxBlocks = 768;
struct KvZeroBlocks {
  int32_t count = 0;
  int32_t block[kKvZeroMaxBlocks];
};

// Zeroes blocks.count device blocks (ids already checked) on `stream`. Only
// the device-side fields of `geometry` are read (device, layer_bytes,
// segment_offset, segment_bytes, num_layers).
cudaError_t kv_zero_blocks(const KvHostCopyGeometry& geometry, const KvZeroBlocks& blocks, cudaStream_t stream);

}  // namespace pagoda::cuda
