// KV write into the paged pool. bf16 pools: one thread per 16-byte chunk of a
// (token, kv head) vector, K and V together. Quantized pools: one warp per
// (token, kv head); lane i holds elements i, i + 32, ... so that an int4 group
// of 32 is one register across the warp and amax / min / max are warp
// shuffles. The arithmetic is runtime/kv_quant.h's, written with explicitly
// rounded intrinsics (no contraction, no fast-math) so that the codes equal the
// CPU quantizer's bit for bit. fp8 with a checkpoint's per-tensor scale skips
// the amax and codes x * (1 / scale), as backend/cpu/kernels/kv_quantize.cpp does.
#include <cmath>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/kv_share_ops.h"
#include "pagoda/backend/cuda/pdl.cuh"
#include "pagoda/backend/cuda/rope_kv_write.h"
#include "pagoda/backend/cuda/rope_pair.cuh"

namespace pagoda::cuda {

namespace {

using kernels::KvQuant;

constexpr int kMaxElementsPerLane = 8;  // head_dim <= 256
constexpr int kWarpsPerBlock = 4;

__global__ void kv_write_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t row_stride,
                                const int64_t* __restrict__ slots, int32_t num_tokens, bf16* __restrict__ key,
                                bf16* __restrict__ value, int32_t num_kv_heads, int32_t head_dim) {
  pdl_wait();  // launched programmatically (pdl.cuh): k and v come from the kernel ahead
  pdl_launch_dependents();
  const int32_t chunks_per_row = num_kv_heads * head_dim / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * chunks_per_row) return;
  const int64_t t = i / chunks_per_row;
  const int32_t c = static_cast<int32_t>(i % chunks_per_row);
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t dst = slot * num_kv_heads * head_dim / 8 + c;  // in 16-byte chunks
  reinterpret_cast<uint4*>(key)[dst] = reinterpret_cast<const uint4*>(k + t * row_stride)[c];
  reinterpret_cast<uint4*>(value)[dst] = reinterpret_cast<const uint4*>(v + t * row_stride)[c];
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_min(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fminf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// The integer formats' parameters from a group's min and max, as kv_quant.h says.
struct IntParams {
  kernels::KvScaleZero record;
  float zero;
  float inverse_scale;
};
__device__ __forceinline__ IntParams int_params(float lo, float hi, int levels) {
  IntParams p;
  const __half zero = __float2half_rn(lo);
  p.zero = __half2float(zero);
  __half scale = __float2half_rn(__fdiv_rn(__fsub_rn(hi, p.zero), static_cast<float>(levels)));
  if ((__half_as_ushort(scale) & 0x7fffu) == 0) scale = __float2half_rn(1.0f);
  p.inverse_scale = __fdiv_rn(1.0f, __half2float(scale));
  p.record.scale_f16 = __half_as_ushort(scale);
  p.record.zero_f16 = __half_as_ushort(zero);
  return p;
}
__device__ __forceinline__ uint32_t int_code(float x, const IntParams& p, int levels) {
  const float q = rintf(__fmul_rn(__fsub_rn(x, p.zero), p.inverse_scale));  // ties to even
  return static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), static_cast<float>(levels)));
}

