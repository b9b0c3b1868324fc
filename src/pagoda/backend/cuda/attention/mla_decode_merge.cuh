#pragma once
// The combination of a split row's segment records (mla_decode_descriptor.h's
// workspace: normalized partial outputs and base-2 log-sum-exps), shared by the
// merge pass (mla_decode.cu) and the merge folded into the ping-pong kernels
// (mla_decode_tma.cu, MlaDecodeDescriptor::fused_merge), so both give the same
// bits: O = sum_s w_s O_s / sum_s w_s with w_s = 2^(lse_s - max lse).
//
// The folded merge's hand-off between CTAs, per split row (two counters a row
// in the plan's arena, zero between launches):
//   - a segment's writer stores its record, synchronizes its writers, and one
//     thread fences and adds 1 to the row's arrivals (release);
//   - after all of its own segments, a CTA waits until the arrivals of each
//     split row it holds reach the row's segment count (acquire), combines its
//     share of the row (segment k of n: items [k W / n, (k + 1) W / n) of the
//     row's W = heads x 128 four-value items), and adds 1 to the departures;
//     the last to depart sets both counters back to zero.
// Every CTA arrives for all of its segments before it waits for any row, so
// the waits end as long as all of the grid's CTAs are resident at once: the
// plan folds the merge only into grids of at most one CTA per SM, and such a
// grid is launched cooperatively (launch_decode below): a grid larger than the
// device or its partition can hold at once (a plan made for more SMs than this
// context may use) is refused at launch instead of its waits hanging, and a
// grid that fits starts only once all of its CTAs can be resident.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"

namespace pagoda::kernels::cuda::mla_merge {

constexpr float kNoRecord = -1e30f;  // the log2-sum-exp below every real one

// Item (head, four values c4 * 4 ..) of a row whose records are
// [first, first + count) (count >= 2): the combined output, as bf16, to out
// (the merge pass, and the folded merge where a thread has at most one item
// of its CTA's share; combine_share batches larger shares). kFromL2: the
// loads go to L2 (__ldcg), for the folded merge, whose records' writers are
// other CTAs of the same grid.
template <bool kFromL2>
__device__ __forceinline__ void combine_item(const MlaDecodeDescriptor& d, int row, int first, int count, int head,
                                             int c4, __nv_bfloat16* __restrict__ out) {
  const float* partial = d.workspace;
  const float* lse = d.workspace + int64_t{d.num_segments} * d.partials_per_segment * d.num_heads * kMlaLatentDim;
  auto load = [](const float* p) { return kFromL2 ? __ldcg(p) : *p; };
  // Unrolled so that eight records' loads are in flight at once (a row of 16 segments would otherwise wait
  // out 32 L2 round trips one after the other, 4 this way); the sums keep their order, so do the bits.
  float max_lse = kNoRecord;
#pragma unroll 8
  for (int s = 0; s < count; ++s) max_lse = fmaxf(max_lse, load(lse + int64_t{first + s} * d.num_heads + head));
  float sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int s = 0; s < count; ++s) {
    const int64_t at = int64_t{first + s} * d.num_heads + head;
    const float w = exp2f(load(lse + at) - max_lse);
    sum += w;
    const float4* p = reinterpret_cast<const float4*>(partial + at * kMlaLatentDim) + c4;
    const float4 v = kFromL2 ? __ldcg(p) : *p;
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  const float inv = 1.0f / sum;
  uint2 packed;
  packed.x = device::pack_bf16x2(acc.x * inv, acc.y * inv);
  packed.y = device::pack_bf16x2(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(out + (int64_t{row} * d.num_heads + head) * kMlaLatentDim)[c4] = packed;
}

// Zeros for item (head, c4) of a row without segments (a fixed plan's padding row).
__device__ __forceinline__ void zero_item(const MlaDecodeDescriptor& d, int row, int head, int c4,
                                          __nv_bfloat16* __restrict__ out) {
  reinterpret_cast<uint2*>(out + (int64_t{row} * d.num_heads + head) * kMlaLatentDim)[c4] = make_uint2(0u, 0u);
}

__device__ __forceinline__ int load_acquire_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The writer's side, by one thread after every writer of the record has
// passed a barrier with it: the record is published to the row's waiters by
// a release reduction (the barrier orders the other writers' stores before
// it, and release is cumulative; CUTLASS's semaphores arrive the same way),
// which waits for less than the full fence.sc of __threadfence + atomicAdd.
__device__ __forceinline__ void arrive(const MlaDecodeDescriptor& d, int row) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(d.merge_counters + 2 * row) : "memory");
}

