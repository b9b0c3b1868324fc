#pragma once
// Weights fetched into the L2 ahead of the GEMV that reads them (decode-sized steps).
//
// At batch 1 the HBM idles while rope, the KV write and the decode attention run between the qkv and o
// projections (~10 us a layer on an H100), and every GEMV then starts its stream cold. l2_prefetch issues
// L2 prefetches (bulk or line by line) for the next projections' weights at the start of that window, so their
// bytes arrive while the small kernels run and the GEMV reads them from the L2. A prefetch is only a hint:
// it changes no value, and what the L2 drops is read from DRAM as before.
//
// The kernel issues the prefetches before its pdl_wait (weights depend on no earlier kernel), so launched
// through PDL it overlaps the tail of the kernel ahead; it then waits and lets the next kernel in, as every
// PDL kernel must (pdl.cuh).
//
// Header for .cu and .cpp files alike (C++17, no std containers).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace pagoda::cuda {

// The CUDA model's budget a layer (MiB; PAGODA_L2_PREFETCH_MB overrides it, 0: off).
inline constexpr size_t kL2PrefetchDefaultMb = 0;

// At most this many ranges a launch (kernel parameters by value).
constexpr int32_t kL2PrefetchMaxRanges = 4;

struct L2PrefetchRanges {
  int32_t count = 0;
  const void* begin[kL2PrefetchMaxRanges] = {};
  size_t bytes[kL2PrefetchMaxRanges] = {};
};

// Adds [p, p + bytes) to `ranges` (shrunk to its 16-byte aligned interior, which the bulk prefetch needs);
// false when the list is full. Empty or null ranges are skipped (true).
bool add_l2_prefetch_range(L2PrefetchRanges& ranges, const void* p, size_t bytes);

// How the prefetches are issued: kBulk, `cp.async.bulk.prefetch.L2` in 32 KB chunks through the SMs' copy
// engines (a few hundred instructions); kLines, one `prefetch.global.L2` a 128-byte line through the
// load/store path. Bulk measured slower than none on an H100 (docs/BENCHMARKS.md); lines is not measured yet.
enum class L2PrefetchMode { kBulk, kLines };

// Issues the prefetches on `stream` (a launch through launch_pdl). Nothing is launched for an empty list.
// Requires sm_90; on older devices the kernel only waits.
cudaError_t l2_prefetch(const L2PrefetchRanges& ranges, cudaStream_t stream, L2PrefetchMode mode = L2PrefetchMode::kBulk);

}  // namespace pagoda::cuda
