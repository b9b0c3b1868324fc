#pragma once
// Kernels of the CUDA tensor-parallel forward (docs/TENSOR_PARALLEL.md): the
// vocab-parallel embedding, the rank-order sum behind the same-device
// communicator and its device-side rendezvous (for CUDA graphs). Launchers follow cuda_ops.h's conventions: enqueue on `stream`,
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

// The same-device communicator's rendezvous inside CUDA graphs, where a host
// rendezvous and host-recorded events cannot sit between per-rank graphs: the
// ranks meet through counters in device memory of one device. counters[r]
// (zero at the start) is written only by rank r's rank_signal, which adds 1
// once every earlier kernel of its stream is done, so after its k-th
// collective it holds k on every rank (all ranks run the same collectives in
// the same order). rank_wait_all (rank 0) returns once every counters[r] has
// reached rank 0's own count; rank_release (rank 0, after the collective's
// work) sets *done to that count; rank_wait_done (rank r) returns once *done
// has reached rank r's count. The waits spin in one small block, so the ranks'
// streams must be able to run at once on the device (kernels already loaded:
// under lazy loading a spinning kernel can hold up the load of another).
// Loads the rendezvous kernels (and the sums) now, so that no spinning kernel waits on their lazy load.
cudaError_t preload_rank_kernels();
cudaError_t rank_signal(unsigned long long* counters, int32_t rank, cudaStream_t stream);
cudaError_t rank_wait_all(const unsigned long long* counters, int32_t n, cudaStream_t stream);
cudaError_t rank_release(const unsigned long long* counters, unsigned long long* done, cudaStream_t stream);
cudaError_t rank_wait_done(const unsigned long long* counters, int32_t rank, const unsigned long long* done,
                           cudaStream_t stream);

}  // namespace pagoda::cuda
