// Decode attention on tensor cores (mma.sync m16n8k16, f32 accumulate) over a
// bf16, fp8, int8 or int4 paged cache (K and V in the same format). The default
// decode path for those pools at head_dim 64 and 128; decode_attention.cu
// (bf16) and decode_attention_quantized.cu (every format) keep the CUDA-core
// loops for head_dim 256, K int8 / V int4 and comparisons
// (AttentionPlanOptions::decode_cuda_cores).
//
// One CTA per unit (work item x head tile of kHeads query heads of one GQA
// group), 4 warps; each warp streams its tiles of the unit through a private
// cp.async pipeline of kStages stages of 8 KB of K + V (16 tokens of bf16 or
// 32 of fp8 / int8 at head_dim 128; int4: 4 stages of 32 tokens, 4 KB of codes
// and 1 KB of records), so no CTA barrier is in the loop; the
// warps merge through shared memory and split-K is merged by the shared merge
// pass (decode_split_merge.cuh). Per tile, with Q as the A operand (rows =
// query heads; rows past kHeads are zero):
//   S[head, token]  = Q[head, :] . K[token, :]            (B = K^T)
//   O^T[dim, head] += V^T[dim, token] . P^T[token, head]  (A = V^T, B = P^T)
// so S's accumulator layout is P^T's B fragment layout and no shuffle is
// needed between the two products. Lane (g = lane / 4, t = lane % 4) owns, for
// S, head g and tokens 2t, 2t + 1 of each 8-token n-tile; for O, heads 2t and
// 2t + 1 of its m-tile rows.
//
// bf16: K and V are read with ldmatrix (V transposed) from XOR-swizzled rows,
// P is rounded to bf16 (as in prefill) and scores are scaled in f32. Per byte
// of KV this issues a fraction of the CUDA-core loop's instructions; that loop
// is issue-bound when units are short (many short sequences), which is where
// this kernel gains most (docs/KERNELS.md has the profile and the figures).
//
// fp8 / int8 (one scale record per vector, records [block, head, slot] so one
// 16-byte copy brings 4 tokens' records): the per-token scales stay outside
// the products:
//   S[head, token]  = Q[head, :] . codes[token, :]  -> * k_scale + k_zero * sum(q)
//   O^T[dim, head] += codes^T[dim, token] . (p * v_scale / U)[token, head]
// where U is the largest v_scale of the tile (p v_scale / U stays in [0, 1],
// clear of f16 subnormals); the accumulator carries U and is rescaled, with the
// online-softmax correction, from tile to tile. V codes become f16 exactly (fp8
// e4m3 through the hardware conversion, 0..255 through a 1024 + code bit
// pattern). fp8 scores run on e4m3 tensor cores (m16n8k32) straight from the K
// codes, q as e4m3 hi + lo (about 2^-8 relative, bf16's order) in rows g and
// g + 8; int8 converts K to f16 too. Dims are a free permutation of the k
// index: for S lane t owns the K dims [t D/4, t D/4 + D/4) (its codes are
// contiguous), for O lane g owns dims {D/16 g + i, D/16 (g + 8) + i} of m-tile i.
// int4 (groups of 32 dims, one {scale, zero} record each; 32-token tiles x 4
// stages at d=128): the scales differ along the dims, so they go inside:
//   S[head, token] = sum_G k_scale_G * (Q_G . codes_G) + k_zero_G * sum(Q_G)
// with each group's two k-slices in an accumulator of its own (lane t holds
// the 8 codes of its 32-bit word of each group: dims 32 G + 8 t + 0..7, paired
// (j, j + 4) by the nibble conversion, q paired alike), and
//   O^T[dims of G, head] += codes^T . (p * v_scale_G / U_G)[token, head]
// with lane g owning dims 32 G + 4 g + 0..3 (a half-word per token), m-tiles
// 2G and 2G + 1 being group G's, and a unit U_G and a zero sum per group.
// fp8 written with per-tensor scales (a checkpoint's k_scale / v_scale;
// kTensorScales) reads no records: the K scale joins q's unscale and U is the V
// scale throughout, so the stages hold codes only and the V-unit bookkeeping
// goes.
//
// At the bytes of a bf16 tile an fp8 warp holds twice the tokens, so per byte
// it issues more work; a profile showed its warps issue-bound rather than
// waiting on memory. Hence: copies addressed with 32-bit arithmetic and
// one wide multiply, XOR-swizzled stage rows (the K and V fragment reads had
// 2- and 4-way bank conflicts) and the upper fp8 pair converted in place,
// which cut the loop's instructions and its time. With those, the fp8 loop is
// memory-bound: the e4m3 scores and the 16-byte record copies are kept for
// their fewer instructions and requests, though neither moved the time beyond
// the run-to-run spread. 16-token tiles with more stages (in the same shared
// memory, or at 3 CTAs per SM) were slower: the per-tile softmax work is paid
// every 16 tokens, and 3 CTAs per SM break the plan's waves.
// Tokens as the rows of S (S^T = K Q^T: half the S mma, P^T transposed with
// movmatrix), a V unit that only grows, one table load per lane and 16-byte V
// fragment loads were tried too and gained nothing.
// docs/KERNELS.md ("Quantized decode") has the measurements behind each choice.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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
constexpr int kKvBytesPerStage = 8192;  // K + V rows of one warp tile (plus scale records)
// int4: 4 stages of 4 KB of codes (+ 1 KB of records): its records are 4x fp8's per token, so an 8 KB
// tile would not fit 2 CTAs per SM; 4 x 5 KB keeps about the bytes in flight of 3 x 8 KB.
constexpr int kInt4Stages = 4;
constexpr int kInt4CodeBytesPerStage = 4096;

