// Decode attention over a quantized paged cache (fp8 e4m3, int8, int4 codes
// with per-vector or per-group scale records, runtime/kv_quant.h), dequantized
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
// fp8, int8 and int4 pools (K and V alike) run on tensor cores instead
// (decode_attention_mma.cu) unless decode_cuda_cores is set: this loop spends
// 8 FMAs per K + V element and 4 query heads, which made it compute-bound at
// about the bf16 kernel's tokens/s. K int8 / V int4 runs here. The split-K
// scaffolding (work items, warp merge, output or partials, merge pass) is
// decode_split_merge.cuh's, shared with the bf16 kernel.

#include <cuda_bf16.h>

#include "pagoda/backend/cuda/attention/attention_descriptor.h"
#include "pagoda/backend/cuda/attention/attention_launch_internal.h"
#include "pagoda/backend/cuda/attention/decode_split_merge.cuh"
#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/kv_dequant.cuh"

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
  DecodeWorkItem w = load_decode_work_item(d, blockIdx.y, blockIdx.x, kHeads);
  if (w.sequence < 0) return;  // unused item of a graph-mode plan
  load_decode_holes(d, w);
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
  // Its record vector (kv_scale_vector: [block, head, slot]).
  auto scale_vector_at = [&](int pos, bool valid) {
    const int block = valid ? __ldg(table + (pos >> d.log2_block_size)) : 0;
    return (int64_t{block} * d.num_kv_heads + kv_head) * d.block_size + (pos & (d.block_size - 1));
  };
  auto issue_tile = [&](int my_index) {
    uint8_t* stage = warp_smem + (my_index % kStages) * S::kStageBytes;
    const int pos0 = kv_begin + (warp + my_index * kWarps) * S::kTileTokens;
#pragma unroll
    for (int k = 0; k < S::kKeyCopies; ++k) {
      const int idx = lane + 32 * k;
      const int t = idx / (S::kKeyBytes / 16), c = idx % (S::kKeyBytes / 16);
      const bool valid = w.live(pos0 + t);  // past the end or in a hole: zero-filled
      const int64_t vec = vector_at(pos0 + t, valid);
      cp_async_16(stage + t * S::kKeyBytes + c * 16, key + vec * S::kKeyBytes + c * 16, valid);
    }
#pragma unroll
    for (int k = 0; k < S::kValueCopies; ++k) {
      const int idx = lane + 32 * k;
      const int t = idx / (S::kValueBytes / 16), c = idx % (S::kValueBytes / 16);
      const bool valid = w.live(pos0 + t);  // past the end or in a hole: zero-filled
      const int64_t vec = vector_at(pos0 + t, valid);
      cp_async_16(stage + S::kValueAt + t * S::kValueBytes + c * 16, value + vec * S::kValueBytes + c * 16, valid);
    }
#pragma unroll
    for (int t = lane; t < S::kTileTokens; t += 32) {
      const bool valid = w.live(pos0 + t);  // past the end or in a hole: zero-filled
      const int64_t vec = scale_vector_at(pos0 + t, valid);
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
      if (!w.live(pos0 + group + u * S::kTokensPerStep)) {
#pragma unroll
        for (int h = 0; h < kHeads; ++h) s[u][h] = -INFINITY;
      }
    }
    // Token eviction's scores (AttentionDescriptor::scores; off: one uniform branch per tile): every
    // lane of a token holds its whole score after the shuffles; lane sub 0 writes the live ones.
    if (d.scores != nullptr && sub == 0) {
#pragma unroll
      for (int u = 0; u < kStepsPerTile; ++u) {
        const int pos = pos0 + group + u * S::kTokensPerStep;
        if (!w.live(pos)) continue;
#pragma unroll
        for (int h = 0; h < kHeads; ++h)
          d.scores[(int64_t{w.token} * d.num_q_heads + w.q_head0 + h) * d.score_stride + pos] = s[u][h];
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
        const cudaError_t err = launch_decode_attention_quantized(empty, nullptr, nullptr, nullptr);
        if (err != cudaSuccess) return err;
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
  if (d.key_element == E::kFP8E4M3 && d.value_element == E::kFP8E4M3)
    return launch_for_formats<KvQuant::kFP8E4M3, KvQuant::kFP8E4M3>(d, qb, ob, stream);
  if (d.key_element == E::kInt8 && d.value_element == E::kInt8)
    return launch_for_formats<KvQuant::kInt8, KvQuant::kInt8>(d, qb, ob, stream);
  if (d.key_element == E::kInt4 && d.value_element == E::kInt4)
    return launch_for_formats<KvQuant::kInt4, KvQuant::kInt4>(d, qb, ob, stream);
  if (d.key_element == E::kInt8 && d.value_element == E::kInt4)
    return launch_for_formats<KvQuant::kInt8, KvQuant::kInt4>(d, qb, ob, stream);
  return cudaErrorInvalidValue;
}

}  // namespace pagoda::kernels::cuda
