#pragma once
// One kernel that copies whole KV blocks between the device pool and the
// host tier's pinned memory, which the GPU reads and writes directly (pinned
// host memory is mapped at the same address on a unified-addressing system).
// A CTA per (block, layer, slice) moves its slice of each of that layer's
// segments (K codes, V codes, K scales, V scales) with 16-byte accesses where
// alignment allows: no DMA descriptor per piece, so a block of 2 to 4 x
// num_layers pieces costs one launch among up to kKvHostCopyMaxPairs blocks.
// Segments are cut into slices of about 8 KB so that even one block keeps
// enough loads in flight. The "host" side may equally be device memory laid
// out as host chunks (a staging buffer).
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::cuda {

struct KvHostCopyGeometry {
  char* device = nullptr;            // the device pool's first byte (layer 0)
  char* host = nullptr;              // the host pool's first byte
  uint64_t layer_bytes = 0;          // device: bytes of one layer (every sub-pool, padded)
  uint64_t host_block_bytes = 0;     // one host block (every layer)
  uint64_t segment_offset[4] = {0, 0, 0, 0};  // device: where each sub-pool starts in a layer
  uint64_t segment_bytes[4] = {0, 0, 0, 0};   // one block of one layer per sub-pool; 0: none
  int32_t num_layers = 0;
};

// Blocks per launch: keeps the kernel's parameters under 4 KB.
constexpr int32_t kKvHostCopyMaxPairs = 448;
struct KvHostCopyPairs {
  int32_t count = 0;
  int32_t device_block[kKvHostCopyMaxPairs];
  int32_t host_block[kKvHostCopyMaxPairs];
};

// Copies pairs.count blocks (device_block[i] <-> host_block[i]) on `stream`;
// to_host: device -> host. Blocks must be distinct within a launch.
// max_ctas > 0 caps the grid (each CTA then loops over several blocks and
// layers): a copy that runs beside a forward holds only that many CTAs' worth
// of SMs while it waits on PCIe, instead of one per block, layer and slice.
cudaError_t kv_host_copy(const KvHostCopyGeometry& geometry, const KvHostCopyPairs& pairs, bool to_host,
                         cudaStream_t stream, int32_t max_ctas = 0);
// The same for layers [layer_begin, layer_begin + layer_count) only (a load
// issued layer by layer, each layer's launch followed by its own event).
cudaError_t kv_host_copy_layers(const KvHostCopyGeometry& geometry, const KvHostCopyPairs& pairs, bool to_host,
                                int32_t layer_begin, int32_t layer_count, cudaStream_t stream, int32_t max_ctas = 0);

}  // namespace pagoda::cuda