// Tokens per warp tile: bf16 d=128 16, fp8 / int8 d=128 32, int4 d=128 32, d=64 twice that.
constexpr int default_tile_tokens(int head_dim, KvQuant q) {
  if (q == KvQuant::kInt4) return kInt4CodeBytesPerStage / head_dim;  // 2 x head_dim / 2 bytes a token
  return kKvBytesPerStage / (2 * head_dim * (q == KvQuant::kNone ? 2 : 1));
}
constexpr int default_stages(KvQuant q) { return q == KvQuant::kInt4 ? kInt4Stages : kStages; }

// One warp stage (bytes): K rows, V rows (kRowBytes each, XOR-swizzled by
// stage_offset), then the K and V scale records of the quantized formats
// (none for bf16, nor for fp8 with per-tensor scales: kTensorScales).
template <int kHeadDim, KvQuant Q, int kTileTokens, bool kTensorScales>
struct MmaStage {
  static constexpr bool kBf16 = Q == KvQuant::kNone;
  static constexpr bool kInt4 = Q == KvQuant::kInt4;
  static constexpr bool kRecords = !kBf16 && !kTensorScales;
  // One token of one head, K or V: bf16 2 bytes an element, fp8 / int8 1, int4 half.
  static constexpr int kRowBytes = kBf16 ? 2 * kHeadDim : kInt4 ? kHeadDim / 2 : kHeadDim;
  static constexpr int kRowChunks = kRowBytes / 16;
  static constexpr int kGroups = kInt4 ? kHeadDim / kKvInt4GroupSize : 1;  // scale records a token
  static constexpr int kRecordBytes = kRecords ? 4 * kGroups : 0;          // a token's records, K or V
  static constexpr int kValueAt = kTileTokens * kRowBytes;
  static constexpr int kKeyScaleAt = 2 * kValueAt;
  static constexpr int kValueScaleAt = kKeyScaleAt + kTileTokens * kRecordBytes;
  static constexpr int kBytes = kValueScaleAt + kTileTokens * kRecordBytes;
  static constexpr int kCopies = kTileTokens * kRowChunks / 32;  // 16-byte copies per lane, K and V each
  static_assert(kCopies * 32 == kTileTokens * kRowChunks, "whole 16-byte copies per lane");
  static_assert(kBytes % 16 == 0, "stages stay 16-byte aligned");
};

__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += a * b for one m16n8k32 tile of fp8 e4m3 (a: 4 registers of 4 codes, b: 2), f32 accumulate (sm_89+).
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> two e4m3 codes (x in the low byte), round to nearest, saturating.
__device__ __forceinline__ uint32_t float2_to_e4m3x2(float x, float y) {
  return __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t codes) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3)));
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

// Eight int4 codes (nibble j of w = code j) -> four f16x2 registers, exact:
// h[j] = (code j, code j + 4). 0x64XX is the f16 1024 + XX; subtracting 1024 is exact.
__device__ __forceinline__ void int4x8_to_f16x2(uint32_t w, uint32_t (&h)[4]) {
  const __half2 magic = __half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t biased = ((w >> (4 * j)) & 0x000f000fu) | 0x64006400u;
    const __half2 code = __hsub2(*reinterpret_cast<const __half2*>(&biased), magic);
    h[j] = *reinterpret_cast<const uint32_t*>(&code);
  }
}

