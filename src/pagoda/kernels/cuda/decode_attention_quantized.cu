// Decode attention over a quantized paged cache (fp8 e4m3, int8, int4 codes
// with per-vector or per-group scale records, kernels/kv_quant.h), dequantized
// in registers. The structure is decode_attention.cu's (one CTA = one split x
// q_heads_per_cta query heads of a GQA group; 4 warps, each with a private
// 3-stage cp.async pipeline; split-K merged by the same merge pass), with
// these differences:
//  - a lane owns 16 consecutive elements [16 sub, 16 sub + 16) of head_dim, so
//    its codes are one 16-byte shared load (fp8 / int8) or 8 bytes (int4) and
//    an int4 lane never straddles a group of 32;
//  - a warp tile is 8 steps of tokens (32 tokens at head_dim 128), so a stage
//    holds about as many bytes as the bf16 kernel's (8 KB of codes + scales);
//  - scales are folded out of the inner loops: score = s * (q . codes) + z * sum(q)
//    per lane (then reduced), and V adds (p s) * codes plus p z once per token.
// Every byte read from global memory goes through 16-byte cp.async for codes
// and one 4/8/16-byte cp.async per token-head for its scale records.
//
// fp8 and int8 pools (K and V alike) run on tensor cores instead (see the
// mma kernel below): the CUDA-core loop spends 8 FMAs per K + V element and
// 4 query heads, which made it compute-bound at about the bf16 kernel's
// tokens/s. int4 and K int8 / V int4 keep the CUDA-core loop.

#include <cuda_bf16.h>

#include "pagoda/kernels/cuda/attention_descriptor.h"
#include "pagoda/kernels/cuda/attention_launch_internal.h"
#include "pagoda/kernels/cuda/device_primitives.cuh"
#include "pagoda/kernels/cuda/kv_dequant.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

constexpr int kWarps = 4;
constexpr int kStages = 3;
constexpr int kStepsPerTile = 8;
constexpr float kNoScore = -1e30f;  // finite "minus infinity": keeps exp2 of differences NaN-free

constexpr int code_bytes(int head_dim, KvQuant q) { return q == KvQuant::kInt4 ? head_dim / 2 : head_dim; }
constexpr int scale_bytes(int head_dim, KvQuant q) { return q == KvQuant::kInt4 ? head_dim / 32 * 4 : 4; }

template <int kHeadDim, KvQuant KQ, KvQuant VQ>
struct QuantizedShape {
  static constexpr int kLanesPerToken = kHeadDim / 16;
  static constexpr int kTokensPerStep = 32 / kLanesPerToken;
  static constexpr int kTileTokens = kTokensPerStep * kStepsPerTile;
  static constexpr int kKeyBytes = code_bytes(kHeadDim, KQ);  // per token (one head)
  static constexpr int kValueBytes = code_bytes(kHeadDim, VQ);
  static constexpr int kKeyScaleBytes = scale_bytes(kHeadDim, KQ);
  static constexpr int kValueScaleBytes = scale_bytes(kHeadDim, VQ);
  static constexpr int kKeyCopies = kTileTokens * kKeyBytes / 16 / 32;  // 16-byte copies per lane
  static constexpr int kValueCopies = kTileTokens * kValueBytes / 16 / 32;
  // Stage layout (bytes): K codes, V codes, K scales, V scales.
  static constexpr int kValueAt = kTileTokens * kKeyBytes;
  static constexpr int kKeyScaleAt = kValueAt + kTileTokens * kValueBytes;
  static constexpr int kValueScaleAt = kKeyScaleAt + kTileTokens * kKeyScaleBytes;
  static constexpr int kStageBytes = kValueScaleAt + kTileTokens * kValueScaleBytes;
  static_assert(kKeyCopies * 32 * 16 == kTileTokens * kKeyBytes, "whole 16-byte copies per lane");
  static_assert(kValueCopies * 32 * 16 == kTileTokens * kValueBytes, "whole 16-byte copies per lane");
  static_assert(kStageBytes % 16 == 0, "stages stay 16-byte aligned");
};

// cp.async of 4, 8 or 16 bytes through L1 (scale records); zero-fills when !valid.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "n"(kBytes), "r"(valid ? kBytes : 0));
}

// The 16 codes of one lane (elements [16 sub, 16 sub + 16)) as floats, and its scale.
template <int kHeadDim, KvQuant Q>
__device__ __forceinline__ KvScale lane_codes(const uint8_t* codes, const uint8_t* scales, int sub, float* f) {
  if constexpr (Q == KvQuant::kInt4) {
    const uint2 w = *reinterpret_cast<const uint2*>(codes + sub * 8);
    u4x8_to_float(w.x, f);
    u4x8_to_float(w.y, f + 8);
    return decode_scale_record(*reinterpret_cast<const uint32_t*>(scales + (sub / 2) * 4), Q);
  } else {
    const uint4 w = *reinterpret_cast<const uint4*>(codes + sub * 16);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (Q == KvQuant::kFP8E4M3) fp8x4_to_float(words[i], f + 4 * i);
      else u8x4_to_float(words[i], f + 4 * i);
    }
    return decode_scale_record(*reinterpret_cast<const uint32_t*>(scales), Q);
  }
}

