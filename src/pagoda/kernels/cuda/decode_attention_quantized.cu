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
// tokens/s. int4 and K int8 / V int4 keep the CUDA-core loop. The split-K
// scaffolding (work items, warp merge, output or partials, merge pass) is
// decode_split_merge.cuh's, shared with the bf16 kernel.

#include <cuda_bf16.h>

#include "pagoda/kernels/cuda/attention_descriptor.h"
#include "pagoda/kernels/cuda/attention_launch_internal.h"
#include "pagoda/kernels/cuda/decode_split_merge.cuh"
#include "pagoda/kernels/cuda/device_primitives.cuh"
#include "pagoda/kernels/cuda/kv_dequant.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

constexpr int kWarps = 4;
constexpr int kStages = 3;
constexpr int kStepsPerTile = 8;

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

  allow_merge_launch();
  const DecodeWorkItem w = load_decode_work_item(d, blockIdx.y, blockIdx.x, kHeads);
  if (w.sequence < 0) return;  // unused item of a graph-mode plan
  const int kv_begin = w.kv_begin, kv_end = w.kv_end, q_head0 = w.q_head0, kv_head = w.kv_head, token = w.token;
  const int32_t* table = w.table;
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
    const int block = valid ? __ldg(table + (pos >> d.log2_block_size)) : 0;  // ld.global.nc, not a generic load
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
  const WarpPartials<kWarps, kHeads, kHeadDim> partials(reinterpret_cast<float*>(smem));
  if (group == 0) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float* dst = partials.acc_row(warp, h) + sub * 16;
#pragma unroll
      for (int e = 0; e < 16; ++e) dst[e] = acc[h][e];
      if (sub == 0) {
        partials.m[warp * kHeads + h] = m[h];
        partials.l[warp * kHeads + h] = l[h];
      }
    }
  }
  __syncthreads();
  write_decode_result(d, w, partials, out);
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
//
// At the bytes of a bf16 tile a warp holds twice the tokens, so per byte this
// kernel issues more work; profiled (ncu, B=8 L=32K) its warps were busy ~90%
// of each tile's time, issue-bound rather than waiting on memory (DRAM at 74%
// of peak against bf16's 86%). Hence: copies addressed with 32-bit arithmetic
// and one wide multiply, XOR-swizzled stage rows (the K and V fragment reads
// had 2- and 4-way bank conflicts) and the upper fp8 pair converted in place:
// 30% fewer instructions, fp8 B=8 L=32K from 158 to 145 us (docs/KERNELS.md).
// Tokens as the rows of S (S^T = K Q^T: half the S mma, P^T transposed with
// movmatrix), a V unit that only grows, one table load per lane and 16-byte V
// fragment loads were measured too (commit 738b129) and gained nothing.
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
    // The halves as 16-bit registers, so the conversion can read the upper one in place (no shift).
    asm("{\n .reg .b16 low, high;\n mov.b32 {low, high}, %2;\n cvt.rn.f16x2.e4m3x2 %0, low;\n"
        " cvt.rn.f16x2.e4m3x2 %1, high;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
  } else {
    // 0x64XX is the f16 1024 + XX; subtracting 1024 is exact.
    const __half2 magic = __half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400));
    __half2 a = __hsub2(*reinterpret_cast<const __half2*>(&(lo = __byte_perm(w, 0x6464u, 0x5140))), magic);
    __half2 b = __hsub2(*reinterpret_cast<const __half2*>(&(hi = __byte_perm(w, 0x6464u, 0x5342))), magic);
    lo = *reinterpret_cast<uint32_t*>(&a);
    hi = *reinterpret_cast<uint32_t*>(&b);
  }
}

// Byte offset in a stage's code rows of byte `byte` of row `row` (kRowBytes a
// row): the 16-byte chunks of row r are stored XOR-swizzled by r, so the
// fragment reads of K (two rows x 4 chunk pairs per 8 lanes) and of V (4 rows
// per half-warp at the same column) fall into distinct banks.
template <int kRowBytes>
__device__ __forceinline__ int stage_offset(int row, int byte) {
  return row * kRowBytes + ((((byte >> 4) ^ row) & (kRowBytes / 16 - 1)) << 4) + (byte & 15);
}

// Tiles of [kv_begin, kv_end) this warp reads: tile j of warp w starts at
// kv_begin + (w + j * kWarps) * tile_tokens.
__device__ __forceinline__ int warp_tile_count(const DecodeWorkItem& w, int warp, int tile_tokens) {
  const int num_tiles = (w.kv_end - w.kv_begin + tile_tokens - 1) / tile_tokens;
  return warp < num_tiles ? (num_tiles - warp + kWarps - 1) / kWarps : 0;
}