// Stores one (token, head) vector as `format` at vector index `vec` of the data pool and record vector
// `scale_vec` of the scale pool (kernels::kv_scale_vector). Called by a whole warp. write_values takes it
// from registers (x[j] is element lane + 32 j, 0 past head_dim, each a bf16 value), write_vector from a
// row of head_dim bf16. fp8_fixed_scale > 0: fp8 uses it instead of the vector's amax / 448.
__device__ void write_values(const float (&x)[kMaxElementsPerLane], int32_t head_dim, KvQuant format,
                             float fp8_fixed_scale, void* data, void* scales, int64_t vec, int64_t scale_vec, int lane) {
  switch (format) {
    case KvQuant::kNone: {
      bf16* out = static_cast<bf16*>(data) + vec * head_dim;
#pragma unroll
      for (int j = 0; j < kMaxElementsPerLane; ++j) {
        const int e = lane + 32 * j;
        if (e < head_dim) out[e] = __float2bfloat16(x[j]);
      }
      return;
    }
    case KvQuant::kFP8E4M3: {
      float scale = fp8_fixed_scale;  // a kernel argument: the branch is uniform across the warp
      if (!(scale > 0.0f)) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxElementsPerLane; ++j) amax = fmaxf(amax, fabsf(x[j]));  // padding is 0
        amax = warp_max(amax);
        scale = amax > 0.0f ? __fdiv_rn(amax, kernels::kKvFp8Max) : 1.0f;
      }
      // Out-of-range products (a fixed scale clips outliers; x * inverse may even
      // overflow to inf) saturate at +-448, as the CPU's f32_to_fp8e4m3.
      const float inverse = __fdiv_rn(1.0f, scale);
      uint8_t* out = static_cast<uint8_t*>(data) + vec * head_dim;
#pragma unroll
      for (int j = 0; j < kMaxElementsPerLane; ++j) {
        const int e = lane + 32 * j;
        if (e < head_dim)
          out[e] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(x[j], inverse), __NV_SATFINITE, __NV_E4M3));
      }
      if (lane == 0) static_cast<float*>(scales)[scale_vec] = scale;
      return;
    }
    case KvQuant::kInt8: {
      float lo = INFINITY, hi = -INFINITY;
#pragma unroll
      for (int j = 0; j < kMaxElementsPerLane; ++j) {
        if (lane + 32 * j < head_dim) {
          lo = fminf(lo, x[j]);
          hi = fmaxf(hi, x[j]);
        }
      }
      const IntParams p = int_params(warp_min(lo), warp_max(hi), 255);
      uint8_t* out = static_cast<uint8_t*>(data) + vec * head_dim;
#pragma unroll
      for (int j = 0; j < kMaxElementsPerLane; ++j) {
        const int e = lane + 32 * j;
        if (e < head_dim) out[e] = static_cast<uint8_t>(int_code(x[j], p, 255));
      }
      if (lane == 0) static_cast<kernels::KvScaleZero*>(scales)[scale_vec] = p.record;
      return;
    }
    case KvQuant::kInt4: {
      // Group j is elements [32 j, 32 j + 32): register j of every lane.
      const int32_t groups = kernels::kv_scale_groups(head_dim, KvQuant::kInt4);
      uint8_t* out = static_cast<uint8_t*>(data) + vec * kernels::kv_head_data_bytes(head_dim, KvQuant::kInt4);
      auto* records = static_cast<kernels::KvScaleZero*>(scales) + scale_vec * groups;
#pragma unroll
      for (int j = 0; j < kMaxElementsPerLane; ++j) {
        if (j >= groups) break;
        const bool valid = lane + 32 * j < head_dim;
        const float lo = warp_min(valid ? x[j] : INFINITY);
        const float hi = warp_max(valid ? x[j] : -INFINITY);
        const IntParams p = int_params(lo, hi, 15);
        const uint32_t code = valid ? int_code(x[j], p, 15) : 0u;
        const uint32_t odd = __shfl_down_sync(0xffffffffu, code, 1);  // element 2i + 1 -> high nibble
        const int e = lane + 32 * j;
        if ((lane & 1) == 0 && e < head_dim) out[e / 2] = static_cast<uint8_t>(code | (odd << 4));
        if (lane == 0) records[j] = p.record;
      }
      return;
    }
  }
}

