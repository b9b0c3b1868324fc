// l2_prefetch (l2_prefetch.h): bulk L2 prefetches of weights ahead of the GEMV that reads them.
#include "pagoda/backend/cuda/l2_prefetch.h"

#include <algorithm>

#include "pagoda/backend/cuda/pdl.cuh"

namespace pagoda::cuda {
namespace {

// kBulk: 32 KB chunks dealt to CTAs round-robin, one issuing thread each, so the bulk prefetches go out
// through every SM's copy engine rather than one's. kLines: one `prefetch.global.L2` a 128-byte line from
// every thread of the grid (the load/store path: the copy engines stay free for kernels that use them).
constexpr int kMaxCtas = 128;
constexpr size_t kChunkBytes = size_t{32} * 1024;
constexpr int kLineThreads = 256;
constexpr size_t kLineBytes = 128;

__global__ void l2_prefetch_kernel(L2PrefetchRanges ranges, bool lines) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int r = 0; r < ranges.count; ++r) {
    const char* base = static_cast<const char*>(ranges.begin[r]);
    const size_t bytes = ranges.bytes[r];
    if (lines) {
      const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kLineBytes;
      for (size_t off = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kLineBytes; off < bytes;
           off += stride)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off) : "memory");
    } else if (threadIdx.x == 0) {
      for (size_t off = blockIdx.x * kChunkBytes; off < bytes; off += gridDim.x * kChunkBytes) {
        const size_t left = bytes - off;
        const uint32_t n = static_cast<uint32_t>(left < kChunkBytes ? left : kChunkBytes);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(n) : "memory");
      }
    }
  }
#endif
  pdl_wait();
  pdl_launch_dependents();
}

}  // namespace

bool add_l2_prefetch_range(L2PrefetchRanges& ranges, const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return true;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t{15};
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t{15};
  if (end <= begin) return true;
  if (ranges.count >= kL2PrefetchMaxRanges) return false;
  ranges.begin[ranges.count] = reinterpret_cast<const void*>(begin);
  ranges.bytes[ranges.count] = end - begin;
  ++ranges.count;
  return true;
}

cudaError_t l2_prefetch(const L2PrefetchRanges& ranges, cudaStream_t stream, L2PrefetchMode mode) {
  if (ranges.count <= 0) return cudaSuccess;
  if (ranges.count > kL2PrefetchMaxRanges) return cudaErrorInvalidValue;
  size_t chunks = 0;
  for (int r = 0; r < ranges.count; ++r) chunks = std::max(chunks, (ranges.bytes[r] + kChunkBytes - 1) / kChunkBytes);
  const int ctas = static_cast<int>(std::min<size_t>(chunks, kMaxCtas));
  const bool lines = mode == L2PrefetchMode::kLines;
  return launch_pdl(l2_prefetch_kernel, dim3(std::max(ctas, 1)), dim3(lines ? kLineThreads : 32), 0, stream, ranges,
                    lines);
}

}  // namespace pagoda::cuda
