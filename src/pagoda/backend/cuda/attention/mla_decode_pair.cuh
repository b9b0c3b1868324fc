#pragma once
// The merge folded into the ping-pong kernels between the two CTAs of a
// cluster (MlaDecodeDescriptor::paired_merge), for plans whose split rows all
// have two segments held alone by CTAs 2i and 2i + 1 (64 rows of 4K on 132
// SMs, say). There the counters' merge (mla_decode_merge.cuh) writes each
// segment's 32 KB record to L2, fences, waits for the other CTA's arrival and
// reads a half row of records back; here the two CTAs run as a cluster of two
// and trade halves through distributed shared memory instead:
//   - the row's output is split by latent dims: the row's first segment's CTA
//     combines dims [0, 256), the second's [256, 512);
//   - at its segment's end, group 0 (which holds the segment's normalized O^T
//     after the hand-over) stores the half its partner combines, and its
//     per-head log2-sum-exps, into the partner's receive area (st.shared::cluster,
//     thread t's values where the partner's thread t reads them: both hold
//     the same heads and dims), then arrives on the partner's mbarrier
//     (release at cluster scope);
//   - it waits on its own mbarrier (acquire at cluster scope) for the
//     partner's half and combines it with the half it kept in registers,
//     with combine_item's arithmetic for two records in segment order, so the
//     bits are the merge pass's; then it stores bf16 to out.
// No record reaches global memory, no counter is touched, and a CTA waits only
// for its cluster partner, which the hardware schedules beside it: no
// cooperative launch is needed. Each CTA's receive area is written only by its
// partner and read only after the partner's arrival, and each waits for the
// other's arrival before it leaves, so no CTA exits while its shared memory
// may still be written. A kernel with no shared memory to spare for the
// receive area (tma_fp8) lends memory its tiles no longer need at the
// segment's end instead: then each CTA first tells its partner that the area
// is free (a second mbarrier, `ready`), and writes into the partner's only
// once told the same.

#include <cuda_bf16.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"
#include "pagoda/backend/cuda/attention/mla_decode_merge.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_narrow.cuh"
#include "pagoda/backend/cuda/attention/prefill_sm90_sync.cuh"

namespace pagoda::kernels::cuda::mla_pair {

// A thread's sent values: 4 m-tiles x 8 O^T entries of the partner's half, then its 4 heads' log2-sum-exps.
constexpr int kValues = 4 * 8 + 4;
constexpr int kGroupThreads = 128;
// The receive area: [kValues][128 threads] floats, then the mbarrier the partner's 128 threads arrive on.
constexpr int kReceiveBytes = kValues * kGroupThreads * 4;
constexpr int kBytes = kReceiveBytes + 16;

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The shared::cluster address of `addr` (a shared::cta address of this CTA) in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(addr), "r"(rank));
  return mapped;
}

__device__ __forceinline__ void store_remote(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// Arrives on an mbarrier of another CTA of the cluster, releasing this thread's earlier stores to it.
__device__ __forceinline__ void arrive_remote(uint32_t bar_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar_addr) : "memory");
}