template <int kHeadDim, int kHeads, KvQuant KQ, KvQuant VQ>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_quantized_kernel(const AttentionDescriptor d, const __nv_bfloat16* __restrict__ q,
                                      __nv_bfloat16* __restrict__ out) {
  using S = QuantizedShape<kHeadDim, KQ, VQ>;
  extern __shared__ uint4 smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = lane / S::kLanesPerToken;
  const int sub = lane % S::kLanesPerToken;

  const int item = blockIdx.y;
  const int sequence = d.work_items[3 * item];
  if (sequence < 0) return;  // unused item of a graph-mode plan
  const int kv_begin = d.work_items[3 * item + 1];
  const int kv_end = d.work_items[3 * item + 2];
  const int q_head0 = blockIdx.x * kHeads;
  const int kv_head = q_head0 / (d.num_q_heads / d.num_kv_heads);
  const int token = d.query_start[sequence];
  const int32_t* table = d.block_tables + d.block_table_start[sequence];
  const auto* key = static_cast<const uint8_t*>(d.key);
  const auto* value = static_cast<const uint8_t*>(d.value);
  const auto* key_scale = static_cast<const uint8_t*>(d.key_scale);
  const auto* value_scale = static_cast<const uint8_t*>(d.value_scale);

  // Query elements [16 sub, 16 sub + 16), pre-scaled so scores come out in log2 units.
  float qf[kHeads][16], qsum[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const uint4* row = reinterpret_cast<const uint4*>(
        q + (int64_t{token} * d.num_q_heads + q_head0 + h) * kHeadDim);
    bf16x8_to_float(row[2 * sub], qf[h]);
    bf16x8_to_float(row[2 * sub + 1], qf[h] + 8);
    qsum[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      qf[h][e] *= d.scale_log2;
      qsum[h] += qf[h][e];
    }
  }

  float m[kHeads], l[kHeads], acc[kHeads][16], zero_acc[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = kNoScore;
    l[h] = 0.0f;
    zero_acc[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[h][e] = 0.0f;
  }

  uint8_t* warp_smem = reinterpret_cast<uint8_t*>(smem) + warp * kStages * S::kStageBytes;
  const int num_tiles = (kv_end - kv_begin + S::kTileTokens - 1) / S::kTileTokens;
  const int my_tiles = warp < num_tiles ? (num_tiles - warp + kWarps - 1) / kWarps : 0;

  // Vector index (kv_quant.h) of position pos, or of block 0 when pos is past the end.
  auto vector_at = [&](int pos, bool valid) {
    const int block = valid ? table[pos >> d.log2_block_size] : 0;
    return (int64_t{block} * d.block_size + (pos & (d.block_size - 1))) * d.num_kv_heads + kv_head;
  };
  auto issue_tile = [&](int my_index) {
    uint8_t* stage = warp_smem + (my_index % kStages) * S::kStageBytes;
    const int pos0 = kv_begin + (warp + my_index * kWarps) * S::kTileTokens;
#pragma unroll
    for (int k = 0; k < S::kKeyCopies; ++k) {
      const int idx = lane + 32 * k;
      const int t = idx / (S::kKeyBytes / 16), c = idx % (S::kKeyBytes / 16);
      const bool valid = pos0 + t < kv_end;
      const int64_t vec = vector_at(pos0 + t, valid);
      cp_async_16(stage + t * S::kKeyBytes + c * 16, key + vec * S::kKeyBytes + c * 16, valid);
    }
#pragma unroll
    for (int k = 0; k < S::kValueCopies; ++k) {
      const int idx = lane + 32 * k;
      const int t = idx / (S::kValueBytes / 16), c = idx % (S::kValueBytes / 16);
      const bool valid = pos0 + t < kv_end;
      const int64_t vec = vector_at(pos0 + t, valid);
      cp_async_16(stage + S::kValueAt + t * S::kValueBytes + c * 16, value + vec * S::kValueBytes + c * 16, valid);
    }
#pragma unroll
    for (int t = lane; t < S::kTileTokens; t += 32) {
      const bool valid = pos0 + t < kv_end;
      const int64_t vec = vector_at(pos0 + t, valid);
      cp_async_ca<S::kKeyScaleBytes>(stage + S::kKeyScaleAt + t * S::kKeyScaleBytes,
                                     key_scale + vec * S::kKeyScaleBytes, valid);
      cp_async_ca<S::kValueScaleBytes>(stage + S::kValueScaleAt + t * S::kValueScaleBytes,
                                       value_scale + vec * S::kValueScaleBytes, valid);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_tiles) issue_tile(s);
    cp_async_commit();
  }

  for (int i = 0; i < my_tiles; ++i) {
    if (i + kStages - 1 < my_tiles) issue_tile(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();

    const uint8_t* stage = warp_smem + (i % kStages) * S::kStageBytes;
    const int pos0 = kv_begin + (warp + i * kWarps) * S::kTileTokens;

    float s[kStepsPerTile][kHeads];
#pragma unroll
    for (int u = 0; u < kStepsPerTile; ++u) {
      const int t = group + u * S::kTokensPerStep;
      float kf[16];
      const KvScale ks = lane_codes<kHeadDim, KQ>(stage + t * S::kKeyBytes,
                                                  stage + S::kKeyScaleAt + t * S::kKeyScaleBytes, sub, kf);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; ++e) dot = fmaf(qf[h][e], kf[e], dot);
        s[u][h] = KQ == KvQuant::kFP8E4M3 ? dot * ks.scale : fmaf(dot, ks.scale, ks.zero * qsum[h]);
      }
    }
#pragma unroll
    for (int offset = S::kLanesPerToken / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int u = 0; u < kStepsPerTile; ++u)
#pragma unroll
        for (int h = 0; h < kHeads; ++h) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], offset);
    }