__device__ void write_vector(const bf16* __restrict__ row, int32_t head_dim, KvQuant format, float fp8_fixed_scale,
                             void* data, void* scales, int64_t vec, int64_t scale_vec, int lane) {
  if (format == KvQuant::kNone) {  // a bf16 copy (bit for bit, NaN payloads included)
    bf16* out = static_cast<bf16*>(data) + vec * head_dim;
    for (int e = lane; e < head_dim; e += 32) out[e] = row[e];
    return;
  }
  float x[kMaxElementsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < head_dim ? __bfloat162float(row[e]) : 0.0f;
  }
  write_values(x, head_dim, format, fp8_fixed_scale, data, scales, vec, scale_vec, lane);
}

// The (token, KV head) vector a warp of the quantized and shared write kernels writes: its row t, its
// vector index in the pool, its scale record and its column in the k/v rows; false when the warp has no
// vector (past the last pair) or the token's slot is -1 (not written).
struct WarpVector {
  int64_t t, vec, scale_vec, column;
};

__device__ __forceinline__ bool locate_warp_vector(const int64_t* __restrict__ slots, int32_t num_tokens,
                                                   const DevicePagedKvLayer& layer, WarpVector& out) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // (token, head)
  if (pair >= static_cast<int64_t>(num_tokens) * layer.num_kv_heads) return false;
  out.t = pair / layer.num_kv_heads;
  const int32_t head = static_cast<int32_t>(pair % layer.num_kv_heads);
  const int64_t slot = slots[out.t];
  if (slot < 0) return false;
  out.vec = slot * layer.num_kv_heads + head;
  out.scale_vec = kernels::kv_scale_vector(slot, head, layer.block_size, layer.num_kv_heads);
  out.column = static_cast<int64_t>(head) * layer.head_dim;
  return true;
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    kv_write_quantized_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t row_stride,
                              const int64_t* __restrict__ slots, int32_t num_tokens, DevicePagedKvLayer layer,
                              KvWriteFixedScales fixed_scales) {
  pdl_wait();  // launched programmatically (pdl.cuh): k and v come from the kernel ahead
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  WarpVector w;
  if (!locate_warp_vector(slots, num_tokens, layer, w)) return;
  const int64_t t = w.t, vec = w.vec, scale_vec = w.scale_vec, column = w.column;
  write_vector(k + t * row_stride + column, layer.head_dim, layer.key_dtype, fixed_scales.key, layer.key,
               layer.key_scale, vec, scale_vec, lane);
  write_vector(v + t * row_stride + column, layer.head_dim, layer.value_dtype, fixed_scales.value, layer.value,
               layer.value_scale, vec, scale_vec, lane);
}