// A token's kGroups 4-byte scale records from a stage (16-byte aligned for 4, 8 for 2).
template <int kGroups>
__device__ __forceinline__ void load_records(const uint8_t* at, uint32_t (&r)[kGroups]) {
  if constexpr (kGroups == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(at);
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else if constexpr (kGroups == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(at);
    r[0] = v.x, r[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < kGroups; ++i) r[i] = reinterpret_cast<const uint32_t*>(at)[i];
  }
}

// Byte offset in a stage's rows of byte `byte` of row `row` (kRowBytes a row):
// the 16-byte chunks of row r are stored XOR-swizzled by r, so the fragment
// reads fall into distinct banks: fp8 / int8 K (two rows x 4 chunk pairs per 8
// lanes) and V (4 rows per half-warp at the same column); bf16 ldmatrix (8
// consecutive rows at the same chunk).
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
// streams its tiles of all its CTA's units through one cp.async pipeline, so
// with fewer CTAs than units the next unit's first tiles are in flight while
// this one's warps merge and write. The launch gives every unit its own CTA
// all the same: a persistent grid (2 CTAs per SM) was no faster once the loop
// was lean (docs/KERNELS.md); its GPU tests passed too, so a grid of any size
// is correct.
template <int kHeadDim, int kHeads, KvQuant Q, int kTileTokens, int kStages, bool kTensorScales>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_mma_kernel(const AttentionDescriptor d, const __nv_bfloat16* __restrict__ q,
                                __nv_bfloat16* __restrict__ out) {
  using S = MmaStage<kHeadDim, Q, kTileTokens, kTensorScales>;
  constexpr bool kBf16 = S::kBf16;
  constexpr bool kRecords = S::kRecords;  // per-vector scale records in the stages
  constexpr bool kInt4 = S::kInt4;
  constexpr int kGroups = S::kGroups;     // int4: 32-dim groups, each with its own K and V record
  constexpr int kUnits = kGroups;         // V-scale units U (one per int4 group, else one)
  static_assert(!kTensorScales || Q == KvQuant::kFP8E4M3, "per-tensor scales are fp8's (a checkpoint's k/v_scale)");
  constexpr int kRowBytes = S::kRowBytes;
  constexpr int kRowChunks = S::kRowChunks;
  constexpr int kNTiles = kTileTokens / 8;  // 8-token column tiles of S
  constexpr int kSlices = kHeadDim / 16;    // 16-dim k slices of S = 16-dim m tiles of O
  constexpr int kLaneDims = kHeadDim / 4;   // fp8 / int8: K codes per lane and token
  constexpr int kChunk = kHeadDim / 16;     // fp8 / int8: V codes per lane, token and row half
  constexpr int kSlices8 = kHeadDim / 32;   // fp8: 32-dim k slices of S (m16n8k32)
  // fp8 scores on e4m3 tensor cores straight from the codes (no conversion of K); int8 converts to f16.
  constexpr bool kFp8Scores = Q == KvQuant::kFP8E4M3;
  static_assert(kHeads <= 8, "query heads are rows 0..7 of the m16 tiles");
  static_assert(kNTiles % 2 == 0, "P.V takes 16 tokens at a time");
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

  uint8_t* warp_smem = reinterpret_cast<uint8_t*>(smem) + warp * kStages * S::kBytes;
  // The warp merge has its own memory: the stages hold the next unit's tiles by then.
  const WarpPartials<kWarps, kHeads, kHeadDim> partials(
      reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem) + kWarps * kStages * S::kBytes));

  // Issue side of the pipeline: the unit being issued and where its tiles come
  // from. The per-copy address is one table load and 32-bit arithmetic plus
  // one wide multiply (a pool holds far fewer than 2^32 token vectors); the
  // rest is fixed per unit and lane.
  const uint32_t token_bytes = static_cast<uint32_t>(d.num_kv_heads) * kRowBytes;  // one token, all heads
  // Scale records are [block, head, slot] (kv_scale_vector): a block holds num_kv_heads * block_size.
  const uint32_t block_records = static_cast<uint32_t>(d.num_kv_heads) * d.block_size;
  const int lane_chunk = lane % kRowChunks;  // the 16-byte chunk this lane copies of each token
  const int lane_row = lane / kRowChunks;    // its first token of the tile (then every 32 / kRowChunks)
  const int lane_at = stage_offset<kRowBytes>(lane_row, 16 * lane_chunk);
  int issue_unit = blockIdx.x;
  const int32_t* issue_table = nullptr;
  const uint8_t *issue_key = nullptr, *issue_value = nullptr, *issue_key_scale = nullptr,
                *issue_value_scale = nullptr;
  int issue_pos = 0, issue_end = 0, issue_left = 0;  // next tile's first position, the range end, tiles left
  auto enter_issue_unit = [&]() {
    const DecodeWorkItem w = load_decode_work_item(d, issue_unit / head_tiles, issue_unit % head_tiles, kHeads);
    issue_table = w.table;
    issue_key = key + w.kv_head * kRowBytes + 16 * lane_chunk;
    issue_value = value + w.kv_head * kRowBytes + 16 * lane_chunk;
    if constexpr (kRecords) {
      issue_key_scale = key_scale + w.kv_head * d.block_size * S::kRecordBytes;
      issue_value_scale = value_scale + w.kv_head * d.block_size * S::kRecordBytes;
    }
    issue_pos = w.kv_begin + warp * kTileTokens;
    issue_end = w.kv_end;
    issue_left = warp_tile_count(w, warp, kTileTokens);
  };
  // Token vector (block * block_size + slot) of position pos, or 0 (a mapped address) past the end.
  // Branch-free: past the end it reads the table's first entry (every unit with tiles has one).
  auto pool_token = [&](int pos, bool valid) -> uint32_t {
    const uint32_t block = static_cast<uint32_t>(__ldg(issue_table + (valid ? pos >> d.log2_block_size : 0)));
    return valid ? (block << d.log2_block_size) | static_cast<uint32_t>(pos & (d.block_size - 1)) : 0u;
  };
  // Record (from the head's first) of position pos in [block, head, slot] order, or 0 past the end.
  auto pool_record = [&](int pos, bool valid) -> uint32_t {
    const uint32_t block = static_cast<uint32_t>(__ldg(issue_table + (valid ? pos >> d.log2_block_size : 0)));
    return valid ? block * block_records + static_cast<uint32_t>(pos & (d.block_size - 1)) : 0u;
  };
  enter_issue_unit();
  int issue_stage = 0;
  auto issue_next = [&]() {
    while (issue_left == 0 && issue_unit < num_units) {
      issue_unit += gridDim.x;
      if (issue_unit < num_units) enter_issue_unit();
    }
    if (issue_left > 0) {
      uint8_t* stage = warp_smem + issue_stage * S::kBytes;
#pragma unroll
      for (int k = 0; k < S::kCopies; ++k) {
        constexpr int kRowsPerCopy = 32 / kRowChunks;
        const int row_step = k * kRowsPerCopy;  // this copy's token is lane_row + row_step
        const int pos = issue_pos + lane_row + row_step;
        const bool valid = pos < issue_end;
        const uint64_t offset = uint64_t{pool_token(pos, valid)} * token_bytes;
        // lane_row + row_step has no carries, so the swizzle splits into the lane's and the copy's part.
        const int at = (lane_at ^ ((row_step & (kRowChunks - 1)) << 4)) + row_step * kRowBytes;
        cp_async_16(stage + at, issue_key + offset, valid);
        cp_async_16(stage + S::kValueAt + at, issue_value + offset, valid);
      }
      if constexpr (kRecords) {
        // One 16-byte copy brings the records of kTokensPerCopy consecutive tokens (4 for fp8 / int8,
        // int4 2 at d=64 and 1 at d=128), contiguous when block_size >= kTokensPerCopy.
        constexpr int kTokensPerCopy = 16 / S::kRecordBytes;
        constexpr int kRecordCopies = kTileTokens / kTokensPerCopy;  // K's; V's as many
        if (d.block_size >= kTokensPerCopy) {
          // Copies [0, kRecordCopies) bring the K records, the rest the V records; records past the end
          // are zero-filled (the tile's v_max relies on it).
#pragma unroll
          for (int c = lane; c < 2 * kRecordCopies; c += 32) {
            const bool is_key = c < kRecordCopies;
            const int copy = is_key ? c : c - kRecordCopies;
            const int pos = issue_pos + kTokensPerCopy * copy;
            const int valid_tokens = min(max(issue_end - pos, 0), kTokensPerCopy);
            const uint64_t offset = uint64_t{pool_record(pos, valid_tokens > 0)} * S::kRecordBytes;
            cp_async_16_prefix(stage + (is_key ? S::kKeyScaleAt : S::kValueScaleAt) + 16 * copy,
                               (is_key ? issue_key_scale : issue_value_scale) + offset,
                               S::kRecordBytes * valid_tokens);
          }
        } else {
#pragma unroll
          for (int tk = lane; tk < kTileTokens; tk += 32) {
            const bool valid = issue_pos + tk < issue_end;
            const uint64_t offset = uint64_t{pool_record(issue_pos + tk, valid)} * S::kRecordBytes;
            cp_async_ca<S::kRecordBytes>(stage + S::kKeyScaleAt + tk * S::kRecordBytes, issue_key_scale + offset,
                                         valid);
            cp_async_ca<S::kRecordBytes>(stage + S::kValueScaleAt + tk * S::kRecordBytes,
                                         issue_value_scale + offset, valid);
          }
        }
      }
      issue_pos += kWarps * kTileTokens;
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
    const int my_tiles = warp_tile_count(w, warp, kTileTokens);

    // A fragments of Q (rows = heads; rows 8..15 and heads past kHeads are
    // zero): qa[j] = (a0, a2) of k-slice j. bf16: dims 16 j + 2t (+1) and
    // 16 j + 8 + 2t (+1), as stored. fp8 / int8: the lane's dims
    // t D/4 + 4j + (0, 1) and (2, 3), pre-scaled to log2 units and rounded to
    // f16, with sum(q) of the rounded values.
    uint32_t qa[kSlices][2];
    uint32_t q8[kSlices8][4];   // fp8: a0..a3 of k32-slice j, see below
    float qsum_group[kGroups];  // int4: sum(q) over each group, see below
    float qsum = 0.0f, q_unscale = 1.0f;
    {
      const bool real_head = g < kHeads;
      const __nv_bfloat16* row = q + (int64_t{w.token} * d.num_q_heads + w.q_head0 + (real_head ? g : 0)) * kHeadDim;
      if constexpr (kFp8Scores) {
        // q (log2 units) times a power of two that brings head g's largest |q| into [128, 256), as
        // e4m3 hi + lo (the rounding residual): about 2^-8 relative, in rows g (hi) and g + 8 (lo)
        // of the A fragment, so one mma gives both halves of the score (c0 + c2).
        float qv[kLaneDims];
#pragma unroll
        for (int i = 0; i < kLaneDims / 4; ++i) {
          const uint2 raw = *reinterpret_cast<const uint2*>(row + t * kLaneDims + 4 * i);
          const float2 f01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
          const float2 f23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
          qv[4 * i] = real_head ? f01.x * d.scale_log2 : 0.0f;
          qv[4 * i + 1] = real_head ? f01.y * d.scale_log2 : 0.0f;
          qv[4 * i + 2] = real_head ? f23.x * d.scale_log2 : 0.0f;
          qv[4 * i + 3] = real_head ? f23.y * d.scale_log2 : 0.0f;
        }
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < kLaneDims; ++i) amax = fmaxf(amax, fabsf(qv[i]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        int exponent = 0;
        frexpf(amax, &exponent);  // amax in [2^(exponent - 1), 2^exponent)
        const float up = amax > 0.0f ? ldexpf(1.0f, 8 - exponent) : 1.0f;
        q_unscale = 1.0f / up;  // exact: a power of two
        // Per-tensor scales: every K vector's scale is the same, so it joins the unscale.
        if constexpr (kTensorScales) q_unscale *= d.key_tensor_scale;
        uint32_t hi[kLaneDims / 4], lo[kLaneDims / 4];
#pragma unroll
        for (int i = 0; i < kLaneDims / 4; ++i) {
          uint32_t h[2], r[2];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float x = qv[4 * i + 2 * half] * up, y = qv[4 * i + 2 * half + 1] * up;
            h[half] = float2_to_e4m3x2(x, y);
            const float2 back = e4m3x2_to_float2(h[half]);
            r[half] = float2_to_e4m3x2(x - back.x, y - back.y);
          }
          hi[i] = h[0] | (h[1] << 16);
          lo[i] = r[0] | (r[1] << 16);
        }
        // k32-slice j: k 4t..4t+3 are the lane's dims t D/4 + 8j + 0..3 (words 2j), k 16 + 4t.. are + 4..7.
#pragma unroll
        for (int j = 0; j < kSlices8; ++j) {
          q8[j][0] = hi[2 * j];
          q8[j][1] = lo[2 * j];
          q8[j][2] = hi[2 * j + 1];
          q8[j][3] = lo[2 * j + 1];
        }
      } else if constexpr (kBf16) {
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
          qa[j][0] = real_head ? *reinterpret_cast<const uint32_t*>(row + 16 * j + 2 * t) : 0u;
          qa[j][1] = real_head ? *reinterpret_cast<const uint32_t*>(row + 16 * j + 8 + 2 * t) : 0u;
        }
      } else if constexpr (kInt4) {
        // Lane t's dims of group G are 32 G + 8 t + 0..7, the 8 codes of its word of the group;
        // k-slice 2G pairs them (0, 4), (1, 5) and slice 2G + 1 (2, 6), (3, 7): int4x8_to_f16x2's pairs.
        // qsum_group[G]: sum of head g's rounded q over group G (the zero points are per group).
#pragma unroll
        for (int G = 0; G < kGroups; ++G) {
          const uint4 raw = *reinterpret_cast<const uint4*>(row + 32 * G + 8 * t);
          const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
          __half h[8];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
            h[2 * i] = __float2half_rn(real_head ? f.x * d.scale_log2 : 0.0f);
            h[2 * i + 1] = __float2half_rn(real_head ? f.y * d.scale_log2 : 0.0f);
          }
          float sum = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) sum += __half2float(h[i]);
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          qsum_group[G] = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
          const __half2 pairs[4] = {__halves2half2(h[0], h[4]), __halves2half2(h[1], h[5]),
                                    __halves2half2(h[2], h[6]), __halves2half2(h[3], h[7])};
          qa[2 * G][0] = *reinterpret_cast<const uint32_t*>(&pairs[0]);
          qa[2 * G][1] = *reinterpret_cast<const uint32_t*>(&pairs[1]);
          qa[2 * G + 1][0] = *reinterpret_cast<const uint32_t*>(&pairs[2]);
          qa[2 * G + 1][1] = *reinterpret_cast<const uint32_t*>(&pairs[3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
          const uint2 raw = *reinterpret_cast<const uint2*>(row + t * kLaneDims + 4 * j);
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
    }

    float m = kNoScore, l = 0.0f;  // head g (l: this lane's tokens)
    // Per V unit u (int4: group u, else one): acc * unit_scale[u] + zero_sum[u] (head g, this lane's
    // tokens; summed over the lanes at the end) is the value. unit_scale is U above (1 for bf16; the V
    // scale itself for per-tensor scales); it is the same in every lane of the warp.
    float zero_sum[kUnits], unit_scale[kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      zero_sum[u] = 0.0f;
      unit_scale[u] = kTensorScales ? d.value_tensor_scale : 1.0f;
    }
    float acc[kSlices][4];
#pragma unroll
    for (int i = 0; i < kSlices; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

    for (int i = 0; i < my_tiles; ++i) {
      issue_next();
      cp_async_wait<kStages - 1>();
      __syncwarp();

      const uint8_t* stage = warp_smem + consume_stage * S::kBytes;
      consume_stage = consume_stage == kStages - 1 ? 0 : consume_stage + 1;
      const int pos0 = w.kv_begin + (warp + i * kWarps) * kTileTokens;

      // Scores of head g for tokens 8 n + 2t + e, in log2 units; -inf past the end.
      float s[kNTiles][2];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (kBf16) {
          // One ldmatrix.x4 = the B fragments of two k-slices: rows 8 n .. 8 n + 7, chunks 4 jj .. 4 jj + 3.
#pragma unroll
          for (int jj = 0; jj < kSlices / 2; ++jj) {
            uint32_t b[4];
            ldmatrix_x4(b, stage + stage_offset<kRowBytes>(8 * n + (lane & 7), 16 * (4 * jj + (lane >> 3))));
            const uint32_t a_even[4] = {qa[2 * jj][0], 0u, qa[2 * jj][1], 0u};
            const uint32_t a_odd[4] = {qa[2 * jj + 1][0], 0u, qa[2 * jj + 1][1], 0u};
            mma_bf16_16816(c4, a_even, b[0], b[1]);
            mma_bf16_16816(c4, a_odd, b[2], b[3]);
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) s[n][e] = pos0 + 8 * n + 2 * t + e < w.kv_end ? c4[e] * d.scale_log2 : -INFINITY;
        } else if constexpr (kInt4) {
          // Per group G: its two k-slices (lane t: the 8 codes of its word of the group), then the
          // token's K scale and zero of that group.
          const int row = 8 * n + g;
          float part[kGroups][4];
#pragma unroll
          for (int G = 0; G < kGroups; ++G) {
#pragma unroll
            for (int e = 0; e < 4; ++e) part[G][e] = 0.0f;
            uint32_t b[4];
            int4x8_to_f16x2(*reinterpret_cast<const uint32_t*>(stage + stage_offset<kRowBytes>(row, 16 * G + 4 * t)),
                            b);
            mma_f16_16816(part[G], qa[2 * G][0], 0u, qa[2 * G][1], 0u, b[0], b[1]);
            mma_f16_16816(part[G], qa[2 * G + 1][0], 0u, qa[2 * G + 1][1], 0u, b[2], b[3]);
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int tk = 8 * n + 2 * t + e;
            uint32_t records[kGroups];
            load_records<kGroups>(stage + S::kKeyScaleAt + tk * S::kRecordBytes, records);
            float score = 0.0f;
#pragma unroll
            for (int G = 0; G < kGroups; ++G) {
              const KvScale ks = decode_scale_record(records[G], Q);
              score += fmaf(part[G][e], ks.scale, ks.zero * qsum_group[G]);
            }
            s[n][e] = pos0 + tk < w.kv_end ? score : -INFINITY;
          }
        } else {
          const int row = 8 * n + g;
          uint32_t words[kLaneDims / 4];
#pragma unroll
          for (int c = 0; c < kLaneDims / 16; ++c) {
            const uint4 v = *reinterpret_cast<const uint4*>(stage + stage_offset<kRowBytes>(row, t * kLaneDims + 16 * c));
            words[4 * c] = v.x;
            words[4 * c + 1] = v.y;
            words[4 * c + 2] = v.z;
            words[4 * c + 3] = v.w;
          }
          if constexpr (kFp8Scores) {
#pragma unroll
            for (int j = 0; j < kSlices8; ++j) mma_e4m3_16832(c4, q8[j], words[2 * j], words[2 * j + 1]);
            c4[0] = (c4[0] + c4[2]) * q_unscale;  // hi + lo rows
            c4[1] = (c4[1] + c4[3]) * q_unscale;
          } else {
#pragma unroll
            for (int j = 0; j < kSlices; ++j) {
              uint32_t b0, b1;
              codes4_to_f16x2<Q>(words[j], b0, b1);
              mma_f16_16816(c4, qa[j][0], 0u, qa[j][1], 0u, b0, b1);
            }
          }
          // The records of tokens 2t, 2t + 1 of this n-tile, one 8-byte load (per-tensor: in q_unscale).
          uint2 records = {0u, 0u};
          if constexpr (kRecords) records = *reinterpret_cast<const uint2*>(stage + S::kKeyScaleAt + 4 * (8 * n + 2 * t));
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int tk = 8 * n + 2 * t + e;
            float score = c4[e];
            if constexpr (kRecords) {
              const KvScale ks = decode_scale_record(e == 0 ? records.x : records.y, Q);
              score = Q == KvQuant::kFP8E4M3 ? c4[e] * ks.scale : fmaf(c4[e], ks.scale, ks.zero * qsum);
            }
            s[n][e] = pos0 + tk < w.kv_end ? score : -INFINITY;
          }
        }
      }
      // Token eviction's scores (AttentionDescriptor::scores; off: one uniform branch per tile).
      if (d.scores != nullptr && g < kHeads) {
        float* score_row = d.scores + (int64_t{w.token} * d.num_q_heads + w.q_head0 + g) * d.score_stride;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int pos = pos0 + 8 * n + 2 * t + e;
            if (pos < w.kv_end) score_row[pos] = s[n][e];
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

      // Probabilities; quantized: the V scales of this lane's tokens and the tile's unit.
      float p[kNTiles][2], v_scale[kNTiles][2];
      float sum = 0.0f, zeros[kUnits], v_max[kUnits];
#pragma unroll
      for (int u = 0; u < kUnits; ++u) zeros[u] = v_max[u] = 0.0f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        uint2 records = {0u, 0u};
        if constexpr (kRecords && !kInt4)
          records = *reinterpret_cast<const uint2*>(stage + S::kValueScaleAt + 4 * (8 * n + 2 * t));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          p[n][e] = exp2f(s[n][e] - m_new);  // 0 past the end
          sum += p[n][e];
          if constexpr (kInt4) {  // each group's zero sum and largest scale (the V scales join P.V below)
            uint32_t group_records[kGroups];
            load_records<kGroups>(stage + S::kValueScaleAt + (8 * n + 2 * t + e) * S::kRecordBytes, group_records);
#pragma unroll
            for (int G = 0; G < kGroups; ++G) {
              const KvScale vs = decode_scale_record(group_records[G], Q);
              zeros[G] = fmaf(p[n][e], vs.zero, zeros[G]);
              v_max[G] = fmaxf(v_max[G], vs.scale);  // records past the end are zero
            }
          } else if constexpr (kRecords) {
            const KvScale vs = decode_scale_record(e == 0 ? records.x : records.y, Q);
            if constexpr (Q != KvQuant::kFP8E4M3) zeros[0] = fmaf(p[n][e], vs.zero, zeros[0]);
            v_scale[n][e] = vs.scale;
            v_max[0] = fmaxf(v_max[0], vs.scale);  // records past the end are zero
          }
        }
      }
      l = l * correction + sum;
      // Per unit: 1 / the new unit, and old unit / new unit (the same in every lane).
      float inverse_unit[kUnits], unit_ratio[kUnits];
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        inverse_unit[u] = unit_ratio[u] = 1.0f;
        if constexpr (kRecords) {
          zero_sum[u] = zero_sum[u] * correction + zeros[u];
          // The four lanes t of any g hold all the tile's tokens between them.
          v_max[u] = fmaxf(v_max[u], __shfl_xor_sync(0xffffffffu, v_max[u], 1));
          v_max[u] = fmaxf(v_max[u], __shfl_xor_sync(0xffffffffu, v_max[u], 2));
          if (!(v_max[u] > 0.0f)) v_max[u] = 1.0f;
          inverse_unit[u] = 1.0f / v_max[u];
          unit_ratio[u] = unit_scale[u] * inverse_unit[u];
          unit_scale[u] = v_max[u];
        }
      }
      const float correction_even = __shfl_sync(0xffffffffu, correction, 8 * t);     // head 2t
      const float correction_odd = __shfl_sync(0xffffffffu, correction, 8 * t + 4);  // head 2t + 1
#pragma unroll
      for (int m_tile = 0; m_tile < kSlices; ++m_tile) {
        const int u = kInt4 ? m_tile / 2 : 0;  // int4: m-tiles 2G and 2G + 1 are group G's dims
        const float rescale_even = correction_even * unit_ratio[u], rescale_odd = correction_odd * unit_ratio[u];
        acc[m_tile][0] *= rescale_even;
        acc[m_tile][1] *= rescale_odd;
        acc[m_tile][2] *= rescale_even;
        acc[m_tile][3] *= rescale_odd;
      }
      uint32_t pb[kNTiles];  // B fragments of P^T: (tokens 2t, 2t + 1 of n-tile n; head g)
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        if constexpr (kBf16) {
          pb[n] = pack_bf16x2(p[n][0], p[n][1]);
        } else if constexpr (!kRecords) {
          __half2 h = __floats2half2_rn(p[n][0], p[n][1]);  // one V scale for all: in unit_scale
          pb[n] = *reinterpret_cast<uint32_t*>(&h);
        } else if constexpr (!kInt4) {  // int4: per group, in P.V below
          __half2 h = __floats2half2_rn(p[n][0] * v_scale[n][0] * inverse_unit[0],
                                        p[n][1] * v_scale[n][1] * inverse_unit[0]);
          pb[n] = *reinterpret_cast<uint32_t*>(&h);
        }
      }

      // O^T += V^T P^T, 16 tokens (n-tiles 2k, 2k + 1) at a time.
