#pragma once
// Cross-layer KV sharing on the GPU (`--kv-cross-layer-share K`,
// runtime/cross_layer_share.h: the grouping, the merge and its order): the
// shared slot's K/V vectors are unit directions, merged at write time, and
// each member layer keeps its own norm of every vector in a record beside the
// pool. These launchers are kv_write and paged_attention (cuda_ops.h) with the
// share record added; everything else (layout, quantization, plan, holes) is
// theirs. The merge is the CPU's (backend/cpu/kernels/kv_write.cpp
// write_shared): member 0 stores x / |x|; member j > 0 reads the stored
// direction d and sum length s, forms d s + x / |x|, renormalizes, stores the
// new direction (re-quantized) and length, and writes |x| as its norm. The
// attention scales each score by the member's K norm and each value weight by
// its V norm (the CPU's paged_attention_reference).
//
// Thread safety: launchers enqueue on `stream` only; one forward writes a pool at a time.

#include <cstdint>

#include "pagoda/backend/cuda/cuda_ops.h"

namespace pagoda::cuda {

// The norm records of one layer's view of a shared slot: for vector v = slot *
// num_kv_heads + head, record side (0: K, 1: V) starts at norms + (v * 2 +
// side) * record and holds `record` - 1 member norms, then the sum length
// (CpuKvPool's layout). norms null: the layer is not shared.
struct DeviceKvShare {
  float* norms = nullptr;
  int32_t record = 0;  // K + 1
  int32_t member = 0;  // this layer's place in its group, 0 ... K - 1
};

// kv_write merging into a shared slot. K and V pools of bf16 or fp8 (per-vector
// scale: a checkpoint's fixed fp8 scale is not used, as on the CPU); head_dim %
// 8 == 0 and <= 256. Errors: cudaErrorInvalidValue for other dtypes, shapes or
// a share without norms.
cudaError_t kv_write_shared(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots,
                            int32_t num_tokens, const DevicePagedKvLayer& layer, const DeviceKvShare& share,
                            cudaStream_t stream);

// paged_attention over a shared slot as member share.member reads it. share.norms
// null: exactly paged_attention.
cudaError_t paged_attention_shared(const bf16* q, int64_t q_row_stride, const DevicePagedKvLayer& layer,
                                   const DeviceAttentionPlan& plan, int32_t num_q_heads, float scale,
                                   const DeviceKvShare& share, bf16* out, cudaStream_t stream);

}  // namespace pagoda::cuda