// rope_qk + kv_write in one launch (rope_kv_write.h): one warp per (token, head) over the q heads then the
// kv heads. Lane i owns the head's elements e = i, i + 32, ... (the quantized write's layout) and computes
// each as rope_kernel does (element e < half is the first of pair e, else the second of pair e - half; both
// through rope_pair, from the unrotated values), so the rotated vector stays in registers: written back in
// place (q heads also to q_out), then a kv head's rotated k and its v go to the pool through write_values /
// write_vector, the quantized kernel's arithmetic, so the pool holds what kv_write would write.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rope_qk_kv_write_kernel(bf16* __restrict__ qkv, int64_t row_stride, const int32_t* __restrict__ positions,
                            const int64_t* __restrict__ slots, int32_t num_tokens, int32_t num_q_heads,
                            const float* __restrict__ inv_freq, bf16* __restrict__ q_out, DevicePagedKvLayer layer,
                            KvWriteFixedScales fixed_scales) {
  const int lane = threadIdx.x % 32;
  const int32_t heads = num_q_heads + layer.num_kv_heads, head_dim = layer.head_dim, half = head_dim / 2;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // (token, head)
  const bool active = item < static_cast<int64_t>(num_tokens) * heads;
  const int64_t t = active ? item / heads : 0;
  const int32_t h = active ? static_cast<int32_t>(item % heads) : 0;
  // Positions and frequencies are the step's inputs: the angles are computed before the PDL wait, as rope's.
  float sn[kMaxElementsPerLane], cs[kMaxElementsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) {
    const int e = lane + 32 * j;
    sn[j] = 0.0f;
    cs[j] = 1.0f;
    if (active && e < head_dim) {
      const int pair = e < half ? e : e - half;
      sincosf(static_cast<float>(positions[t]) * inv_freq[pair], &sn[j], &cs[j]);
    }
  }
  pdl_wait();  // launched programmatically (pdl.cuh): qkv comes from the kernel ahead
  pdl_launch_dependents();
  if (!active) return;  // uniform across the warp
  bf16* x = qkv + t * row_stride + static_cast<int64_t>(h) * head_dim;
  float r[kMaxElementsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) {
    const int e = lane + 32 * j;
    r[j] = 0.0f;
    if (e >= head_dim) continue;
    const int pair = e < half ? e : e - half;
    bf16 lo, hi;
    rope_pair(__bfloat162float(x[pair]), __bfloat162float(x[pair + half]), sn[j], cs[j], lo, hi);
    r[j] = __bfloat162float(e < half ? lo : hi);
  }
  __syncwarp();  // every lane has read the unrotated head before any lane overwrites it
  bf16* o = (q_out != nullptr && h < num_q_heads) ? q_out + (t * num_q_heads + h) * head_dim : nullptr;
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e >= head_dim) continue;
    x[e] = __float2bfloat16(r[j]);
    if (o != nullptr) o[e] = __float2bfloat16(r[j]);
  }
  if (h < num_q_heads) return;
  const int32_t head = h - num_q_heads;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t vec = slot * layer.num_kv_heads + head;
  const int64_t scale_vec = kernels::kv_scale_vector(slot, head, layer.block_size, layer.num_kv_heads);
  write_values(r, head_dim, layer.key_dtype, fixed_scales.key, layer.key, layer.key_scale, vec, scale_vec, lane);
  const bf16* v = qkv + t * row_stride + static_cast<int64_t>(num_q_heads + layer.num_kv_heads + head) * head_dim;
  write_vector(v, head_dim, layer.value_dtype, fixed_scales.value, layer.value, layer.value_scale, vec, scale_vec,
               lane);
}

// Cross-layer sharing (kv_share_ops.h): one warp per (token, kv head, K or V)
// vector, lane i holding elements i, i + 32, ... as above. The sums of squares
// are in f64 as the CPU's write_shared; products and sums are explicitly
// rounded so that no contraction changes them.
__device__ __forceinline__ double warp_sum_f64(double x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Merges one member's vector (row of head_dim bf16) into the stored direction
// at vector `vec` (format kNone: bf16, or fp8 with a per-vector scale) and its
// norm record `rec` (record floats: member norms, then the sum length).
__device__ void merge_vector(const bf16* __restrict__ row, int32_t head_dim, KvQuant format, void* data,
                             void* scales, int64_t vec, int64_t scale_vec, float* rec, int32_t record,
                             int32_t member, int lane) {
  float x[kMaxElementsPerLane];
  double norm2 = 0.0;
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < head_dim ? __bfloat162float(row[e]) : 0.0f;
    norm2 += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  }
  const float norm = static_cast<float>(sqrt(warp_sum_f64(norm2)));
  const float inv_norm = norm > 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
  bf16* out_bf16 = static_cast<bf16*>(data) + vec * head_dim;
  uint8_t* out_fp8 = static_cast<uint8_t*>(data) + vec * head_dim;
  float m[kMaxElementsPerLane];
  if (member > 0) {  // uniform across the warp (a kernel argument)
    const float length = rec[record - 1];
    const float stored_scale = format == KvQuant::kFP8E4M3 ? static_cast<const float*>(scales)[scale_vec] : 1.0f;
#pragma unroll
    for (int j = 0; j < kMaxElementsPerLane; ++j) {
      const int e = lane + 32 * j;
      float d = 0.0f;
      if (e < head_dim) {
        if (format == KvQuant::kNone) {
          d = __bfloat162float(out_bf16[e]);
        } else {
          const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(out_fp8[e]), __NV_E4M3);
          d = __fmul_rn(__half2float(__half(h)), stored_scale);
        }
      }
      m[j] = __fadd_rn(__fmul_rn(d, length), __fmul_rn(x[j], inv_norm));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kMaxElementsPerLane; ++j) m[j] = __fmul_rn(x[j], inv_norm);
  }
  double sum2 = 0.0;
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) sum2 += static_cast<double>(m[j]) * static_cast<double>(m[j]);
  const float length = static_cast<float>(sqrt(warp_sum_f64(sum2)));
  const float inv_length = length > 0.0f ? __fdiv_rn(1.0f, length) : 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxElementsPerLane; ++j) m[j] = __fmul_rn(m[j], inv_length);
  __syncwarp();  // every lane has read the stored direction, scale and length before any is overwritten
  if (format == KvQuant::kNone) {
#pragma unroll
    for (int j = 0; j < kMaxElementsPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < head_dim) out_bf16[e] = __float2bfloat16_rn(m[j]);
    }
  } else {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxElementsPerLane; ++j) amax = fmaxf(amax, fabsf(m[j]));  // padding is 0
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? __fdiv_rn(amax, kernels::kKvFp8Max) : 1.0f;
    const float inverse = __fdiv_rn(1.0f, scale);