// One thread spins until the row's `count` records have all arrived (the
// caller then synchronizes its threads before they read the records).
__device__ __forceinline__ void wait_all_arrived(const MlaDecodeDescriptor& d, int row, int count) {
  while (load_acquire_gpu(d.merge_counters + 2 * row) < count) __nanosleep(32);
}

// One thread, once its CTA's wait for the row is over (the records stay until
// the next launch, so the reads need not be done): the last of the row's
// `count` segments to leave resets the counters for the next launch.
__device__ __forceinline__ void depart(const MlaDecodeDescriptor& d, int row, int count) {
  if (atomicAdd(d.merge_counters + 2 * row + 1, 1) == count - 1) {
    atomicExch(d.merge_counters + 2 * row, 0);
    atomicExch(d.merge_counters + 2 * row + 1, 0);
  }
}

// Items [begin, end) of a row whose records are [first, first + count) (count
// >= 2), by kThreads threads (tid 0 ..), kBatch items a thread at a time: the
// batch's loads are in flight together (a share of 1,024 items over 256
// threads would otherwise be four rounds of dependent L2 loads). Each item is
// combine_item's arithmetic in its order: the same bits. The loads go to L2
// (__ldcg): the records' writers are other CTAs of the same grid.
template <int kThreads, int kBatch = 4>
__device__ __forceinline__ void combine_share(const MlaDecodeDescriptor& d, int row, int first, int count, int begin,
                                              int end, int tid, __nv_bfloat16* __restrict__ out) {
  constexpr int kRowItems = kMlaLatentDim / 4;
  const float* partial = d.workspace;
  const float* lse = d.workspace + int64_t{d.num_segments} * d.partials_per_segment * d.num_heads * kMlaLatentDim;
  for (int i0 = begin + tid; i0 < end; i0 += kBatch * kThreads) {
    bool live[kBatch];
    int head[kBatch], c4[kBatch];
    float max_lse[kBatch], sum[kBatch];
    float4 acc[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * kThreads;
      live[j] = i < end;
      head[j] = i / kRowItems;
      c4[j] = i % kRowItems;
      max_lse[j] = kNoRecord;
      sum[j] = 0.0f;
      acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll 2
    for (int s = 0; s < count; ++s)
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (live[j]) max_lse[j] = fmaxf(max_lse[j], __ldcg(lse + int64_t{first + s} * d.num_heads + head[j]));
#pragma unroll 2
    for (int s = 0; s < count; ++s)
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (!live[j]) continue;
        const int64_t at = int64_t{first + s} * d.num_heads + head[j];
        const float w = exp2f(__ldcg(lse + at) - max_lse[j]);
        sum[j] += w;
        const float4 v = __ldcg(reinterpret_cast<const float4*>(partial + at * kMlaLatentDim) + c4[j]);
        acc[j].x += w * v.x;
        acc[j].y += w * v.y;
        acc[j].z += w * v.z;
        acc[j].w += w * v.w;
      }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!live[j]) continue;
      const float inv = 1.0f / sum[j];
      uint2 packed;
      packed.x = device::pack_bf16x2(acc[j].x * inv, acc[j].y * inv);
      packed.y = device::pack_bf16x2(acc[j].z * inv, acc[j].w * inv);
      reinterpret_cast<uint2*>(out + (int64_t{row} * d.num_heads + head[j]) * kMlaLatentDim)[c4[j]] = packed;
    }
  }
}

