// L2 prefetch of a byte range (l2_prefetch.h).

#include <cstdint>

#include "pagoda/backend/cuda/l2_prefetch.h"

namespace pagoda::cuda {

namespace {

constexpr size_t kPiece = size_t{32} << 10;  // bytes per bulk prefetch
constexpr size_t kLine = 128;
constexpr int kBulkThreads = 32;
constexpr int kBulkMaxCtas = 64;  // spread over SMs: each SM's bulk-copy engine takes its CTAs' pieces
constexpr int kLineThreads = 256;
constexpr int kLineMaxCtas = 264;

__global__ void __launch_bounds__(kBulkThreads) prefetch_bulk_kernel(const char* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const size_t pieces = (bytes + kPiece - 1) / kPiece;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces; i += stride) {
    const size_t offset = i * kPiece;
    const uint32_t size = static_cast<uint32_t>(bytes - offset < kPiece ? bytes - offset : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + offset), "r"(size) : "memory");
  }
#endif
}

__global__ void __launch_bounds__(kLineThreads) prefetch_lines_kernel(const char* p, size_t bytes) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kLine;
  for (size_t offset = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kLine; offset < bytes;
       offset += stride)
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + offset));
}

}  // namespace

cudaError_t prefetch_l2(const void* p, size_t bytes, cudaStream_t stream, L2PrefetchMode mode) {
  if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return cudaErrorInvalidValue;
  bytes &= ~size_t{15};
  if (bytes == 0) return cudaSuccess;
  const char* bytes_at = static_cast<const char*>(p);
  if (mode == L2PrefetchMode::kBulk) {
    const size_t pieces = (bytes + kPiece - 1) / kPiece;
    const size_t ctas = (pieces + kBulkThreads - 1) / kBulkThreads;
    const int grid = static_cast<int>(ctas < kBulkMaxCtas ? ctas : kBulkMaxCtas);
    prefetch_bulk_kernel<<<grid, kBulkThreads, 0, stream>>>(bytes_at, bytes);
  } else {
    const size_t lines = (bytes + kLine - 1) / kLine;
    const size_t ctas = (lines + kLineThreads - 1) / kLineThreads;
    const int grid = static_cast<int>(ctas < kLineMaxCtas ? ctas : kLineMaxCtas);
    prefetch_lines_kernel<<<grid, kLineThreads, 0, stream>>>(bytes_at, bytes);
  }
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