#pragma unroll
    for (int j = 0; j < kMaxElementsPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < head_dim)
        out_fp8[e] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(m[j], inverse), __NV_SATFINITE, __NV_E4M3));
    }
    if (lane == 0) static_cast<float*>(scales)[scale_vec] = scale;
  }
  if (lane == 0) {
    rec[member] = norm;
    rec[record - 1] = length;
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    kv_write_shared_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t row_stride,
                           const int64_t* __restrict__ slots, int32_t num_tokens, DevicePagedKvLayer layer,
                           DeviceKvShare share) {
  pdl_wait();  // launched programmatically (pdl.cuh): k and v come from the kernel ahead
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  WarpVector w;
  if (!locate_warp_vector(slots, num_tokens, layer, w)) return;
  const int64_t t = w.t, vec = w.vec, scale_vec = w.scale_vec, column = w.column;
  float* records = share.norms + vec * 2 * share.record;
  merge_vector(k + t * row_stride + column, layer.head_dim, layer.key_dtype, layer.key, layer.key_scale, vec,
               scale_vec, records, share.record, share.member, lane);
  merge_vector(v + t * row_stride + column, layer.head_dim, layer.value_dtype, layer.value, layer.value_scale, vec,
               scale_vec, records + share.record, share.record, share.member, lane);
}

// 0 means "per-vector"; a negative, NaN or infinite scale is a caller's bug.
bool valid_fixed_scale(float scale) { return std::isfinite(scale) && scale >= 0.0f; }

}  // namespace

cudaError_t kv_write(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots, int32_t num_tokens,
                     const DevicePagedKvLayer& layer, cudaStream_t stream) {
  return kv_write(k, v, row_stride, slots, num_tokens, layer, KvWriteFixedScales{}, stream);
}