#pragma unroll
      for (int k = 0; k < kNTiles / 2; ++k) {
        if constexpr (kBf16) {
          // ldmatrix.x4.trans of tokens 16 k + (0..7 | 8..15) x chunks (2 mt | 2 mt + 1) = a0..a3 of m-tile mt.
          const int v_row = 16 * k + (lane & 7) + 8 * (lane >> 4);
#pragma unroll
          for (int m_tile = 0; m_tile < kSlices; ++m_tile) {
            uint32_t a[4];
            ldmatrix_x4_trans(a, stage + S::kValueAt + stage_offset<kRowBytes>(v_row, 16 * (2 * m_tile + ((lane >> 3) & 1))));
            mma_bf16_16816(acc[m_tile], a, pb[2 * k], pb[2 * k + 1]);
          }
        } else if constexpr (kInt4) {
          // Tokens of k-columns 2t, 2t + 1 (n-tile 2k) and 2t + 8, 2t + 9 (n-tile 2k + 1). Lane g owns
          // dims 32 G + 4 g + 0..3 of group G: the half-word (g & 1) of word g / 2 of the group's
          // 16 bytes; rows g / g + 8 of m-tile 2G are its dims 0 / 1, of m-tile 2G + 1 its dims 2 / 3.
          const int tokens[4] = {16 * k + 2 * t, 16 * k + 2 * t + 1, 16 * k + 8 + 2 * t, 16 * k + 9 + 2 * t};
          uint32_t records[4][kGroups];
#pragma unroll
          for (int r = 0; r < 4; ++r) load_records<kGroups>(stage + S::kValueScaleAt + tokens[r] * S::kRecordBytes, records[r]);
          const uint32_t halves = (g & 1) ? 0x7632u : 0x5410u;  // that half-word of two tokens' words
#pragma unroll
          for (int G = 0; G < kGroups; ++G) {
            uint32_t words[4];
#pragma unroll
            for (int r = 0; r < 4; ++r)
              words[r] = *reinterpret_cast<const uint32_t*>(stage + S::kValueAt +
                                                            stage_offset<kRowBytes>(tokens[r], 16 * G + 4 * (g >> 1)));
            uint32_t x[4], y[4];  // x[j]: dim j of tokens (2t, 2t + 1); y[j]: of tokens (2t + 8, 2t + 9)
            int4x8_to_f16x2(__byte_perm(words[0], words[1], halves), x);
            int4x8_to_f16x2(__byte_perm(words[2], words[3], halves), y);
            // P^T scaled by this group's V scales over its unit: in [0, 1].
            const float inv = inverse_unit[G];
            const float v0 = decode_scale_record(records[0][G], Q).scale, v1 = decode_scale_record(records[1][G], Q).scale;
            const float v2 = decode_scale_record(records[2][G], Q).scale, v3 = decode_scale_record(records[3][G], Q).scale;
            __half2 b0 = __floats2half2_rn(p[2 * k][0] * v0 * inv, p[2 * k][1] * v1 * inv);
            __half2 b1 = __floats2half2_rn(p[2 * k + 1][0] * v2 * inv, p[2 * k + 1][1] * v3 * inv);
            const uint32_t pb0 = *reinterpret_cast<uint32_t*>(&b0), pb1 = *reinterpret_cast<uint32_t*>(&b1);
            mma_f16_16816(acc[2 * G], x[0], x[1], y[0], y[1], pb0, pb1);
            mma_f16_16816(acc[2 * G + 1], x[2], x[3], y[2], y[3], pb0, pb1);
          }
        } else {
          // Tokens of k-columns 2t, 2t + 1 (n-tile 2k) and 2t + 8, 2t + 9 (n-tile 2k + 1).
          const int tokens[4] = {16 * k + 2 * t, 16 * k + 2 * t + 1, 16 * k + 8 + 2 * t, 16 * k + 9 + 2 * t};
          uint32_t lo[4][kChunk / 4], hi[4][kChunk / 4];  // dims kChunk g + ..., kChunk (g + 8) + ...
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const uint8_t* rows = stage + S::kValueAt;
            const int at_lo = stage_offset<kRowBytes>(tokens[r], kChunk * g);
            const int at_hi = stage_offset<kRowBytes>(tokens[r], kChunk * (g + 8));
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
      }
      __syncwarp();
    }

    // Sums over the four lanes of each head, then back to values (acc * unit + zeros).
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float zero_even[kUnits], zero_odd[kUnits];  // heads 2t and 2t + 1
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      zero_sum[u] += __shfl_xor_sync(0xffffffffu, zero_sum[u], 1);
      zero_sum[u] += __shfl_xor_sync(0xffffffffu, zero_sum[u], 2);
      zero_even[u] = __shfl_sync(0xffffffffu, zero_sum[u], 8 * t);
      zero_odd[u] = __shfl_sync(0xffffffffu, zero_sum[u], 8 * t + 4);
    }

    if (t == 0 && g < kHeads) {
      partials.m[warp * kHeads + g] = m;
      partials.l[warp * kHeads + g] = l;
    }
