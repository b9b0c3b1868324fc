#pragma once
// L2 prefetch of a byte range for the decode step's weight streams.
//
// At batch 1 the step alternates between weight-streaming GEMVs (HBM-bound) and short kernels that leave
// HBM idle: rope, the KV write, the decode attention and its merge take ~10-15 us a layer on the 8B shape.
// prefetch_l2 asks the L2 to load the next projection's weights during such a stretch, so that the GEMV
// finds them there; CudaModel issues it on a side branch of the step (forked after the qkv projection,
// joined before the o projection) so that it delays none of the kernels between.
//
// L2PrefetchMode::kBulk: a few CTAs whose threads each issue `cp.async.bulk.prefetch.L2` (sm_90's bulk
// copy engine) for 32 KiB pieces; kLines: one `prefetch.global.L2::evict_last` per 128-byte line over a
// full grid. Both are hints: the kernel returns once they are issued, nothing waits for the lines, and they
// may be evicted before the GEMV reads them; correctness never depends on them.
//
// Requirements: p 16-byte aligned (cudaErrorInvalidValue otherwise); bytes rounded down to a multiple of 16;
// bytes == 0 launches nothing. No allocation, no synchronization: CUDA-graph capturable.
// Thread safety: a plain launch on the caller's stream.

#include <cstddef>

#include <cuda_runtime_api.h>

namespace pagoda::cuda {

enum class L2PrefetchMode { kBulk, kLines };

cudaError_t prefetch_l2(const void* p, size_t bytes, cudaStream_t stream, L2PrefetchMode mode = L2PrefetchMode::kBulk);

}  // namespace pagoda::cuda