cudaError_t kv_write(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots, int32_t num_tokens,
                     const DevicePagedKvLayer& layer, KvWriteFixedScales fixed_scales, cudaStream_t stream) {
  if (layer.head_dim % 8 != 0 || row_stride % 8 != 0) return cudaErrorInvalidValue;
  if (!valid_fixed_scale(fixed_scales.key) || !valid_fixed_scale(fixed_scales.value)) return cudaErrorInvalidValue;
  if (layer.key_dtype == KvQuant::kNone && layer.value_dtype == KvQuant::kNone) {
    const int64_t n = static_cast<int64_t>(num_tokens) * layer.num_kv_heads * layer.head_dim / 8;
    if (n == 0) return cudaSuccess;
    return launch_pdl(kv_write_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, k, v,
                      row_stride, slots, num_tokens, static_cast<bf16*>(layer.key), static_cast<bf16*>(layer.value),
                      layer.num_kv_heads, layer.head_dim);
  }
  if (layer.head_dim > 32 * kMaxElementsPerLane) return cudaErrorInvalidValue;
  if ((layer.key_dtype != KvQuant::kNone && layer.key_scale == nullptr) ||
      (layer.value_dtype != KvQuant::kNone && layer.value_scale == nullptr))
    return cudaErrorInvalidValue;
  const int64_t pairs = static_cast<int64_t>(num_tokens) * layer.num_kv_heads;
  if (pairs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((pairs + kWarpsPerBlock - 1) / kWarpsPerBlock));
  return launch_pdl(kv_write_quantized_kernel, grid, dim3(kWarpsPerBlock * 32), 0, stream, k, v, row_stride, slots,
                    num_tokens, layer, fixed_scales);
}

cudaError_t rope_qk_kv_write(bf16* qkv, int64_t row_stride, const int32_t* positions, const int64_t* slots,
                             int32_t num_tokens, int32_t num_q_heads, const float* inv_freq, bf16* q_out,
                             const DevicePagedKvLayer& layer, KvWriteFixedScales fixed_scales, cudaStream_t stream) {
  if (num_q_heads < 0 || layer.num_kv_heads <= 0 || layer.head_dim % 8 != 0 ||
      layer.head_dim > 32 * kMaxElementsPerLane || row_stride % 8 != 0)
    return cudaErrorInvalidValue;
  if (!valid_fixed_scale(fixed_scales.key) || !valid_fixed_scale(fixed_scales.value)) return cudaErrorInvalidValue;
  if ((layer.key_dtype != KvQuant::kNone && layer.key_scale == nullptr) ||
      (layer.value_dtype != KvQuant::kNone && layer.value_scale == nullptr))
    return cudaErrorInvalidValue;
  const int64_t items = static_cast<int64_t>(num_tokens) * (num_q_heads + layer.num_kv_heads);
  if (items == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
  return launch_pdl(rope_qk_kv_write_kernel, grid, dim3(kWarpsPerBlock * 32), 0, stream, qkv, row_stride, positions,
                    slots, num_tokens, num_q_heads, inv_freq, q_out, layer, fixed_scales);
}

cudaError_t kv_write_shared(const bf16* k, const bf16* v, int64_t row_stride, const int64_t* slots,
                            int32_t num_tokens, const DevicePagedKvLayer& layer, const DeviceKvShare& share,
                            cudaStream_t stream) {
  if (share.norms == nullptr || share.record < 3 || share.member < 0 || share.member >= share.record - 1)
    return cudaErrorInvalidValue;
  if (layer.head_dim % 8 != 0 || layer.head_dim > 32 * kMaxElementsPerLane || row_stride % 8 != 0)
    return cudaErrorInvalidValue;
  for (const KvQuant q : {layer.key_dtype, layer.value_dtype})
    if (q != KvQuant::kNone && q != KvQuant::kFP8E4M3) return cudaErrorInvalidValue;
  if ((layer.key_dtype != KvQuant::kNone && layer.key_scale == nullptr) ||
      (layer.value_dtype != KvQuant::kNone && layer.value_scale == nullptr))
    return cudaErrorInvalidValue;
  const int64_t pairs = static_cast<int64_t>(num_tokens) * layer.num_kv_heads;
  if (pairs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((pairs + kWarpsPerBlock - 1) / kWarpsPerBlock));
  return launch_pdl(kv_write_shared_kernel, grid, dim3(kWarpsPerBlock * 32), 0, stream, k, v, row_stride, slots,
                    num_tokens, layer, share);
}

}  // namespace pagoda::cuda