// A segment's end, by the threads that stored its record (one warpgroup: group_tid 0..127), after the
// stores: with the merge folded in and the row split, the record is published to the row's waiters.
// group_barrier: a barrier of exactly those threads.
template <class GroupBarrier>
__device__ __forceinline__ void publish_record(const MlaDecodeDescriptor& d, int row, int group_tid,
                                               GroupBarrier group_barrier) {
  if (!d.fused_merge || d.row_segment_start[row + 1] - d.row_segment_start[row] < 2) return;
  group_barrier();  // every writer of the record is past its stores
  if (group_tid == 0) arrive(d, row);
}

// The folded merge, by a CTA's kThreads compute threads (tid 0 ..) after all of its segments
// [seg_begin, seg_end) were published: its share of each split row it holds, once all of the row's
// records are in, then zeros for its share of the padding rows (rows without segments, a CTA per row in
// turn). barrier: a barrier of exactly those threads.
template <int kThreads, class Barrier>
__device__ __forceinline__ void combine_held_rows(const MlaDecodeDescriptor& d, int seg_begin, int seg_end, int tid,
                                                  Barrier barrier, __nv_bfloat16* __restrict__ out) {
  constexpr int kRowItems = kMlaLatentDim / 4;  // four values an item
  const int items = d.num_heads * kRowItems;
  for (int seg = seg_begin; seg < seg_end; ++seg) {
    const int row = d.segments[3 * seg];
    const int first = d.row_segment_start[row];
    const int count = d.row_segment_start[row + 1] - first;
    if (count < 2) continue;
    if (tid == 0) {
      wait_all_arrived(d, row, count);
      depart(d, row, count);  // the records stay until the next launch: no need to wait for the reads
    }
    barrier();
    const int k = seg - first;
    const int begin = int(int64_t{k} * items / count), end = int(int64_t{k + 1} * items / count);
    // A share of at most one item a thread (long rows: 16 segments of H = 16 give 128 items) gains nothing
    // from batching items, and combine_item keeps eight records' loads in flight where combine_share keeps
    // two (docs/KERNELS.md, v28); larger shares (short rows) batch.
    if (end - begin > kThreads) {
      combine_share<kThreads>(d, row, first, count, begin, end, tid, out);
    } else if (begin + tid < end) {
      combine_item<true>(d, row, first, count, (begin + tid) / kRowItems, (begin + tid) % kRowItems, out);
    }
  }
  for (int row = blockIdx.y; row < d.num_rows; row += gridDim.y)
    if (d.row_segment_start[row + 1] == d.row_segment_start[row])
      for (int i = tid; i < items; i += kThreads) zero_item(d, row, i / kRowItems, i % kRowItems, out);
}

// Launches a decode kernel over d's CTAs (grid 1 x num_ctas); with the merge folded in, as a cooperative
// launch (the header comment); with it paired (mla_decode_pair.cuh), in clusters of two CTAs (1 x 2);
// else as before. PAGODA_MLA_FUSED_LAUNCH=plain launches a folded grid as any other (a diagnostic: what the
// cooperative launch costs).
template <class... Params, class... Args>
cudaError_t launch_decode(void (*kernel)(Params...), const MlaDecodeDescriptor& d, int threads, size_t smem_bytes,
                          cudaStream_t stream, Args... args) {
  static const bool plain = [] {
    const char* v = std::getenv("PAGODA_MLA_FUSED_LAUNCH");
    return v != nullptr && std::strcmp(v, "plain") == 0;
  }();
  if (!d.paired_merge && (!d.fused_merge || plain)) {
    kernel<<<dim3(1, d.num_ctas), threads, smem_bytes, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1, d.num_ctas);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  if (d.paired_merge) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = 1;
    attribute.val.clusterDim.y = 2;
    attribute.val.clusterDim.z = 1;
  } else {
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
  }
  config.attrs = &attribute;
  config.numAttrs = 1;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, args...);
  const cudaError_t last = cudaGetLastError();  // read (and cleared) either way
  return launched != cudaSuccess ? launched : last;
}

}  // namespace pagoda::kernels::cuda::mla_merge
