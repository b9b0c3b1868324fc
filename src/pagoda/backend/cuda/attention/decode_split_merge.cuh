#pragma once
// The split-K scaffolding every decode kernel shares (decode_attention.cu for
// bf16, decode_attention_quantized.cu for the quantized pools): reading one
// work item of the plan, combining the warps' online-softmax partials of a
// CTA, writing either the output row (the sequence has one split) or the
// normalized partial and its log2-sum-exp (the merge pass, launch_decode_merge,
// combines the splits), and the host-side launch of kernel + merge. Device
// code and host templates; include from .cu files only (C++17).
//
// Units: scores are in log2 units (q pre-scaled by scale_log2), so m is a
// running max of log2-scores, l a sum of exp2(score - m), acc a sum of
// exp2(score - m) * v. The workspace holds partial outputs
// [num_work_items, num_q_heads, head_dim] then log2-sum-exp [num_work_items,
// num_q_heads] (attention_descriptor.h).

#include <cuda_bf16.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/attention_launch_internal.h"

namespace pagoda::kernels::cuda::device {

// A finite "minus infinity" for running maxima: exp2 of differences stays NaN-free.
constexpr float kNoScore = -1e30f;

// One decode work item (a split [kv_begin, kv_end) of one sequence) for the
// query heads [q_head0, q_head0 + heads) of one GQA group. sequence < 0 marks
// an unused item of a graph-mode plan (fixed grid, fewer items this step).
struct DecodeWorkItem {
  int item;
  int sequence;
  int kv_begin;
  int kv_end;
  int q_head0;
  int kv_head;
  int token;             // the query row (its one new token)
  const int32_t* table;  // the sequence's block table
  // Per-head holes (AttentionDescriptor::hole_begin): positions [hole_begin, hole_end) of this KV
  // head are not attended (read as zeros, scored -inf); both 0 without holes.
  int hole_begin;
  int hole_end;
  // Is position pos attended: before the split's end and outside the head's hole.
  __device__ __forceinline__ bool live(int pos) const { return pos < kv_end && (pos < hole_begin || pos >= hole_end); }
};

__device__ __forceinline__ DecodeWorkItem load_decode_work_item(const AttentionDescriptor& d, int item,
                                                                int head_tile, int heads_per_cta) {
  DecodeWorkItem w;
  w.item = item;
  w.sequence = d.work_items[3 * item];
  w.q_head0 = head_tile * heads_per_cta;
  w.kv_head = w.q_head0 / (d.num_q_heads / d.num_kv_heads);
  w.hole_begin = w.hole_end = 0;
  if (w.sequence < 0) {
    w.kv_begin = w.kv_end = w.token = 0;
    w.table = d.block_tables;
    return w;
  }
  w.kv_begin = d.work_items[3 * item + 1];
  w.kv_end = d.work_items[3 * item + 2];
  w.token = d.query_start[w.sequence];
  w.table = d.block_tables + d.block_table_start[w.sequence];
  return w;
}

// Reads the item's hole (AttentionDescriptor::hole_begin) into w; the kernels that skip holes call
// it after load_decode_work_item (the others never see a descriptor with holes).
__device__ __forceinline__ void load_decode_holes(const AttentionDescriptor& d, DecodeWorkItem& w) {
  if (d.hole_begin == nullptr || w.sequence < 0) return;
  w.hole_begin = d.hole_begin[int64_t{w.sequence} * d.num_kv_heads + w.kv_head];
  w.hole_end = d.hole_end[w.sequence];
}

// The per-warp partials of one CTA in shared memory: m and l [warps][heads],
// acc [warps][heads][head_dim] (floats). kFloats of shared memory.
template <int kWarps, int kHeads, int kHeadDim>
struct WarpPartials {
  static constexpr int kFloats = 2 * kWarps * kHeads + kWarps * kHeads * kHeadDim;
  float* m;
  float* l;
  float* acc;
  __device__ explicit WarpPartials(float* base)
      : m(base), l(base + kWarps * kHeads), acc(base + 2 * kWarps * kHeads) {}
  __device__ float* acc_row(int warp, int head) const { return acc + (warp * kHeads + head) * kHeadDim; }
};

// Combines the warps' partials and writes this item's result: the bf16 output
// rows when the item is its sequence's only split, else the normalized partial
// outputs and their log2-sum-exp for the merge pass. The whole CTA calls it
// after a __syncthreads that follows the partials' writes.
template <int kWarps, int kHeads, int kHeadDim>
__device__ __forceinline__ void write_decode_result(const AttentionDescriptor& d, const DecodeWorkItem& w,
                                    const WarpPartials<kWarps, kHeads, kHeadDim>& p,
                                    __nv_bfloat16* __restrict__ out) {
  const bool split = d.split_start[w.sequence + 1] - d.split_start[w.sequence] > 1;
  float* partial_o = d.workspace;
  float* partial_lse = d.workspace + int64_t{d.num_work_items} * d.num_q_heads * kHeadDim;
  for (int idx = threadIdx.x; idx < kHeads * kHeadDim; idx += blockDim.x) {
    const int h = idx / kHeadDim;
    const int col = idx % kHeadDim;
    float m_all = kNoScore;
#pragma unroll
    for (int warp = 0; warp < kWarps; ++warp) m_all = fmaxf(m_all, p.m[warp * kHeads + h]);
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int warp = 0; warp < kWarps; ++warp) {
      const float weight = exp2f(p.m[warp * kHeads + h] - m_all);
      sum += p.l[warp * kHeads + h] * weight;
      o += p.acc_row(warp, h)[col] * weight;
    }
    const int q_head = w.q_head0 + h;
    if (!split) {
      // sum == 0 only for an empty range (a graph bucket's padding row): zeros, as the builtin kernel.
      out[(int64_t{w.token} * d.num_q_heads + q_head) * kHeadDim + col] =
          __float2bfloat16(sum > 0.0f ? o / sum : 0.0f);
    } else {
      // sum == 0: the whole split lies in a hole; its log2-sum-exp is -inf, so the merge weighs it 0.
      partial_o[(int64_t{w.item} * d.num_q_heads + q_head) * kHeadDim + col] = sum > 0.0f ? o / sum : 0.0f;
      if (col == 0) partial_lse[int64_t{w.item} * d.num_q_heads + q_head] = m_all + log2f(sum);
    }
  }
}

}  // namespace pagoda::kernels::cuda::device

