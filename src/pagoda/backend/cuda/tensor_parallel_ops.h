#pragma once
// Kernels of the CUDA tensor-parallel forward (docs/TENSOR_PARALLEL.md): the
// vocab-parallel embedding and the rank-order sum behind the same-device
// communicator. Launchers follow cuda_ops.h's conventions: enqueue on `stream`,
// never synchronize or allocate, return cudaGetLastError().

#include <cstdint>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

// The vocab-parallel embedding: out[t, :] = table[token_ids[t] - vocab_begin, :]
// as f32 when vocab_begin <= token_ids[t] < vocab_end, else zeros. table
// [vocab_end - vocab_begin, hidden] bf16 (the rank's rows); hidden % 8 == 0.
cudaError_t embedding_gather_shard(const bf16* table, const int32_t* token_ids, int32_t num_tokens, int32_t hidden,
                                   int32_t vocab_begin, int32_t vocab_end, float* out, cudaStream_t stream);

// At most this many buffers in one rank-order sum.
inline constexpr int32_t kMaxRankBuffers = 8;
struct RankBuffers {
  void* data[kMaxRankBuffers] = {};
};

// For every element i < count: s = buffers[0][i] + buffers[1][i] + ... in that
// order in f32, then every buffer's element i becomes s (rounded once to bf16
// when bf16), so each buffer ends with the same bits. One thread reads and
// writes one element of all buffers, so buffers may be summed in place.
// 1 <= n <= kMaxRankBuffers.
cudaError_t sum_in_rank_order(const RankBuffers& buffers, int32_t n, int64_t count, bool bf16_elements,
                              cudaStream_t stream);

}  // namespace pagoda::cuda