#pragma unroll
    for (int u = 0; u < kStepsPerTile; ++u) {
      if (pos0 + group + u * S::kTokensPerStep >= kv_end) {
#pragma unroll
        for (int h = 0; h < kHeads; ++h) s[u][h] = -INFINITY;
      }
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float tile_max = s[0][h];
#pragma unroll
      for (int u = 1; u < kStepsPerTile; ++u) tile_max = fmaxf(tile_max, s[u][h]);
      const float m_new = fmaxf(m[h], tile_max);
      const float correction = exp2f(m[h] - m_new);
      m[h] = m_new;
      l[h] *= correction;
      zero_acc[h] *= correction;
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[h][e] *= correction;
#pragma unroll
      for (int u = 0; u < kStepsPerTile; ++u) {
        s[u][h] = exp2f(s[u][h] - m_new);  // now a probability weight
        l[h] += s[u][h];
      }
    }
#pragma unroll
    for (int u = 0; u < kStepsPerTile; ++u) {
      const int t = group + u * S::kTokensPerStep;
      float vf[16];
      const KvScale vs = lane_codes<kHeadDim, VQ>(stage + S::kValueAt + t * S::kValueBytes,
                                                  stage + S::kValueScaleAt + t * S::kValueScaleBytes, sub, vf);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        const float weight = s[u][h] * vs.scale;
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[h][e] = fmaf(weight, vf[e], acc[h][e]);
        if constexpr (VQ != KvQuant::kFP8E4M3) zero_acc[h] = fmaf(s[u][h], vs.zero, zero_acc[h]);
      }
    }
    __syncwarp();
  }
  if constexpr (VQ != KvQuant::kFP8E4M3) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h)
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[h][e] += zero_acc[h];
  }

  // Merge the lane groups of this warp (all hold the same elements).
#pragma unroll
  for (int offset = S::kLanesPerToken; offset < 32; offset *= 2) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[h], offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[h], offset);
      const float m_new = fmaxf(m[h], m_other);
      const float mine = exp2f(m[h] - m_new);
      const float theirs = exp2f(m_other - m_new);
      m[h] = m_new;
      l[h] = l[h] * mine + l_other * theirs;
#pragma unroll
      for (int e = 0; e < 16; ++e)
        acc[h][e] = acc[h][e] * mine + __shfl_xor_sync(0xffffffffu, acc[h][e], offset) * theirs;
    }
  }

  // Merge the warps through shared memory (the stages are free now).
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  float* red_m = red;                        // [warps][heads]
  float* red_l = red_m + kWarps * kHeads;    // [warps][heads]
  float* red_acc = red_l + kWarps * kHeads;  // [warps][heads][head_dim]
  if (group == 0) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float* dst = red_acc + (warp * kHeads + h) * kHeadDim + sub * 16;