// Waits for the phase of this parity of this CTA's mbarrier, acquiring what other CTAs' arrivals released.
__device__ __forceinline__ void wait_cluster(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "pair_wait_again:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra pair_wait_again;\n"
      "}\n" ::"r"(device::smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Every thread of both CTAs, once at the start (after the mbarriers' init and
// its fence): the partner's receive mbarrier is initialized before anyone
// arrives on it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// Group 0 of a CTA of a pair (group_tid 0..127), at the end of its one segment, which is segment k (0 or 1) of
// row `row`, with the segment's normalized O^T in st and its maxima and sums (st.m, sum): the exchange above,
// then the row's output for this CTA's half of the dims. receive / arrived: this CTA's receive area and its
// mbarrier (initialized with 128 arrivals; one phase a launch). ready: null where the receive area is the
// kernel's own; else an mbarrier like `arrived`, for a receive area lent by memory the kernel is done with
// (the header comment). k is a template parameter so that every register index is static
// (exchange_and_store picks it).
template <int k>
__device__ __forceinline__ void exchange_and_store_as(const MlaDecodeDescriptor& d,
                                                      const mla_narrow::SegmentStateOf<8>& st,
                                                      const mla_narrow::ThreadPlace& t, const float (&sum)[4],
                                                      int row, int group_tid, float* receive, uint64_t* arrived,
                                                      uint64_t* ready, __nv_bfloat16* __restrict__ out) {
  const uint32_t partner = cluster_rank() ^ 1u;
  const uint32_t partner_receive = map_to_rank(device::smem_address(receive), partner);
  if (ready != nullptr) {
    arrive_remote(map_to_rank(device::smem_address(ready), partner));  // this CTA's area is free
    wait_cluster(ready, 0);                                             // and the partner's
  }
  float lse[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) lse[h] = st.m[h] + log2f(sum[h]);
  // m-tile mi covers dims [64 mi, 64 mi + 64): the first segment's CTA keeps m-tiles 0..3, the second's 4..7.
#pragma unroll
  for (int mi = 0; mi < 8; ++mi) {
    if ((mi < 4) == (k == 0)) continue;  // this CTA's own half
#pragma unroll
    for (int i = 0; i < 8; ++i)
      store_remote(partner_receive + uint32_t((((mi & 3) * 8 + i) * kGroupThreads + group_tid) * 4), st.o[mi][i]);
  }
#pragma unroll
  for (int h = 0; h < 4; ++h)
    store_remote(partner_receive + uint32_t(((32 + h) * kGroupThreads + group_tid) * 4), lse[h]);
  arrive_remote(map_to_rank(device::smem_address(arrived), partner));
  wait_cluster(arrived, 0);

  const int heads_here = min(mla_narrow::kHeads, d.num_heads);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + t.col + e;
      if (h >= heads_here) continue;
      const int hk = 2 * j + e;  // the head's place in this thread's st.m / sum / lse
      const float peer_lse = receive[(32 + hk) * kGroupThreads + group_tid];
      const float lse0 = k == 0 ? lse[hk] : peer_lse, lse1 = k == 0 ? peer_lse : lse[hk];
      // combine_item's arithmetic for two records, in its order (the merge pass's bits).
      float max_lse = mla_merge::kNoRecord;
      max_lse = fmaxf(max_lse, lse0);
      max_lse = fmaxf(max_lse, lse1);
      float total = 0.0f;
      const float w0 = exp2f(lse0 - max_lse);
      total += w0;
      const float w1 = exp2f(lse1 - max_lse);
      total += w1;
      const float inv = 1.0f / total;
      __nv_bfloat16* head_out = out + (int64_t{row} * d.num_heads + h) * kMlaLatentDim;
#pragma unroll
      for (int mi = 0; mi < 8; ++mi) {
        if ((mi < 4) != (k == 0)) continue;  // the partner's half
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int entry = 4 * j + 2 * i + e;
          const float own = st.o[mi][entry];
          const float peer = receive[((mi & 3) * 8 + entry) * kGroupThreads + group_tid];
          float acc = 0.0f;
          acc += w0 * (k == 0 ? own : peer);
          acc += w1 * (k == 0 ? peer : own);
          head_out[mi * 64 + t.row0 + 8 * i] = __float2bfloat16(acc * inv);
        }
      }
    }
}

__device__ __forceinline__ void exchange_and_store(const MlaDecodeDescriptor& d, const mla_narrow::SegmentStateOf<8>& st,
                                                   const mla_narrow::ThreadPlace& t, const float (&sum)[4], int row,
                                                   int k, int group_tid, float* receive, uint64_t* arrived,
                                                   uint64_t* ready, __nv_bfloat16* __restrict__ out) {
  if (k == 0) exchange_and_store_as<0>(d, st, t, sum, row, group_tid, receive, arrived, ready, out);
  else exchange_and_store_as<1>(d, st, t, sum, row, group_tid, receive, arrived, ready, out);
}

}  // namespace pagoda::kernels::cuda::mla_pair
