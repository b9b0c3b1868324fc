#include "pagoda/backend/cuda/kv_host_copy.h"

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr uint64_t kSliceBytes = 8192;  // target bytes per CTA and segment
constexpr int kMaxSlices = 8;

// A CTA copies n bytes: 16-byte vectors (several loads in flight per thread
// before the stores: host memory is a PCIe round trip away) when both ends
// and n allow, else 4-byte words, else bytes.
__device__ void copy_bytes(char* dst, const char* src, uint64_t n) {
  const uint64_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | n;
  if (align % 16 == 0) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    const uint64_t count = n / 16;
    for (uint64_t base = threadIdx.x; base < count; base += static_cast<uint64_t>(kThreads) * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t i = base + static_cast<uint64_t>(u) * kThreads;
        if (i < count) v[u] = s[i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t i = base + static_cast<uint64_t>(u) * kThreads;
        if (i < count) d[i] = v[u];
      }
    }
  } else if (align % 4 == 0) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
    for (uint64_t i = threadIdx.x; i < n / 4; i += kThreads) d[i] = s[i];
  } else {
    for (uint64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
  }
}

// One (pair, layer - layer_begin) item x: its slice `slice` of every segment.
__device__ void copy_item(const KvHostCopyGeometry& g, const KvHostCopyPairs& p, bool to_host, int32_t layer_begin,
                          int32_t layer_count, int32_t x, uint64_t slices, uint64_t slice) {
  const int32_t pair = x / layer_count;
  const int32_t layer = layer_begin + x % layer_count;
  const uint64_t device_block = static_cast<uint64_t>(p.device_block[pair]);
  const uint64_t host_layer_bytes = g.segment_bytes[0] + g.segment_bytes[1] + g.segment_bytes[2] + g.segment_bytes[3];
  char* device_layer = g.device + static_cast<uint64_t>(layer) * g.layer_bytes;
  char* host = g.host + static_cast<uint64_t>(p.host_block[pair]) * g.host_block_bytes +
               static_cast<uint64_t>(layer) * host_layer_bytes;
  for (int s = 0; s < 4; ++s) {
    const uint64_t bytes = g.segment_bytes[s];
    if (bytes == 0) continue;
    char* device = device_layer + g.segment_offset[s] + device_block * bytes;
    // This CTA's slice: a multiple of 16 bytes long, the last one shorter.
    const uint64_t slice_bytes = (((bytes + slices - 1) / slices) + 15) & ~uint64_t{15};
    const uint64_t begin = slice * slice_bytes;
    if (begin < bytes) {
      const uint64_t n = bytes - begin < slice_bytes ? bytes - begin : slice_bytes;
      if (to_host) copy_bytes(host + begin, device + begin, n);
      else copy_bytes(device + begin, host + begin, n);
    }
    host += bytes;
  }
}

// blockIdx.x: items x, x + gridDim.x, ... of (pair, layer - layer_begin); blockIdx.y: the slice of every segment.
__global__ void __launch_bounds__(kThreads)
    kv_host_copy_kernel(KvHostCopyGeometry g, KvHostCopyPairs p, bool to_host, int32_t layer_begin,
                        int32_t layer_count) {
  const int32_t items = p.count * layer_count;
  for (int32_t x = static_cast<int32_t>(blockIdx.x); x < items; x += static_cast<int32_t>(gridDim.x))
    copy_item(g, p, to_host, layer_begin, layer_count, x, gridDim.y, blockIdx.y);
}

}  // namespace

cudaError_t kv_host_copy_layers(const KvHostCopyGeometry& geometry, const KvHostCopyPairs& pairs, bool to_host,
                                int32_t layer_begin, int32_t layer_count, cudaStream_t stream, int32_t max_ctas) {
  if (pairs.count <= 0 || layer_count <= 0 || layer_begin < 0 || layer_begin + layer_count > geometry.num_layers)
    return cudaSuccess;
  uint64_t largest = 0;
  for (uint64_t b : geometry.segment_bytes) largest = b > largest ? b : largest;
  uint64_t slices = (largest + kSliceBytes - 1) / kSliceBytes;
  slices = slices < 1 ? 1 : slices > kMaxSlices ? kMaxSlices : slices;
  uint64_t grid_x = static_cast<uint64_t>(pairs.count) * static_cast<uint64_t>(layer_count);
  if (max_ctas > 0) {
    // Keep the slices (each CTA's share of one segment); the CTAs loop over the (pair, layer) items.
    const uint64_t per_slice = static_cast<uint64_t>(max_ctas) / slices;
    grid_x = per_slice < 1 ? 1 : per_slice < grid_x ? per_slice : grid_x;
  }
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(slices));
  kv_host_copy_kernel<<<grid, kThreads, 0, stream>>>(geometry, pairs, to_host, layer_begin, layer_count);
  return cudaGetLastError();
}

cudaError_t kv_host_copy(const KvHostCopyGeometry& geometry, const KvHostCopyPairs& pairs, bool to_host,
                         cudaStream_t stream, int32_t max_ctas) {
  return kv_host_copy_layers(geometry, pairs, to_host, 0, geometry.num_layers, stream, max_ctas);
}

}  // namespace pagoda::cuda