#pragma unroll
      for (int e = 0; e < 16; ++e) dst[e] = acc[h][e];
      if (sub == 0) {
        red_m[warp * kHeads + h] = m[h];
        red_l[warp * kHeads + h] = l[h];
      }
    }
  }
  __syncthreads();

  const bool split = d.split_start[sequence + 1] - d.split_start[sequence] > 1;
  float* partial_o = d.workspace;
  float* partial_lse = d.workspace + int64_t{d.num_work_items} * d.num_q_heads * kHeadDim;
  for (int idx = threadIdx.x; idx < kHeads * kHeadDim; idx += blockDim.x) {
    const int h = idx / kHeadDim;
    const int col = idx % kHeadDim;
    float m_all = kNoScore;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, red_m[w * kHeads + h]);
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(red_m[w * kHeads + h] - m_all);
      sum += red_l[w * kHeads + h] * weight;
      o += red_acc[(w * kHeads + h) * kHeadDim + col] * weight;
    }
    const int q_head = q_head0 + h;
    if (!split) {
      // sum == 0 only for an empty range (a graph bucket's padding row): zeros.
      out[(int64_t{token} * d.num_q_heads + q_head) * kHeadDim + col] = __float2bfloat16(sum > 0.0f ? o / sum : 0.0f);
    } else {
      partial_o[(int64_t{item} * d.num_q_heads + q_head) * kHeadDim + col] = o / sum;
      if (col == 0) partial_lse[int64_t{item} * d.num_q_heads + q_head] = m_all + log2f(sum);
    }
  }
}

// ---------------------------------------------------------------------------
// Tensor-core variant (fp8 or int8 K and V, one scale record per vector): the
// codes become f16 exactly (fp8 e4m3 through the hardware conversion, 0..255
// through a 1024 + code bit pattern), so q.k and p.v run on mma.sync
// m16n8k16 (f16 in, f32 accumulate) instead of 8 CUDA-core FMAs per element,
// and the per-token scales stay outside the products:
//   S^T[head, token] = Q[head, :] . codes[token, :]  -> * k_scale + k_zero * sum(q)
//   O^T[dim, head]  += codes^T[dim, token] . (p * v_scale / U)[token, head]
// where U is the largest v_scale of the tile (p v_scale / U stays in [0, 1],
// clear of f16 subnormals); the accumulator carries U and is rescaled, with the
// online-softmax correction, from tile to tile. Lane (g = lane / 4, t = lane % 4)
// of the m16n8k16 layouts: for S it owns head g and the token columns 2t, 2t + 1
// of each 8-token n-tile, and the K dims [t D/4, t D/4 + D/4) (dims are a free
// permutation of the k index, so its codes are contiguous); for O it owns dims
// {D/16 g + i, D/16 (g + 8) + i} of m-tile i and heads 2t, 2t + 1.
// ---------------------------------------------------------------------------

__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four codes (bytes 0..3 of w) -> two f16x2 registers: (code0, code1), (code2, code3), exact.
template <KvQuant Q>
__device__ __forceinline__ void codes4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (Q == KvQuant::kFP8E4M3) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
    lo = uint32_t{a.x} | (uint32_t{a.y} << 16);
    hi = uint32_t{b.x} | (uint32_t{b.y} << 16);
  } else {
    // 0x64XX is the f16 1024 + XX; subtracting 1024 is exact.
    const __half2 magic = __half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400));
    __half2 a = __hsub2(*reinterpret_cast<const __half2*>(&(lo = __byte_perm(w, 0x6464u, 0x5140))), magic);
    __half2 b = __hsub2(*reinterpret_cast<const __half2*>(&(hi = __byte_perm(w, 0x6464u, 0x5342))), magic);
    lo = *reinterpret_cast<uint32_t*>(&a);
    hi = *reinterpret_cast<uint32_t*>(&b);
  }
}

template <int kHeadDim, int kHeads, KvQuant Q>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_mma_kernel(const AttentionDescriptor d, const __nv_bfloat16* __restrict__ q,
                                __nv_bfloat16* __restrict__ out) {
  using S = QuantizedShape<kHeadDim, Q, Q>;
  constexpr int kNTiles = S::kTileTokens / 8;   // 8-token column tiles of S
  constexpr int kSlices = kHeadDim / 16;        // 16-dim k slices of S = 16-dim m tiles of O
  constexpr int kLaneDims = kHeadDim / 4;       // K codes per lane and token
  constexpr int kChunk = kHeadDim / 16;         // V codes per lane, token and row half
  static_assert(kHeads <= 8, "query heads are rows 0..7 of the m16 tiles");
  extern __shared__ uint4 smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  const int item = blockIdx.y;
  const int sequence = d.work_items[3 * item];
  if (sequence < 0) return;  // unused item of a graph-mode plan
  const int kv_begin = d.work_items[3 * item + 1];
  const int kv_end = d.work_items[3 * item + 2];
  const int q_head0 = blockIdx.x * kHeads;
  const int kv_head = q_head0 / (d.num_q_heads / d.num_kv_heads);
  const int token = d.query_start[sequence];
  const int32_t* table = d.block_tables + d.block_table_start[sequence];
  const auto* key = static_cast<const uint8_t*>(d.key);
  const auto* value = static_cast<const uint8_t*>(d.value);
  const auto* key_scale = static_cast<const uint8_t*>(d.key_scale);
  const auto* value_scale = static_cast<const uint8_t*>(d.value_scale);

  // A fragments of Q (rows = heads; rows 8..15 and heads past kHeads are zero),
  // pre-scaled to log2 units and rounded to f16, and sum(q) of the rounded values.
  uint32_t qa[kSlices][2];
  float qsum = 0.0f;
  {
    const bool real_head = g < kHeads;
    const __nv_bfloat16* row =
        q + (int64_t{token} * d.num_q_heads + q_head0 + (real_head ? g : 0)) * kHeadDim + t * kLaneDims;
#pragma unroll
    for (int j = 0; j < kSlices; ++j) {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + 4 * j);
      const float2 f01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 f23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      __half2 h01 = __floats2half2_rn(f01.x * d.scale_log2, f01.y * d.scale_log2);
      __half2 h23 = __floats2half2_rn(f23.x * d.scale_log2, f23.y * d.scale_log2);
      if (!real_head) h01 = h23 = __float2half2_rn(0.0f);
      const float2 r01 = __half22float2(h01), r23 = __half22float2(h23);
      qsum += (r01.x + r01.y) + (r23.x + r23.y);
      qa[j][0] = *reinterpret_cast<uint32_t*>(&h01);
      qa[j][1] = *reinterpret_cast<uint32_t*>(&h23);
    }
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
  }

  float m = kNoScore, l = 0.0f, zero_sum = 0.0f;  // head g (l, zero_sum: this lane's tokens)
  float unit = 1.0f;                              // acc * unit is the value (U above)
  float acc[kSlices][4];
