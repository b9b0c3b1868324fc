#include "pagoda/backend/cuda/kv_zero_blocks.h"

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 256;

// A CTA clears n bytes: 16-byte stores when the start and n allow, else
// 4-byte words, else bytes.
__device__ void zero_bytes(char* dst, uint64_t n) {
  const uint64_t align = reinterpret_cast<uintptr_t>(dst) | n;
  if (align % 16 == 0) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (uint64_t i = threadIdx.x; i < n / 16; i += kThreads) d[i] = zero;
  } else if (align % 4 == 0) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    for (uint64_t i = threadIdx.x; i < n / 4; i += kThreads) d[i] = 0;
  } else {
    for (uint64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = 0;
  }
}

__global__ void __launch_bounds__(kThreads) kv_zero_blocks_kernel(KvHostCopyGeometry g, KvZeroBlocks b) {
  const int32_t index = static_cast<int32_t>(blockIdx.x) / g.num_layers;
  const int32_t layer = static_cast<int32_t>(blockIdx.x) % g.num_layers;
  const uint64_t block = static_cast<uint64_t>(b.block[index]);
  char* device_layer = g.device + static_cast<uint64_t>(layer) * g.layer_bytes;
  for (int s = 0; s < 4; ++s) {
    const uint64_t bytes = g.segment_bytes[s];
    if (bytes != 0) zero_bytes(device_layer + g.segment_offset[s] + block * bytes, bytes);
  }
}

}  // namespace

cudaError_t kv_zero_blocks(const KvHostCopyGeometry& geometry, const KvZeroBlocks& blocks, cudaStream_t stream) {
  if (blocks.count <= 0 || geometry.num_layers <= 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(blocks.count) * static_cast<unsigned>(geometry.num_layers);
  kv_zero_blocks_kernel<<<grid, kThreads, 0, stream>>>(geometry, blocks);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