// CTA b takes the units (work item x head tile) b, b + gridDim.x, ..., with
// the head tile fastest (the head tiles of one item run side by side). Each warp
// streams its tiles of all its CTA's units through one 3-stage cp.async
// pipeline, so with fewer CTAs than units the next unit's first tiles are in
// flight while this one's warps merge and write. The launch gives every unit
// its own CTA all the same: a persistent grid (2 CTAs per SM) measured 1-2%
// slower on the H200 at B=64 L=4K and B=8 L=32K and equal at B=256 L=1K
// (docs/KERNELS.md); its GPU tests passed too, so a grid of any size is correct.
template <int kHeadDim, int kHeads, KvQuant Q>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_mma_kernel(const AttentionDescriptor d, const __nv_bfloat16* __restrict__ q,
                                __nv_bfloat16* __restrict__ out) {
  using S = QuantizedShape<kHeadDim, Q, Q>;
  constexpr int kNTiles = S::kTileTokens / 8;   // 8-token column tiles of S
  constexpr int kSlices = kHeadDim / 16;        // 16-dim k slices of S = 16-dim m tiles of O
  constexpr int kLaneDims = kHeadDim / 4;       // K codes per lane and token
  constexpr int kChunk = kHeadDim / 16;         // V codes per lane, token and row half
  constexpr int kRowChunks = kHeadDim / 16;     // 16-byte chunks per code row
  static_assert(kHeads <= 8, "query heads are rows 0..7 of the m16 tiles");
  static_assert(S::kKeyCopies == S::kValueCopies, "K and V copied together");
  extern __shared__ uint4 smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int head_tiles = d.num_q_heads / kHeads;
  const int num_units = d.num_work_items * head_tiles;
  const auto* key = static_cast<const uint8_t*>(d.key);
  const auto* value = static_cast<const uint8_t*>(d.value);
  const auto* key_scale = static_cast<const uint8_t*>(d.key_scale);
  const auto* value_scale = static_cast<const uint8_t*>(d.value_scale);

  uint8_t* warp_smem = reinterpret_cast<uint8_t*>(smem) + warp * kStages * S::kStageBytes;
  // The warp merge has its own memory: the stages hold the next unit's tiles by then.
  const WarpPartials<kWarps, kHeads, kHeadDim> partials(
      reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem) + kWarps * kStages * S::kStageBytes));

  // Issue side of the pipeline: the unit being issued and where its tiles come
  // from. The per-copy address is one table load and 32-bit arithmetic plus
  // one wide multiply (a pool holds far fewer than 2^32 token vectors); the
  // rest is fixed per unit and lane.
  const uint32_t token_bytes = static_cast<uint32_t>(d.num_kv_heads) * kHeadDim;  // codes of one token, all heads
  const uint32_t token_records = static_cast<uint32_t>(d.num_kv_heads) * 4;      // scale records of one token
  const int lane_chunk = lane % kRowChunks;  // the 16-byte chunk this lane copies of each token
  const int lane_row = lane / kRowChunks;    // its first token of the tile (then every 32 / kRowChunks)
  const int lane_at = stage_offset<kHeadDim>(lane_row, 16 * lane_chunk);
  int issue_unit = blockIdx.x;
  const int32_t* issue_table = nullptr;
  const uint8_t *issue_key = nullptr, *issue_value = nullptr, *issue_key_scale = nullptr,
                *issue_value_scale = nullptr;
  int issue_pos = 0, issue_end = 0, issue_left = 0;  // next tile's first position, the range end, tiles left
  auto enter_issue_unit = [&]() {
    const DecodeWorkItem w = load_decode_work_item(d, issue_unit / head_tiles, issue_unit % head_tiles, kHeads);
    issue_table = w.table;
    issue_key = key + w.kv_head * kHeadDim + 16 * lane_chunk;
    issue_value = value + w.kv_head * kHeadDim + 16 * lane_chunk;
    issue_key_scale = key_scale + w.kv_head * 4;
    issue_value_scale = value_scale + w.kv_head * 4;
    issue_pos = w.kv_begin + warp * S::kTileTokens;
    issue_end = w.kv_end;
    issue_left = warp_tile_count(w, warp, S::kTileTokens);
  };
  // Token vector (block * block_size + slot) of position pos, or 0 (a mapped address) past the end.
  // Branch-free: past the end it reads the table's first entry (every unit with tiles has one).
  auto pool_token = [&](int pos, bool valid) -> uint32_t {
    const uint32_t block = static_cast<uint32_t>(__ldg(issue_table + (valid ? pos >> d.log2_block_size : 0)));
    return valid ? (block << d.log2_block_size) | static_cast<uint32_t>(pos & (d.block_size - 1)) : 0u;
  };
  enter_issue_unit();
  int issue_stage = 0;
  auto issue_next = [&]() {
    while (issue_left == 0 && issue_unit < num_units) {
      issue_unit += gridDim.x;
      if (issue_unit < num_units) enter_issue_unit();
    }
    if (issue_left > 0) {
      uint8_t* stage = warp_smem + issue_stage * S::kStageBytes;
#pragma unroll
      for (int k = 0; k < S::kKeyCopies; ++k) {
        constexpr int kRowsPerCopy = 32 / kRowChunks;
        const int row_step = k * kRowsPerCopy;  // this copy's token is lane_row + row_step
        const int pos = issue_pos + lane_row + row_step;
        const bool valid = pos < issue_end;
        const uint64_t offset = uint64_t{pool_token(pos, valid)} * token_bytes;
        // lane_row + row_step has no carries, so the swizzle splits into the lane's and the copy's part.
        const int at = (lane_at ^ ((row_step & (kRowChunks - 1)) << 4)) + row_step * kHeadDim;
        cp_async_16(stage + at, issue_key + offset, valid);
        cp_async_16(stage + S::kValueAt + at, issue_value + offset, valid);
      }
#pragma unroll
      for (int tk = lane; tk < S::kTileTokens; tk += 32) {
        const bool valid = issue_pos + tk < issue_end;
        const uint64_t offset = uint64_t{pool_token(issue_pos + tk, valid)} * token_records;
        cp_async_ca<4>(stage + S::kKeyScaleAt + tk * 4, issue_key_scale + offset, valid);
        cp_async_ca<4>(stage + S::kValueScaleAt + tk * 4, issue_value_scale + offset, valid);
      }
      issue_pos += kWarps * S::kTileTokens;
      --issue_left;
      issue_stage = issue_stage == kStages - 1 ? 0 : issue_stage + 1;
    }
    cp_async_commit();  // possibly empty: one group per consumed tile keeps the wait count right
  };

  allow_merge_launch();
  // KV first: the query and bookkeeping loads below overlap these copies.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_next();

  int consume_stage = 0;
  for (int unit = blockIdx.x; unit < num_units; unit += gridDim.x) {
    const DecodeWorkItem w = load_decode_work_item(d, unit / head_tiles, unit % head_tiles, kHeads);
    if (w.sequence < 0) continue;  // unused item of a graph-mode plan (the whole CTA skips it)
    const int my_tiles = warp_tile_count(w, warp, S::kTileTokens);

    // A fragments of Q (rows = heads; rows 8..15 and heads past kHeads are zero),
    // pre-scaled to log2 units and rounded to f16, and sum(q) of the rounded values.
    uint32_t qa[kSlices][2];
    float qsum = 0.0f;
    {
      const bool real_head = g < kHeads;
      const __nv_bfloat16* row =
          q + (int64_t{w.token} * d.num_q_heads + w.q_head0 + (real_head ? g : 0)) * kHeadDim + t * kLaneDims;
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
    float unit_scale = 1.0f;                        // acc * unit_scale is the value (U above)
    float acc[kSlices][4];
#pragma unroll
    for (int i = 0; i < kSlices; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

    for (int i = 0; i < my_tiles; ++i) {
      issue_next();
      cp_async_wait<kStages - 1>();
      __syncwarp();

      const uint8_t* stage = warp_smem + consume_stage * S::kStageBytes;
      consume_stage = consume_stage == kStages - 1 ? 0 : consume_stage + 1;
      const int pos0 = w.kv_begin + (warp + i * kWarps) * S::kTileTokens;

      // Scores of head g for tokens 8 n + 2t + e.
      float s[kNTiles][2];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const int row = 8 * n + g;
        uint32_t words[kLaneDims / 4];
#pragma unroll
        for (int c = 0; c < kLaneDims / 16; ++c) {
          const uint4 v = *reinterpret_cast<const uint4*>(stage + stage_offset<kHeadDim>(row, t * kLaneDims + 16 * c));
          words[4 * c] = v.x;
          words[4 * c + 1] = v.y;
          words[4 * c + 2] = v.z;
          words[4 * c + 3] = v.w;
        }
        float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
          uint32_t b0, b1;
          codes4_to_f16x2<Q>(words[j], b0, b1);
          mma_f16_16816(c4, qa[j][0], 0u, qa[j][1], 0u, b0, b1);
        }
        // The records of tokens 2t, 2t + 1 of this n-tile, one 8-byte load.
        const uint2 records = *reinterpret_cast<const uint2*>(stage + S::kKeyScaleAt + 4 * (8 * n + 2 * t));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tk = 8 * n + 2 * t + e;
          const KvScale ks = decode_scale_record(e == 0 ? records.x : records.y, Q);
          const float score = Q == KvQuant::kFP8E4M3 ? c4[e] * ks.scale : fmaf(c4[e], ks.scale, ks.zero * qsum);
          s[n][e] = pos0 + tk < w.kv_end ? score : -INFINITY;
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
        const uint2 records = *reinterpret_cast<const uint2*>(stage + S::kValueScaleAt + 4 * (8 * n + 2 * t));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const KvScale vs = decode_scale_record(e == 0 ? records.x : records.y, Q);
          p[n][e] = exp2f(s[n][e] - m_new);  // 0 past the end
          sum += p[n][e];
          if constexpr (Q != KvQuant::kFP8E4M3) zeros = fmaf(p[n][e], vs.zero, zeros);
          v_scale[n][e] = vs.scale;
          v_max = fmaxf(v_max, vs.scale);  // records past the end are zero
        }
      }
      l = l * correction + sum;
      zero_sum = zero_sum * correction + zeros;
      // The four lanes t of any g hold all the tile's tokens between them.
      v_max = fmaxf(v_max, __shfl_xor_sync(0xffffffffu, v_max, 1));
      v_max = fmaxf(v_max, __shfl_xor_sync(0xffffffffu, v_max, 2));
      if (!(v_max > 0.0f)) v_max = 1.0f;
      const float inverse_unit = 1.0f / v_max;
      const float rescale = correction * unit_scale * inverse_unit;  // head g
      unit_scale = v_max;
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
          const uint8_t* rows = stage + S::kValueAt;
          const int at_lo = stage_offset<kHeadDim>(tokens[r], kChunk * g);
          const int at_hi = stage_offset<kHeadDim>(tokens[r], kChunk * (g + 8));
          if constexpr (kChunk == 8) {
            const uint2 a = *reinterpret_cast<const uint2*>(rows + at_lo);
            const uint2 b = *reinterpret_cast<const uint2*>(rows + at_hi);
            lo[r][0] = a.x;
            lo[r][1] = a.y;
            hi[r][0] = b.x;
            hi[r][1] = b.y;
          } else {
            lo[r][0] = *reinterpret_cast<const uint32_t*>(rows + at_lo);
            hi[r][0] = *reinterpret_cast<const uint32_t*>(rows + at_hi);
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

    if (t == 0 && g < kHeads) {
      partials.m[warp * kHeads + g] = m;
      partials.l[warp * kHeads + g] = l;
    }
#pragma unroll
    for (int m_tile = 0; m_tile < kSlices; ++m_tile) {
      const int dim_lo = kChunk * g + m_tile, dim_hi = kChunk * (g + 8) + m_tile;
      if (2 * t < kHeads) {
        float* dst = partials.acc_row(warp, 2 * t);
        dst[dim_lo] = acc[m_tile][0] * unit_scale + zero_even;
        dst[dim_hi] = acc[m_tile][2] * unit_scale + zero_even;
      }
      if (2 * t + 1 < kHeads) {
        float* dst = partials.acc_row(warp, 2 * t + 1);
        dst[dim_lo] = acc[m_tile][1] * unit_scale + zero_odd;
        dst[dim_hi] = acc[m_tile][3] * unit_scale + zero_odd;
      }
    }
    __syncthreads();
    write_decode_result(d, w, partials, out);
    __syncthreads();  // the partials are rewritten by the next unit
  }
  cp_async_wait<0>();  // nothing left in flight at exit (all trailing groups are empty)
}

template <int kHeadDim, int kHeads, KvQuant Q>
cudaError_t launch_mma_variant(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                               cudaStream_t stream) {
  using S = QuantizedShape<kHeadDim, Q, Q>;
  constexpr int smem_bytes = kWarps * kStages * S::kStageBytes + WarpPartials<kWarps, kHeads, kHeadDim>::kFloats * 4;
  constexpr auto kernel = decode_attention_mma_kernel<kHeadDim, kHeads, Q>;
  const int64_t units = int64_t{d.num_work_items} * (d.num_q_heads / kHeads);  // one CTA each
  return launch_split_decode<kernel, smem_bytes, kWarps * 32>(d, q, out, stream, dim3(static_cast<unsigned>(units)));
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
  static_assert(smem_bytes >= WarpPartials<kWarps, kHeads, kHeadDim>::kFloats * 4,
                "the warp merge reuses the stage memory");
  return launch_split_decode<decode_attention_quantized_kernel<kHeadDim, kHeads, KQ, VQ>, smem_bytes, kWarps * 32>(
      d, q, out, stream);
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