#pragma unroll
  for (int i = 0; i < kSlices; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

  uint8_t* warp_smem = reinterpret_cast<uint8_t*>(smem) + warp * kStages * S::kStageBytes;
  const int num_tiles = (kv_end - kv_begin + S::kTileTokens - 1) / S::kTileTokens;
  const int my_tiles = warp < num_tiles ? (num_tiles - warp + kWarps - 1) / kWarps : 0;

  auto vector_at = [&](int pos, bool valid) {
    const int block = valid ? table[pos >> d.log2_block_size] : 0;
    return (int64_t{block} * d.block_size + (pos & (d.block_size - 1))) * d.num_kv_heads + kv_head;
  };
  auto issue_tile = [&](int my_index) {
    uint8_t* stage = warp_smem + (my_index % kStages) * S::kStageBytes;
    const int pos0 = kv_begin + (warp + my_index * kWarps) * S::kTileTokens;
#pragma unroll
    for (int k = 0; k < S::kKeyCopies; ++k) {
      const int idx = lane + 32 * k;
      const int tk = idx / (S::kKeyBytes / 16), c = idx % (S::kKeyBytes / 16);
      const bool valid = pos0 + tk < kv_end;
      const int64_t vec = vector_at(pos0 + tk, valid);
      cp_async_16(stage + tk * S::kKeyBytes + c * 16, key + vec * S::kKeyBytes + c * 16, valid);
      cp_async_16(stage + S::kValueAt + tk * S::kValueBytes + c * 16, value + vec * S::kValueBytes + c * 16, valid);
    }
#pragma unroll
    for (int tk = lane; tk < S::kTileTokens; tk += 32) {
      const bool valid = pos0 + tk < kv_end;
      const int64_t vec = vector_at(pos0 + tk, valid);
      cp_async_ca<4>(stage + S::kKeyScaleAt + tk * 4, key_scale + vec * 4, valid);
      cp_async_ca<4>(stage + S::kValueScaleAt + tk * 4, value_scale + vec * 4, valid);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_tiles) issue_tile(s);
    cp_async_commit();
  }

  for (int i = 0; i < my_tiles; ++i) {
    if (i + kStages - 1 < my_tiles) issue_tile(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();

    const uint8_t* stage = warp_smem + (i % kStages) * S::kStageBytes;
    const int pos0 = kv_begin + (warp + i * kWarps) * S::kTileTokens;

    // Scores of head g for tokens 8 n + 2t + e.
    float s[kNTiles][2];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const uint4* codes = reinterpret_cast<const uint4*>(stage + (8 * n + g) * S::kKeyBytes + t * kLaneDims);
      uint32_t w[kLaneDims / 4];
#pragma unroll
      for (int c = 0; c < kLaneDims / 16; ++c) {
        const uint4 v = codes[c];
        w[4 * c] = v.x;
        w[4 * c + 1] = v.y;
        w[4 * c + 2] = v.z;
        w[4 * c + 3] = v.w;
      }
      float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kSlices; ++j) {
        uint32_t b0, b1;
        codes4_to_f16x2<Q>(w[j], b0, b1);
        mma_f16_16816(c4, qa[j][0], 0u, qa[j][1], 0u, b0, b1);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tk = 8 * n + 2 * t + e;
        const KvScale ks = decode_scale_record(*reinterpret_cast<const uint32_t*>(stage + S::kKeyScaleAt + 4 * tk), Q);
        const float score = Q == KvQuant::kFP8E4M3 ? c4[e] * ks.scale : fmaf(c4[e], ks.scale, ks.zero * qsum);
        s[n][e] = pos0 + tk < kv_end ? score : -INFINITY;
      }
    }
    float tile_max = s[0][0];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][0], s[n][1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    const float correction = exp2f(m - m_new);
    m = m_new;

    // Probabilities, the V scales of this lane's tokens, the tile's unit.
    float p[kNTiles][2], v_scale[kNTiles][2];
    float sum = 0.0f, zeros = 0.0f, v_max = 0.0f;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tk = 8 * n + 2 * t + e;
        const KvScale vs =
            decode_scale_record(*reinterpret_cast<const uint32_t*>(stage + S::kValueScaleAt + 4 * tk), Q);
        p[n][e] = exp2f(s[n][e] - m_new);  // 0 past the end
        sum += p[n][e];
        if constexpr (Q != KvQuant::kFP8E4M3) zeros = fmaf(p[n][e], vs.zero, zeros);
        v_scale[n][e] = vs.scale;
        v_max = fmaxf(v_max, vs.scale);  // records past the end are zero
      }
    }
    l = l * correction + sum;
    zero_sum = zero_sum * correction + zeros;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) v_max = fmaxf(v_max, __shfl_xor_sync(0xffffffffu, v_max, offset));
    if (!(v_max > 0.0f)) v_max = 1.0f;
    const float inverse_unit = 1.0f / v_max;
    const float rescale = correction * unit * inverse_unit;  // head g
    unit = v_max;
    const float rescale_even = __shfl_sync(0xffffffffu, rescale, 8 * t);     // head 2t
    const float rescale_odd = __shfl_sync(0xffffffffu, rescale, 8 * t + 4);  // head 2t + 1