#pragma unroll
    for (int m_tile = 0; m_tile < kSlices; ++m_tile) {
      // Rows g and g + 8 of m-tile m_tile are these dims (bf16: as stored; fp8 / int8 / int4: the lane's
      // permutation, int4's within group m_tile / 2).
      const int dim_lo = kBf16   ? 16 * m_tile + g
                         : kInt4 ? 32 * (m_tile / 2) + 4 * g + 2 * (m_tile % 2)
                                 : kChunk * g + m_tile;
      const int dim_hi = kBf16 ? 16 * m_tile + 8 + g : kInt4 ? dim_lo + 1 : kChunk * (g + 8) + m_tile;
      const int u = kInt4 ? m_tile / 2 : 0;
      if (2 * t < kHeads) {
        float* dst = partials.acc_row(warp, 2 * t);
        dst[dim_lo] = acc[m_tile][0] * unit_scale[u] + zero_even[u];
        dst[dim_hi] = acc[m_tile][2] * unit_scale[u] + zero_even[u];
      }
      if (2 * t + 1 < kHeads) {
        float* dst = partials.acc_row(warp, 2 * t + 1);
        dst[dim_lo] = acc[m_tile][1] * unit_scale[u] + zero_odd[u];
        dst[dim_hi] = acc[m_tile][3] * unit_scale[u] + zero_odd[u];
      }
    }
    __syncthreads();
    write_decode_result(d, w, partials, out);
    __syncthreads();  // the partials are rewritten by the next unit
  }
  cp_async_wait<0>();  // nothing left in flight at exit (all trailing groups are empty)
}