namespace pagoda::kernels::cuda {

// Lets the merge pass (a programmatic dependent launch) start while this grid
// runs: its CTAs wait in griddepcontrol.wait for this grid's results. Called
// by every decode kernel once all of its CTAs are resident.
__device__ __forceinline__ void allow_merge_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// Launches one decode kernel instantiation over a plan's work items, then the
// merge pass when some sequence has more than one split. The kernel takes
// (descriptor, q, out); its grid is (num_q_heads / q_heads_per_cta,
// num_work_items) unless `grid` is given (a persistent kernel sizes its own).
// The shared-memory limit is raised once per instantiation (before any graph
// capture: prepare_* launches each with zero work items); a launch with zero
// work items enqueues nothing.
template <auto kKernel, int kSmemBytes, int kThreads>
cudaError_t launch_split_decode(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                                cudaStream_t stream, dim3 grid = dim3(0, 0, 0)) {
  static const cudaError_t prepared =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (prepared != cudaSuccess) return prepared;
  if (d.num_work_items == 0) return cudaSuccess;
  if (grid.x == 0) grid = dim3(d.num_q_heads / d.q_heads_per_cta, d.num_work_items);
  kKernel<<<grid, kThreads, kSmemBytes, stream>>>(d, q, out);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || d.max_splits <= 1) return err;
  return launch_decode_merge(d, out, stream);
}

}  // namespace pagoda::kernels::cuda