#pragma unroll
    for (int m_tile = 0; m_tile < kSlices; ++m_tile) {
      acc[m_tile][0] *= rescale_even;
      acc[m_tile][1] *= rescale_odd;
      acc[m_tile][2] *= rescale_even;
      acc[m_tile][3] *= rescale_odd;
    }
    uint32_t pb[kNTiles];  // B fragments of P^T: (tokens 2t, 2t + 1 of n-tile n; head g)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      __half2 h = __floats2half2_rn(p[n][0] * v_scale[n][0] * inverse_unit, p[n][1] * v_scale[n][1] * inverse_unit);
      pb[n] = *reinterpret_cast<uint32_t*>(&h);
    }

    // O^T += V^T P^T, 16 tokens (n-tiles 2k, 2k + 1) at a time.
#pragma unroll
    for (int k = 0; k < kNTiles / 2; ++k) {
      // Tokens of k-columns 2t, 2t + 1 (n-tile 2k) and 2t + 8, 2t + 9 (n-tile 2k + 1).
      const int tokens[4] = {16 * k + 2 * t, 16 * k + 2 * t + 1, 16 * k + 8 + 2 * t, 16 * k + 9 + 2 * t};
      uint32_t lo[4][kChunk / 4], hi[4][kChunk / 4];  // dims kChunk g + ..., kChunk (g + 8) + ...
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint8_t* row = stage + S::kValueAt + tokens[r] * S::kValueBytes;
        if constexpr (kChunk == 8) {
          const uint2 a = *reinterpret_cast<const uint2*>(row + kChunk * g);
          const uint2 b = *reinterpret_cast<const uint2*>(row + kChunk * (g + 8));
          lo[r][0] = a.x;
          lo[r][1] = a.y;
          hi[r][0] = b.x;
          hi[r][1] = b.y;
        } else {
          lo[r][0] = *reinterpret_cast<const uint32_t*>(row + kChunk * g);
          hi[r][0] = *reinterpret_cast<const uint32_t*>(row + kChunk * (g + 8));
        }
      }