template <int kHeadDim, int kHeads, KvQuant Q, int kTileTokens, int kStages, bool kTensorScales>
cudaError_t launch_tiles(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                         cudaStream_t stream) {
  using S = MmaStage<kHeadDim, Q, kTileTokens, kTensorScales>;
  constexpr int smem_bytes = kWarps * kStages * S::kBytes + WarpPartials<kWarps, kHeads, kHeadDim>::kFloats * 4;
  constexpr auto kernel = decode_attention_mma_kernel<kHeadDim, kHeads, Q, kTileTokens, kStages, kTensorScales>;
  const int64_t units = int64_t{d.num_work_items} * (d.num_q_heads / kHeads);  // one CTA each
  return launch_split_decode<kernel, smem_bytes, kWarps * 32>(d, q, out, stream, dim3(static_cast<unsigned>(units)));
}

template <int kHeadDim, int kHeads, KvQuant Q, bool kTensorScales>
cudaError_t launch_variant(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                           cudaStream_t stream) {
  return launch_tiles<kHeadDim, kHeads, Q, default_tile_tokens(kHeadDim, Q), default_stages(Q), kTensorScales>(
      d, q, out, stream);
}

template <KvQuant Q, bool kTensorScales = false>
cudaError_t launch_format(const AttentionDescriptor& d, const __nv_bfloat16* q, __nv_bfloat16* out,
                          cudaStream_t stream) {
  switch (d.head_dim * 8 + d.q_heads_per_cta) {
    case 64 * 8 + 1: return launch_variant<64, 1, Q, kTensorScales>(d, q, out, stream);
    case 64 * 8 + 2: return launch_variant<64, 2, Q, kTensorScales>(d, q, out, stream);
    case 64 * 8 + 4: return launch_variant<64, 4, Q, kTensorScales>(d, q, out, stream);
    case 128 * 8 + 1: return launch_variant<128, 1, Q, kTensorScales>(d, q, out, stream);
    case 128 * 8 + 2: return launch_variant<128, 2, Q, kTensorScales>(d, q, out, stream);
    case 128 * 8 + 4: return launch_variant<128, 4, Q, kTensorScales>(d, q, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

// fp8 pools whose every vector has the same K and the same V scale (a
// checkpoint's calibrated k_scale / v_scale): the kernel reads no records.
bool fp8_tensor_scales(const AttentionDescriptor& d) {
  return d.key_element == KvElement::kFP8E4M3 && d.key_tensor_scale > 0.0f && d.value_tensor_scale > 0.0f;
}

}  // namespace

bool decode_attention_mma_supports(const AttentionDescriptor& d) {
  if (d.decode_cuda_cores || (d.head_dim != 64 && d.head_dim != 128) || d.key_element != d.value_element) return false;
  switch (d.key_element) {
    case KvElement::kBF16:
      // The copies address token vectors (block * block_size + slot) * num_kv_heads + head: the plan's layout.
      return d.token_stride == int64_t{d.num_kv_heads} * d.head_dim && d.block_stride == d.token_stride * d.block_size;
    case KvElement::kFP8E4M3:
    case KvElement::kInt8:
    case KvElement::kInt4: return true;
    default: return false;
  }
}

cudaError_t launch_decode_attention_mma(const AttentionDescriptor& d, const void* q, void* out, cudaStream_t stream) {
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  if (d.key_element != KvElement::kBF16 && !fp8_tensor_scales(d) && d.num_work_items > 0 &&
      (d.key_scale == nullptr || d.value_scale == nullptr))
    return cudaErrorInvalidValue;
  switch (d.key_element) {
    case KvElement::kBF16: return launch_format<KvQuant::kNone>(d, qb, ob, stream);
    case KvElement::kFP8E4M3:
      return fp8_tensor_scales(d) ? launch_format<KvQuant::kFP8E4M3, true>(d, qb, ob, stream)
                                  : launch_format<KvQuant::kFP8E4M3>(d, qb, ob, stream);
    case KvElement::kInt8: return launch_format<KvQuant::kInt8>(d, qb, ob, stream);
    case KvElement::kInt4: return launch_format<KvQuant::kInt4>(d, qb, ob, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t prepare_decode_attention_mma() {
  AttentionDescriptor empty;  // zero work items: sets the attributes, enqueues nothing
  for (KvElement e : {KvElement::kBF16, KvElement::kFP8E4M3, KvElement::kInt8, KvElement::kInt4}) {
    for (float tensor_scale : {0.0f, 1.0f}) {  // fp8: per-vector records, then per-tensor scales
      if (tensor_scale > 0.0f && e != KvElement::kFP8E4M3) continue;
      for (int head_dim : {64, 128}) {
        for (int heads : {1, 2, 4}) {
          empty.key_element = empty.value_element = e;
          empty.key_tensor_scale = empty.value_tensor_scale = tensor_scale;
          empty.head_dim = head_dim;
          empty.q_heads_per_cta = heads;
          const cudaError_t err = launch_decode_attention_mma(empty, nullptr, nullptr, nullptr);
          if (err != cudaSuccess) return err;
        }
      }
    }
  }
  return cudaSuccess;
}

}  // namespace pagoda::kernels::cuda
