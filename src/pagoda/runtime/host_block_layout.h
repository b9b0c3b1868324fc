#pragma once
// The layout of one KV block in a runner's host pool (the host tier): one
// contiguous chunk per block holding every layer's K and V codes and scales,
//   [layer 0: K codes | V codes | K scales | V scales][layer 1: ...]...
// each segment in the device pool's own per-block byte order, so a block moves
// between the tiers by copying segments as they are (no repacking) and a host
// block is a unit that can be freed, evicted or, later, written to disk alone.
// One chunk per block is what vLLM's offloading connector does; the device
// side stays in the per-layer layout the attention kernels read (each segment
// is contiguous there too, so a block is 2 to 4 x num_layers copies, which a
// GPU issues as 2 to 4 strided copies across the layers).
//
// Thread safety: plain values.

#include <array>
#include <cstddef>
#include <cstdint>

#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda::runtime {

enum HostBlockSegment : int { kKeyCodes = 0, kValueCodes = 1, kKeyScales = 2, kValueScales = 3 };
inline constexpr int kNumHostBlockSegments = 4;

struct HostBlockLayout {
  // Bytes of one block of one layer per segment (0: none, e.g. the scales of bf16).
  std::array<size_t, kNumHostBlockSegments> segment_bytes{};
  int32_t num_layers = 0;

  size_t layer_bytes() const {
    return segment_bytes[0] + segment_bytes[1] + segment_bytes[2] + segment_bytes[3];
  }
  size_t block_bytes() const { return layer_bytes() * static_cast<size_t>(num_layers); }
  // Where `segment` of `layer` starts inside a host block.
  size_t offset(int32_t layer, int segment) const {
    size_t at = layer_bytes() * static_cast<size_t>(layer);
    for (int s = 0; s < segment; ++s) at += segment_bytes[static_cast<size_t>(s)];
    return at;
  }
};

// The layout for a pool of this shape (num_blocks is ignored; an MLA latent
// pool has empty V segments); block_bytes() equals bytes_per_token() * block_size.
HostBlockLayout host_block_layout(const KvPoolShape& shape);

}  // namespace pagoda::runtime