#pragma unroll
      for (int word = 0; word < kChunk / 4; ++word) {
        // a[x][dim]: x = 0 row g / tokens (0, 1); 1 row g + 8 / (0, 1); 2 row g / (2, 3); 3 row g + 8 / (2, 3).
        uint32_t a[4][4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const uint32_t(&src)[4][kChunk / 4] = (x & 1) ? hi : lo;
          const int r0 = (x & 2) ? 2 : 0;
          const uint32_t low_pairs = __byte_perm(src[r0][word], src[r0 + 1][word], 0x5140);   // dims 0, 1
          const uint32_t high_pairs = __byte_perm(src[r0][word], src[r0 + 1][word], 0x7362);  // dims 2, 3
          codes4_to_f16x2<Q>(low_pairs, a[x][0], a[x][1]);
          codes4_to_f16x2<Q>(high_pairs, a[x][2], a[x][3]);
        }
#pragma unroll
        for (int dim = 0; dim < 4; ++dim)
          mma_f16_16816(acc[4 * word + dim], a[0][dim], a[1][dim], a[2][dim], a[3][dim], pb[2 * k], pb[2 * k + 1]);
      }
    }
    __syncwarp();
  }

  // Sums over the four lanes of each head, then back to values (acc * unit + zeros).
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  zero_sum += __shfl_xor_sync(0xffffffffu, zero_sum, 1);
  zero_sum += __shfl_xor_sync(0xffffffffu, zero_sum, 2);
  const float zero_even = __shfl_sync(0xffffffffu, zero_sum, 8 * t);
  const float zero_odd = __shfl_sync(0xffffffffu, zero_sum, 8 * t + 4);

  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  float* red_m = red;                        // [warps][heads]
  float* red_l = red_m + kWarps * kHeads;    // [warps][heads]
  float* red_acc = red_l + kWarps * kHeads;  // [warps][heads][head_dim]
  if (t == 0 && g < kHeads) {
    red_m[warp * kHeads + g] = m;
    red_l[warp * kHeads + g] = l;
  }
#pragma unroll
  for (int m_tile = 0; m_tile < kSlices; ++m_tile) {
    const int dim_lo = kChunk * g + m_tile, dim_hi = kChunk * (g + 8) + m_tile;
    if (2 * t < kHeads) {
      float* dst = red_acc + (warp * kHeads + 2 * t) * kHeadDim;
      dst[dim_lo] = acc[m_tile][0] * unit + zero_even;
      dst[dim_hi] = acc[m_tile][2] * unit + zero_even;
    }
    if (2 * t + 1 < kHeads) {
      float* dst = red_acc + (warp * kHeads + 2 * t + 1) * kHeadDim;
      dst[dim_lo] = acc[m_tile][1] * unit + zero_odd;
      dst[dim_hi] = acc[m_tile][3] * unit + zero_odd;
    }
  }
  __syncthreads();

  const bool split = d.split_start[sequence + 1] - d.split_start[sequence] > 1;
  float* partial_o = d.workspace;
  float* partial_lse = d.workspace + int64_t{d.num_work_items} * d.num_q_heads * kHeadDim;
  for (int idx = threadIdx.x; idx < kHeads * kHeadDim; idx += blockDim.x) {
    const int h = idx / kHeadDim;
    const int col = idx % kHeadDim;
    float m_all = kNoScore;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, red_m[w * kHeads + h]);
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(red_m[w * kHeads + h] - m_all);
      sum += red_l[w * kHeads + h] * weight;
      o += red_acc[(w * kHeads + h) * kHeadDim + col] * weight;
    }
    const int q_head = q_head0 + h;
    if (!split) {
      out[(int64_t{token} * d.num_q_heads + q_head) * kHeadDim + col] = __float2bfloat16(sum > 0.0f ? o / sum : 0.0f);
    } else {
      partial_o[(int64_t{item} * d.num_q_heads + q_head) * kHeadDim + col] = o / sum;
      if (col == 0) partial_lse[int64_t{item} * d.num_q_heads + q_head] = m_all + log2f(sum);
    }
  }
}

template <int kHeadDim, int kHeads, KvQuant Q>
cudaError_t launch_mma_variant(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                               cudaStream_t stream) {
  using S = QuantizedShape<kHeadDim, Q, Q>;
  constexpr int smem_bytes = kWarps * kStages * S::kStageBytes;
  static_assert(smem_bytes >= (2 * kWarps * kHeads + kWarps * kHeads * kHeadDim) * 4,
                "the warp merge reuses the stage memory");
  static_assert(S::kKeyCopies == S::kValueCopies, "K and V copied together");
  auto* kernel = decode_attention_mma_kernel<kHeadDim, kHeads, Q>;
  static const cudaError_t prepared =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (prepared != cudaSuccess) return prepared;
  if (d.num_work_items == 0) return cudaSuccess;
  kernel<<<dim3(d.num_q_heads / kHeads, d.num_work_items), kWarps * 32, smem_bytes, stream>>>(d, q, out);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || d.max_splits <= 1) return err;
  return launch_decode_merge(d, out, stream);
}

template <KvQuant Q>
cudaError_t launch_mma(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                       cudaStream_t stream) {
  switch (d.head_dim * 8 + d.q_heads_per_cta) {
    case 64 * 8 + 1: return launch_mma_variant<64, 1, Q>(d, q, out, stream);
    case 64 * 8 + 2: return launch_mma_variant<64, 2, Q>(d, q, out, stream);
    case 64 * 8 + 4: return launch_mma_variant<64, 4, Q>(d, q, out, stream);
    case 128 * 8 + 1: return launch_mma_variant<128, 1, Q>(d, q, out, stream);
    case 128 * 8 + 2: return launch_mma_variant<128, 2, Q>(d, q, out, stream);
    case 128 * 8 + 4: return launch_mma_variant<128, 4, Q>(d, q, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <int kHeadDim, int kHeads, KvQuant KQ, KvQuant VQ>
cudaError_t launch_variant(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                           cudaStream_t stream) {
  using S = QuantizedShape<kHeadDim, KQ, VQ>;
  constexpr int smem_bytes = kWarps * kStages * S::kStageBytes;
  static_assert(smem_bytes >= (2 * kWarps * kHeads + kWarps * kHeads * kHeadDim) * 4,
                "the warp merge reuses the stage memory");
  auto* kernel = decode_attention_quantized_kernel<kHeadDim, kHeads, KQ, VQ>;
  static const cudaError_t prepared =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (prepared != cudaSuccess) return prepared;
  if (d.num_work_items == 0) return cudaSuccess;
  kernel<<<dim3(d.num_q_heads / kHeads, d.num_work_items), kWarps * 32, smem_bytes, stream>>>(d, q, out);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || d.max_splits <= 1) return err;
  return launch_decode_merge(d, out, stream);
}

template <int kHeadDim, KvQuant KQ, KvQuant VQ>
cudaError_t launch_for_heads(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                             cudaStream_t stream) {
  switch (d.q_heads_per_cta) {
    case 1: return launch_variant<kHeadDim, 1, KQ, VQ>(d, q, out, stream);
    case 2: return launch_variant<kHeadDim, 2, KQ, VQ>(d, q, out, stream);
    case 4: return launch_variant<kHeadDim, 4, KQ, VQ>(d, q, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <KvQuant KQ, KvQuant VQ>
cudaError_t launch_for_formats(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                               cudaStream_t stream) {
  switch (d.head_dim) {
    case 64: return launch_for_heads<64, KQ, VQ>(d, q, out, stream);
    case 128: return launch_for_heads<128, KQ, VQ>(d, q, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool decode_attention_quantized_supports(KvElement key, KvElement value, int head_dim) {
  if (head_dim != 64 && head_dim != 128) return false;
  if (key == value) return key != KvElement::kBF16;
  return key == KvElement::kInt8 && value == KvElement::kInt4;
}

cudaError_t prepare_decode_attention_quantized() {
  AttentionDescriptor empty;  // zero work items: sets the attributes, enqueues nothing
  const KvElement pairs[][2] = {{KvElement::kFP8E4M3, KvElement::kFP8E4M3},
                                {KvElement::kInt8, KvElement::kInt8},
                                {KvElement::kInt4, KvElement::kInt4},
                                {KvElement::kInt8, KvElement::kInt4}};
  for (const auto& pair : pairs) {
    for (int head_dim : {64, 128}) {
      for (int heads : {1, 2, 4}) {
        empty.key_element = pair[0];
        empty.value_element = pair[1];
        empty.head_dim = head_dim;
        empty.q_heads_per_cta = heads;
        for (bool cuda_cores : {false, true}) {
          empty.quantized_decode_cuda_cores = cuda_cores;
          const cudaError_t err = launch_decode_attention_quantized(empty, nullptr, nullptr, nullptr);
          if (err != cudaSuccess) return err;
        }
      }
    }
  }
  return cudaSuccess;
}

cudaError_t launch_decode_attention_quantized(const AttentionDescriptor& d, const void* q, void* out,
                                              cudaStream_t stream) {
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  if (d.num_work_items > 0 && (d.key_scale == nullptr || d.value_scale == nullptr)) return cudaErrorInvalidValue;
  using E = KvElement;
  if (d.key_element == E::kFP8E4M3 && d.value_element == E::kFP8E4M3) {
    if (!d.quantized_decode_cuda_cores) return launch_mma<KvQuant::kFP8E4M3>(d, qb, ob, stream);
    return launch_for_formats<KvQuant::kFP8E4M3, KvQuant::kFP8E4M3>(d, qb, ob, stream);
  }
  if (d.key_element == E::kInt8 && d.value_element == E::kInt8) {
    if (!d.quantized_decode_cuda_cores) return launch_mma<KvQuant::kInt8>(d, qb, ob, stream);
    return launch_for_formats<KvQuant::kInt8, KvQuant::kInt8>(d, qb, ob, stream);
  }
  if (d.key_element == E::kInt4 && d.value_element == E::kInt4)
    return launch_for_formats<KvQuant::kInt4, KvQuant::kInt4>(d, qb, ob, stream);
  if (d.key_element == E::kInt8 && d.value_element == E::kInt4)
    return launch_for_formats<KvQuant::kInt8, KvQuant::kInt4>(d, qb, ob, stream);
  return cudaErrorInvalidValue;
}

}  // namespace pagoda::kernels::cuda
