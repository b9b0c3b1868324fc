// Paged MLA decode on Hopper's warpgroup MMA (wgmma, sm_90a): the kernels
// behind mla_decode_descriptor.h (planned by mla_decode.h).
//
// Two kernels, both one CTA of 2 warpgroups (256 threads, one CTA per SM) per
// (head tile, list of segments of the plan), 64 KV positions per tile; the
// latent is MQA's single KV head, so a CTA reads each cached vector once for
// all of its heads. More than 16 heads (mla_decode_kernel): a tile of 64 query
// heads (rows past num_heads are zeros). Per tile:
//   S = Q K^T     64 heads x 64 positions, K dim 576: warpgroup g computes the
//                 positions [32 g, 32 g + 32) as 36 wgmma m64n32k16, Q and K both
//                 read K-major straight from shared memory;
//   softmax       online, in log2 units; the two groups swap their row maxima
//                 through shared memory so both scale by the same maximum;
//                 P (bf16) goes to shared memory, each group writing its 32 columns;
//   O += P V      warpgroup g owns the latent dims [256 g, 256 g + 256): 4 k-steps
//                 x 2 wgmma m64n128k16 with P K-major and V MN-major from the
//                 same shared tile that served as K (its first 512 columns).
// At most 16 heads: mla_decode_narrow_kernel (below), positions as the MMA rows.
// Tiles (and Q) are stored in shared memory as 9 column blocks of 64 values x
// rows of 128 B with the 128-byte swizzle (16-byte chunk c of row r at
// c ^ (r % 8)), which is at once the K-major layout of S's operands and the
// MN-major layout of V, so one copy of the latent serves both products.
// bf16 pools: tiles are gathered with 16-byte cp.async through the block table
// (4 threads a position, one table read each) into a double buffer, refilled as
// soon as a tile is consumed, so two tiles are in flight while one is computed.
// fp8 pools: the codes (576 B a position) and the scale records land in a
// double-buffered staging area, are converted to bf16 (exact: e4m3 fits in
// bf16) into the tile, and the per-position scale stays outside the products:
// S[h, t] = (q_h . codes_t) * scale_t, and P[h, t] = p[h, t] * scale_t against
// the unscaled codes as V (bf16's exponent range keeps p * scale clear of
// subnormals).
// FlashMLA's 656-byte fp8 records: the conversion multiplies each code by its
// group's scale (one per 128 latent values) while rounding to bf16, and copies
// the bf16 rope values, so S and P need no scales. The narrow kernel stages
// whole records; the 64-head kernel stages codes and rope only (its shared
// memory has no room for two stages of whole records) and loads each
// position's 4 scales into registers when it issues the copies.
// A segment that is not its row's only one writes its normalized partial
// output and log2-sum-exp to the workspace; mla_decode_merge combines them.
// docs/KERNELS.md ("MLA decode") has the versions and their measurements.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_descriptor.h"
#include "pagoda/backend/cuda/attention/mla_decode_merge.cuh"
#include "pagoda/backend/cuda/attention/mla_decode_narrow.cuh"
#include "pagoda/backend/cuda/attention/wgmma_primitives.cuh"

namespace pagoda::kernels::cuda {
namespace {

using namespace device;

constexpr int kThreads = 256;
constexpr int kHeads = 64;        // query heads per CTA (rows of the MMAs)
constexpr int kTile = 64;         // KV positions per tile
[[maybe_unused]] constexpr int kColumnBlocks = 9;  // 576 / 64
constexpr int kBlockBytes = 64 * 128;                    // one column block of a 64-row tile
constexpr int kTileBytes = kColumnBlocks * kBlockBytes;  // 73,728: Q, or one KV tile
[[maybe_unused]] constexpr int kKeyChunks = kMlaKeyDim / 8;               // 72 16-byte bf16 chunks a vector
[[maybe_unused]] constexpr int kCodeChunks = kMlaKeyDim / 16;             // 36 16-byte fp8 chunks a vector
[[maybe_unused]] constexpr int kStagingBytes = kTile * kMlaKeyDim;        // fp8 codes of one tile
// Latent formats of the kernels' template parameter.
constexpr int kBf16 = 0;          // bf16 values
constexpr int kFp8Vector = 1;     // fp8 codes + one scale record a vector (runtime/kv_quant.h)
constexpr int kFp8FlashMla = 2;   // FlashMLA's 656-byte records (runtime/mla_fp8_layout.h)
constexpr int kFlashRecordBytes = 656;
constexpr int kFlashScalesAt = 512, kFlashRopeAt = 528;
[[maybe_unused]] constexpr int kFlashRecordChunks = kFlashRecordBytes / 16;  // 41
[[maybe_unused]] constexpr int kFlashStagingBytes = kTile * kFlashRecordBytes;
[[maybe_unused]] constexpr float kNoScore = -1e30f;

// Shared memory (after aligning the base to 1024 B): Q | KV tile 0 | KV tile 1
// (fp8: one bf16 tile, then two staging areas of codes) | P | 2 stages of 64 scales |
// row maxima [2][64] | row sums [2][64].
[[maybe_unused]] constexpr int kQAt = 0;
[[maybe_unused]] constexpr int kTilesAt = kTileBytes;
[[maybe_unused]] constexpr int kPAt = 3 * kTileBytes;
[[maybe_unused]] constexpr int kScalesAt = kPAt + kBlockBytes;
[[maybe_unused]] constexpr int kMaxAt = kScalesAt + 2 * kTile * 4;
[[maybe_unused]] constexpr int kSumAt = kMaxAt + 2 * kHeads * 4;
constexpr int kSmemBytes = kSumAt + 2 * kHeads * 4 + 1024;
static_assert(2 * kStagingBytes <= kTileBytes, "fp8 staging fits in the second tile's room");
static_assert(kSmemBytes <= 232448, "one CTA per SM");
// FlashMLA records in the wide kernel: two stages of 64 whole records (83,968 B)
// do not fit beside Q and the bf16 tile, so a stage holds only the codes and the
// rope values (640 B a position, the 4 group scales go to registers), P lives in
// the bf16 tile's rope column block (free once both groups' S is done: V is the
// first 512 columns), the row sums in Q's room (free after the last S), and the
// row maxima after the staging:
//   Q | bf16 tile (column block 8 doubles as P) | 2 stages x 64 x 640 | row maxima [2][64].
constexpr int kWideFlashStagedBytes = 640;  // 512 codes + 128 B of bf16 rope a position
constexpr int kWideFlashStageBytes = kTile * kWideFlashStagedBytes;
[[maybe_unused]] constexpr int kWideFlashPAt = kTilesAt + 8 * kBlockBytes;
[[maybe_unused]] constexpr int kWideFlashStagingAt = kTilesAt + kTileBytes;
[[maybe_unused]] constexpr int kWideFlashMaxAt = kWideFlashStagingAt + 2 * kWideFlashStageBytes;
static_assert(kWideFlashMaxAt + 2 * kHeads * 4 + 1024 <= kSmemBytes, "the FlashMLA layout fits the wide kernel's");
static_assert(kWideFlashPAt % 1024 == 0, "P stays 1024-byte aligned");

// Byte offset of (row, 16-byte chunk 0..71) in a swizzled 64-row tile.
[[maybe_unused]] __device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return (chunk >> 3) * kBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

[[maybe_unused]] __device__ __forceinline__ void keep_in_order(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d[16] (+)= A * B for m64n32k16, A and B K-major in shared memory. Accumulator
// layout as wgmma_m64n128k16_ss: d[4j + {0,1}] = row 16w + t/4, cols 8j + 2(t%4) + {0,1};
// d[4j + {2,3}] the same cols of row + 8.
[[maybe_unused]] __device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[64] += A * B for m64n128k16: A K-major, B MN-major (transposed), both in shared memory.
[[maybe_unused]] __device__ __forceinline__ void wgmma_m64n128k16_ss_transb(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// Sixteen e4m3 codes times `scale` -> sixteen bf16 (rounded to nearest even).
[[maybe_unused]] __device__ __forceinline__ void fp8x16_scaled_to_bf16(const uint4& codes, float scale, uint4& lo,
                                                                       uint4& hi) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * half));
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      out[2 * i + half] = pack_bf16x2(f.x * scale, f.y * scale);
    }
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}
// Sixteen e4m3 codes -> sixteen bf16 (exact: e4m3 fits in bf16; x * 1 is x).
[[maybe_unused]] __device__ __forceinline__ void fp8x16_to_bf16(const uint4& codes, uint4& lo, uint4& hi) {
  fp8x16_scaled_to_bf16(codes, 1.0f, lo, hi);
}

// Gathers the tile of positions [kv0, kv0 + 64) of a row (those below kv_end)
// into stage `stage`, 4 threads a position (load_pos, load_lane): bf16 straight
// into the swizzled tile at tiles + stage * kTileBytes; fp8 codes into the
// staging area that follows the first tile, and the scale records into scales;
// FlashMLA records whole (41 chunks) into that staging area.
template <int kFormat>
__device__ __forceinline__ void issue_latent_tile(const MlaDecodeDescriptor& d, const int32_t* table, int kv0,
                                                  int kv_end, uint8_t* tiles, float* scales, int stage, int load_pos,
                                                  int load_lane) {
  const int pos = kv0 + load_pos;
  const bool valid = pos < kv_end;
  const int bs = d.block_size;
  const int64_t slot = valid ? int64_t{table[pos / bs]} * bs + pos % bs : 0;
  if constexpr (kFormat == kFp8FlashMla) {
    uint8_t* dst = tiles + kTileBytes + stage * kFlashStagingBytes + load_pos * kFlashRecordBytes;
    const uint8_t* src = static_cast<const uint8_t*>(d.latent) + slot * kFlashRecordBytes;
#pragma unroll
    for (int k = 0; k < (kFlashRecordChunks + 3) / 4; ++k) {
      const int c = load_lane + 4 * k;
      if (c < kFlashRecordChunks) cp_async_16(dst + c * 16, src + c * 16, valid);
    }
  } else if constexpr (kFormat == kBf16) {
    uint8_t* dst = tiles + stage * kTileBytes;
    const uint8_t* latent = static_cast<const uint8_t*>(d.latent);
    if (d.latent_layout == MlaLatentLayout::kBf16SwizzledPages) {
      // The page's column block cb holds row r's chunk c at cb * bs * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16
      // (runtime/mla_latent_layout.h): the same bytes, read from where the page keeps them.
      const int r = valid ? pos % bs : 0;
      const uint8_t* row = latent + (slot - r) * (kMlaKeyDim * 2) + r * 128;
#pragma unroll
      for (int k = 0; k < kKeyChunks / 4; ++k) {
        const int c = load_lane + 4 * k;
        cp_async_16(dst + tile_offset(load_pos, c), row + int64_t{c >> 3} * bs * 128 + (((c & 7) ^ (r & 7)) << 4),
                    valid);
      }
      return;
    }
    const uint8_t* src = latent + slot * (kMlaKeyDim * 2);
#pragma unroll
    for (int k = 0; k < kKeyChunks / 4; ++k) {
      const int c = load_lane + 4 * k;
      cp_async_16(dst + tile_offset(load_pos, c), src + c * 16, valid);
    }
  } else {
    uint8_t* dst = tiles + kTileBytes + stage * kStagingBytes + load_pos * kMlaKeyDim;
    const uint8_t* src = static_cast<const uint8_t*>(d.latent) + slot * kMlaKeyDim;
#pragma unroll
    for (int k = 0; k < kCodeChunks / 4; ++k) {
      const int c = load_lane + 4 * k;
      cp_async_16(dst + c * 16, src + c * 16, valid);
    }
    if (load_lane == 0) cp_async_ca<4>(scales + stage * kTile + load_pos, d.latent_scale + slot, valid);
  }
}

// fp8: this thread's quarter of position load_pos, from staging `stage` into
// the bf16 tile at `tiles` (exact conversion; the scales stay outside).
[[maybe_unused]] __device__ __forceinline__ void convert_fp8_tile(uint8_t* tiles, int stage, int load_pos, int load_lane) {
  const uint8_t* staged = tiles + kTileBytes + stage * kStagingBytes + load_pos * kMlaKeyDim;
#pragma unroll
  for (int k = 0; k < kCodeChunks / 4; ++k) {
    const int c = load_lane + 4 * k;
    const uint4 codes = *reinterpret_cast<const uint4*>(staged + c * 16);
    uint4 lo, hi;
    fp8x16_to_bf16(codes, lo, hi);
    *reinterpret_cast<uint4*>(tiles + tile_offset(load_pos, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(tiles + tile_offset(load_pos, 2 * c + 1)) = hi;
  }
}

// FlashMLA records: this thread's quarter of position load_pos, from the
// staged codes (at `staged`, the bf16 rope at staged + rope_at) into the bf16
// tile: codes times their group's scale (dequantized here, so the products
// need no scales), the bf16 rope chunks copied. Code chunk c = load_lane + 4 k
// is in group c / 8 = k / 2.
[[maybe_unused]] __device__ __forceinline__ void convert_flash_record(uint8_t* tiles, const uint8_t* staged,
                                                                      int rope_at, const float4& group_scale,
                                                                      int load_pos, int load_lane) {
  const float gs[4] = {group_scale.x, group_scale.y, group_scale.z, group_scale.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int c = load_lane + 4 * k;  // code chunk 0..31
    const uint4 codes = *reinterpret_cast<const uint4*>(staged + c * 16);
    uint4 lo, hi;
    fp8x16_scaled_to_bf16(codes, gs[k >> 1], lo, hi);
    *reinterpret_cast<uint4*>(tiles + tile_offset(load_pos, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(tiles + tile_offset(load_pos, 2 * c + 1)) = hi;
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int j = 2 * load_lane + k;  // rope chunk 0..7 = tile chunk 64 + j
    *reinterpret_cast<uint4*>(tiles + tile_offset(load_pos, 64 + j)) =
        *reinterpret_cast<const uint4*>(staged + rope_at + 16 * j);
  }
}

// The narrow kernel's staging holds whole records (scales included).
[[maybe_unused]] __device__ __forceinline__ void convert_flash_tile(uint8_t* tiles, int stage, int load_pos,
                                                                    int load_lane) {
  const uint8_t* staged = tiles + kTileBytes + stage * kFlashStagingBytes + load_pos * kFlashRecordBytes;
  convert_flash_record(tiles, staged, kFlashRopeAt, *reinterpret_cast<const float4*>(staged + kFlashScalesAt),
                       load_pos, load_lane);
}

// The wide kernel's FlashMLA staging: this thread's quarter of the codes and
// rope values of position kv0 + load_pos (10 of the 40 chunks; the record's
// scale chunk is skipped) into stage `stage`, and the position's 4 group scales
// into `group_scale` (a register load, consumed when the stage is converted;
// zeros past kv_end, where the codes are zero-filled too).
[[maybe_unused]] __device__ __forceinline__ void issue_flash_wide_tile(const MlaDecodeDescriptor& d,
                                                                       const int32_t* table, int kv0, int kv_end,
                                                                       uint8_t* staging, int stage, int load_pos,
                                                                       int load_lane, float4& group_scale) {
  const int pos = kv0 + load_pos;
  const bool valid = pos < kv_end;
  const int bs = d.block_size;
  const int64_t slot = valid ? int64_t{table[pos / bs]} * bs + pos % bs : 0;
  uint8_t* dst = staging + stage * kWideFlashStageBytes + load_pos * kWideFlashStagedBytes;
  const uint8_t* src = static_cast<const uint8_t*>(d.latent) + slot * kFlashRecordBytes;
#pragma unroll
  for (int k = 0; k < kWideFlashStagedBytes / 16 / 4; ++k) {
    const int c = load_lane + 4 * k;  // staged chunk 0..39: codes 0..31, rope 32..39 (record chunks 33..40)
    cp_async_16(dst + c * 16, src + (c < 32 ? c : c + 1) * 16, valid);
  }
  group_scale =
      valid ? __ldg(reinterpret_cast<const float4*>(src + kFlashScalesAt)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

template <int kFormat>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_kernel(const MlaDecodeDescriptor d, const __nv_bfloat16* __restrict__ q,
                      __nv_bfloat16* __restrict__ out) {
  [[maybe_unused]] constexpr bool kFp8 = kFormat != kBf16;
  [[maybe_unused]] constexpr bool kFlash = kFormat == kFp8FlashMla;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The portable compute_90 PTX has no wgmma: this body exists only in the sm_90a machine code.
  __trap();
#else
  launch_dependents();  // the merge pass (programmatic_merge) may be scheduled now: it waits for this grid
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_address(smem_raw);
  uint8_t* base = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  uint8_t* q_tile = base + kQAt;
  uint8_t* p_tile = base + (kFlash ? kWideFlashPAt : kPAt);
  float* scales = reinterpret_cast<float*>(base + kScalesAt);  // per-vector fp8: [2 stages][64]
  float* row_max = reinterpret_cast<float*>(base + (kFlash ? kWideFlashMaxAt : kMaxAt));  // [2 groups][64 heads]
  float* row_sum = reinterpret_cast<float*>(base + (kFlash ? kQAt : kSumAt));

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warpgroup = tid >> 7;
  const int wg_warp = (tid >> 5) & 3;
  const int head0 = blockIdx.x * kHeads;
  const int heads_here = min(kHeads, d.num_heads - head0);
  // This thread's two accumulator rows (heads of the tile).
  const int r0 = wg_warp * 16 + (lane >> 2);
  const int r1 = r0 + 8;
  const int col = 2 * (lane & 3);  // first accumulator column of each 8-column block
  // The loaders: 4 threads a position.
  const int load_pos = tid >> 2;
  const int load_lane = tid & 3;

  const int seg_begin = d.cta_segment_start[blockIdx.y];
  const int seg_end = d.cta_segment_start[blockIdx.y + 1];
  for (int seg = seg_begin; seg < seg_end; ++seg) {
    const int row = d.segments[3 * seg];
    const int kv_begin = d.segments[3 * seg + 1];
    const int kv_end = d.segments[3 * seg + 2];
    const int32_t* table = d.block_tables + d.block_table_start[row];
    const int num_tiles = (kv_end - kv_begin + kTile - 1) / kTile;

    __syncthreads();  // the previous segment is done with every buffer
    // Q of heads [head0, head0 + 64): 64 rows x 72 chunks.
    {
      const __nv_bfloat16* q_row = q + (int64_t{row} * d.num_heads + head0) * kMlaKeyDim;
#pragma unroll 6
      for (int i = 0; i < kHeads * kKeyChunks / kThreads; ++i) {
        const int idx = tid + i * kThreads;
        const int r = idx / kKeyChunks, c = idx % kKeyChunks;
        const bool valid = r < heads_here;
        cp_async_16(q_tile + tile_offset(r, c), valid ? q_row + r * kMlaKeyDim + c * 8 : q, valid);
      }
    }
    // Gathers the tile starting at position kv0 into stage `stage`: bf16 straight
    // into the swizzled tile, fp8 codes into staging (and the scales).
    // FlashMLA records: each stage's 4 group scales of this thread's position.
    float4 group_scale[2];
    auto issue_tile = [&](int kv0, int stage) {
      if constexpr (kFlash) {
        float4 gs;
        issue_flash_wide_tile(d, table, kv0, kv_end, base + kWideFlashStagingAt, stage, load_pos, load_lane, gs);
        if (stage == 0) group_scale[0] = gs;
        else group_scale[1] = gs;
      } else {
        issue_latent_tile<kFormat>(d, table, kv0, kv_end, base + kTilesAt, scales, stage, load_pos, load_lane);
      }
    };
    // Two tiles in flight: the next tile's copies are issued as soon as the
    // buffer they overwrite has been consumed, so while a tile is computed the
    // following one (bf16) or two (fp8 staging) are on their way.
    issue_tile(kv_begin, 0);
    cp_async_commit();
    if (num_tiles > 1) issue_tile(kv_begin + kTile, 1);
    cp_async_commit();

    float o[2][64];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[n][i] = 0.0f;
    float m[2] = {kNoScore, kNoScore};
    float l[2] = {0.0f, 0.0f};
    const uint32_t q_addr = smem_address(q_tile);
    const uint32_t p_addr = smem_address(p_tile);

    for (int tile = 0; tile < num_tiles; ++tile) {
      const int kv0 = kv_begin + tile * kTile;
      [[maybe_unused]] const int stage = tile & 1;
      cp_async_wait<1>();  // this tile's group is done; the next one may still run
      float pos_scale[8] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};  // fp8: scales of the 8 columns
      uint8_t* kv_tile;
      if constexpr (!kFp8) {
        fence_proxy_async_shared();  // cp.async wrote in the generic proxy; wgmma reads in the async one
        __syncthreads();             // the tile has landed for every thread
        kv_tile = base + kTilesAt + stage * kTileBytes;
      } else {
        __syncthreads();  // staging landed; every group is done with the bf16 tile
        kv_tile = base + kTilesAt;
        if constexpr (kFlash) {
          convert_flash_record(kv_tile,
                               base + kWideFlashStagingAt + stage * kWideFlashStageBytes +
                                   load_pos * kWideFlashStagedBytes,
                               kMlaLatentDim, stage == 0 ? group_scale[0] : group_scale[1], load_pos, load_lane);
        } else {
          convert_fp8_tile(kv_tile, stage, load_pos, load_lane);
        }
        fence_proxy_async_shared();
        __syncthreads();  // the tile is converted: its staging buffer is free
        if constexpr (!kFlash) {
          // The scales leave the staging area (every thread's, hence the barrier)
          // before tile + 2's copies overwrite it. (FlashMLA records were
          // dequantized whole by the conversion.)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) pos_scale[2 * j + e] = scales[stage * kTile + warpgroup * 32 + 8 * j + col + e];
          __syncthreads();
        }
        if (tile + 2 < num_tiles) issue_tile(kv0 + 2 * kTile, stage);
        cp_async_commit();
      }
      const uint32_t kv_addr = smem_address(kv_tile);

      // S = Q K^T over this group's 32 positions.
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.0f;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kMlaKeyDim / 16; ++ks) {
        const uint32_t step = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
        wgmma_m64n32k16_ss(s, make_smem_desc_sw128(q_addr + step, 16, 1024),
                           make_smem_desc_sw128(kv_addr + warpgroup * 32 * 128 + step, 16, 1024), ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 16; ++i) keep_in_order(s[i]);

      // Scores in log2 units; positions past the segment never count.
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = warpgroup * 32 + 8 * j + col + e;
          const bool valid = kv0 + t < kv_end;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float& v = s[4 * j + 2 * i + e];
            v = valid ? v * pos_scale[2 * j + e] * d.scale_log2 : kNoScore;
          }
        }
      float tile_max[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = kNoScore;
#pragma unroll
        for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        tile_max[i] = mx;
      }
      if ((lane & 3) == 0) {
        row_max[warpgroup * kHeads + r0] = tile_max[0];
        row_max[warpgroup * kHeads + r1] = tile_max[1];
      }
      __syncthreads();  // both groups' maxima are in
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = i == 0 ? r0 : r1;
        const float m_new = fmaxf(m[i], fmaxf(row_max[r], row_max[kHeads + r]));
        const float correction = exp2f(m[i] - m_new);
        m[i] = m_new;
        l[i] *= correction;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            o[n][4 * j + 2 * i] *= correction;
            o[n][4 * j + 2 * i + 1] *= correction;
          }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float p0 = exp2f(s[4 * j + 2 * i] - m_new);
          const float p1 = exp2f(s[4 * j + 2 * i + 1] - m_new);
          l[i] += p0 + p1;
          // P[r][position]: chunk (group * 4 + j) of row r, bytes 4 (t % 4) of it.
          const uint32_t at = r * 128 + ((((warpgroup * 4 + j) ^ (r & 7))) << 4) + 2 * col;
          *reinterpret_cast<uint32_t*>(p_tile + at) = pack_bf16x2(p0 * pos_scale[2 * j], p1 * pos_scale[2 * j + 1]);
        }
      }
      fence_proxy_async_shared();
      __syncthreads();  // P is complete

      // O[:, 256 g + 128 n + ...] += P V.
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) keep_in_order(o[n][i]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        const uint64_t desc_p = make_smem_desc_sw128(p_addr + kk * 32, 16, 1024);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const uint32_t v_addr = kv_addr + (warpgroup * 4 + 2 * n) * kBlockBytes + kk * 16 * 128;
          wgmma_m64n128k16_ss_transb(o[n], desc_p, make_smem_desc_sw128(v_addr, kBlockBytes, 1024));
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) keep_in_order(o[n][i]);
      if constexpr (!kFp8) {
        __syncthreads();  // both groups are done with this stage: refill it
        if (tile + 2 < num_tiles) issue_tile(kv0 + 2 * kTile, stage);
        cp_async_commit();
      }
    }

    // Row sums: over the quad, then over both groups (they share the maxima).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    if ((lane & 3) == 0) {
      row_sum[warpgroup * kHeads + r0] = l[0];
      row_sum[warpgroup * kHeads + r1] = l[1];
    }
    __syncthreads();
    const bool split = d.row_segment_start[row + 1] - d.row_segment_start[row] > 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? r0 : r1;
      if (r >= heads_here) continue;
      const float sum = row_sum[r] + row_sum[kHeads + r];
      const float inv = 1.0f / sum;
      const int head = head0 + r;
      if (!split) {
        __nv_bfloat16* dst = out + (int64_t{row} * d.num_heads + head) * kMlaLatentDim + warpgroup * 256;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int j = 0; j < 16; ++j)
            *reinterpret_cast<uint32_t*>(dst + 128 * n + 8 * j + col) =
                pack_bf16x2(o[n][4 * j + 2 * i] * inv, o[n][4 * j + 2 * i + 1] * inv);
      } else {
        float* dst = d.workspace + (int64_t{seg} * d.num_heads + head) * kMlaLatentDim + warpgroup * 256;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int j = 0; j < 16; ++j)
            *reinterpret_cast<float2*>(dst + 128 * n + 8 * j + col) =
                make_float2(o[n][4 * j + 2 * i] * inv, o[n][4 * j + 2 * i + 1] * inv);
        if (warpgroup == 0 && (lane & 3) == 0) {
          float* lse = d.workspace + int64_t{d.num_segments} * d.num_heads * kMlaLatentDim;
          lse[int64_t{seg} * d.num_heads + head] = m[i] + log2f(sum);
        }
      }
    }
  }
#endif
}

// ---- Narrow rows: at most 16 heads (DeepSeek-V2-Lite); the per-tile math below is
// mla_decode_narrow.cuh's, shared with the TMA kernels. A 64-head tile would be
// three-quarters padding, and its tensor-core time would exceed the memory time
// (a 64 x 64 x 576 S-GEMM and 64 x 512 x 64 P V per 64 positions, 4x the useful
// work). Here the positions are the MMA rows instead:
//   S^T = K Q^T   64 positions x 16 heads, 36 wgmma m64n16k16 (K the A operand,
//                 Q the B operand, both K-major), 18 per warpgroup over half the K
//                 dims each; the halves are swapped through shared memory and both
//                 groups then hold all of S^T and run the same softmax;
//   softmax       per head = per column: the column maxima go through the
//                 warpgroup's 4 warps in shared memory; each thread's 4 heads are
//                 the same 4 columns in S^T and in O^T, so the online rescaling
//                 needs no shuffle;
//   O^T += V^T P^T  warpgroup g owns dims [256 g, 256 g + 256) = 4 m-tiles of 64:
//                 4 k-steps x 4 wgmma m64n16k16 with V^T read MN-major (transposed
//                 A) from the same tile, and P^T (its own copy, [head][position],
//                 K-major) as B.
constexpr int kNarrowHeads = 16;
[[maybe_unused]] constexpr int kNarrowQBlockBytes = kNarrowHeads * 128;  // one column block of Q
[[maybe_unused]] constexpr int kNarrowQBytes = kColumnBlocks * kNarrowQBlockBytes;
[[maybe_unused]] constexpr int kNarrowTilesAt = kNarrowQBytes;
// The latent region: bf16, two tiles; fp8, one bf16 tile and two staging areas
// (of codes, or of whole FlashMLA records: the larger).
[[maybe_unused]] constexpr int kNarrowLatentBytes =
    (kTileBytes + 2 * kFlashStagingBytes + 1023) / 1024 * 1024 > 2 * kTileBytes
        ? (kTileBytes + 2 * kFlashStagingBytes + 1023) / 1024 * 1024
        : 2 * kTileBytes;
[[maybe_unused]] constexpr int kNarrowPAt = kNarrowTilesAt + kNarrowLatentBytes;
[[maybe_unused]] constexpr int kNarrowScalesAt = kNarrowPAt + 2 * kNarrowHeads * 128;
[[maybe_unused]] constexpr int kNarrowMaxAt = kNarrowScalesAt + 2 * kTile * 4;
[[maybe_unused]] constexpr int kNarrowSumAt = kNarrowMaxAt + 2 * 4 * kNarrowHeads * 4;
[[maybe_unused]] constexpr int kNarrowPartialAt = kNarrowSumAt + 2 * 4 * kNarrowHeads * 4;  // S^T halves [2][128][8]
constexpr int kNarrowSmemBytes = kNarrowPartialAt + 2 * 128 * 8 * 4 + 1024;
static_assert(kNarrowQBytes % 1024 == 0 && kNarrowPAt % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
static_assert(kNarrowSmemBytes <= 232448, "one CTA per SM");

template <int kFormat>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_narrow_kernel(const MlaDecodeDescriptor d, const __nv_bfloat16* __restrict__ q,
                             __nv_bfloat16* __restrict__ out) {
  [[maybe_unused]] constexpr bool kFp8 = kFormat != kBf16;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  launch_dependents();  // the merge pass (programmatic_merge) may be scheduled now: it waits for this grid
  static_assert(kNarrowHeads == mla_narrow::kHeads && kThreads == mla_narrow::kComputeThreads);
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_address(smem_raw);
  uint8_t* base = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  uint8_t* q_tile = base;
  const mla_narrow::ThreadPlace t = mla_narrow::thread_place(threadIdx.x);
  uint8_t* p_tile = base + kNarrowPAt + t.warpgroup * kNarrowHeads * 128;  // this group's P^T
  float* scales = reinterpret_cast<float*>(base + kNarrowScalesAt);       // fp8: [2 stages][64]
  float* col_max = reinterpret_cast<float*>(base + kNarrowMaxAt) + t.warpgroup * 4 * kNarrowHeads;  // [warp][head]
  float* col_sum = reinterpret_cast<float*>(base + kNarrowSumAt) + t.warpgroup * 4 * kNarrowHeads;
  const int load_pos = t.tid >> 2;
  const int load_lane = t.tid & 3;
  const uint32_t q_addr = smem_address(q_tile);
  const uint32_t p_addr = smem_address(p_tile);

  const int seg_begin = d.cta_segment_start[blockIdx.y];
  const int seg_end = d.cta_segment_start[blockIdx.y + 1];
  for (int seg = seg_begin; seg < seg_end; ++seg) {
    const int row = d.segments[3 * seg];
    const int kv_begin = d.segments[3 * seg + 1];
    const int kv_end = d.segments[3 * seg + 2];
    const int32_t* table = d.block_tables + d.block_table_start[row];
    const int num_tiles = (kv_end - kv_begin + kTile - 1) / kTile;

    __syncthreads();  // the previous segment is done with every buffer
    mla_narrow::issue_q(q_tile, q, row, d.num_heads, t.tid);
    auto issue_tile = [&](int kv0, int stage) {
      issue_latent_tile<kFormat>(d, table, kv0, kv_end, base + kNarrowTilesAt, scales, stage, load_pos, load_lane);
    };
    issue_tile(kv_begin, 0);
    cp_async_commit();
    if (num_tiles > 1) issue_tile(kv_begin + kTile, 1);
    cp_async_commit();

    mla_narrow::SegmentState st;
    mla_narrow::reset(st);
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int kv0 = kv_begin + tile * kTile;
      const int stage = tile & 1;
      cp_async_wait<1>();
      float pos_scale[2] = {1.0f, 1.0f};  // fp8: scales of the 2 rows
      uint8_t* kv_tile;
      if constexpr (!kFp8) {
        fence_proxy_async_shared();
        __syncthreads();
        kv_tile = base + kNarrowTilesAt + stage * kTileBytes;
      } else {
        __syncthreads();
        kv_tile = base + kNarrowTilesAt;
        if constexpr (kFormat == kFp8FlashMla) convert_flash_tile(kv_tile, stage, load_pos, load_lane);
        else convert_fp8_tile(kv_tile, stage, load_pos, load_lane);
        fence_proxy_async_shared();
        __syncthreads();
        if constexpr (kFormat == kFp8Vector) {
          // The scales leave the staging area (every thread's, hence the barrier)
          // before tile + 2's copies overwrite it. (FlashMLA records were
          // dequantized whole by the conversion.)
          pos_scale[0] = scales[stage * kTile + t.row0];
          pos_scale[1] = scales[stage * kTile + t.row0 + 8];
          __syncthreads();
        }
        if (tile + 2 < num_tiles) issue_tile(kv0 + 2 * kTile, stage);
        cp_async_commit();
      }
      const uint32_t kv_addr = smem_address(kv_tile);
      auto block_addr = [&](int c) { return kv_addr + uint32_t(c * kBlockBytes); };

      float s[8];
      mla_narrow::s_half(s, t, q_addr, block_addr, [](int) { return false; });  // the tile has landed whole
      mla_narrow::add_other_half(s, base + kNarrowPartialAt, t.tid, [] { __syncthreads(); });
      mla_narrow::softmax_tile(s, st, t, kv_end - kv0, pos_scale, d.scale_log2, col_max, p_tile);
      mla_narrow::pv(st, t, p_addr, block_addr);
      if constexpr (!kFp8) {
        __syncthreads();
        if (tile + 2 < num_tiles) issue_tile(kv0 + 2 * kTile, stage);
        cp_async_commit();
      }
    }
    mla_narrow::finish_segment(d, st, t, seg, row, col_sum, out);
  }
#endif
}

// Combines the segments of split rows: one CTA per (row, head), 128 threads x 4 dims.
// A row without segments (a fixed plan's padding row) gets zeros.
__global__ void __launch_bounds__(128) mla_decode_merge_kernel(const MlaDecodeDescriptor d,
                                                               __nv_bfloat16* __restrict__ out) {
  wait_for_prior_grids();  // a programmatic launch (programmatic_merge) starts before the decode grid ends
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  // Records, not segments: a segment has partials_per_segment of them.
  const int per = d.partials_per_segment;
  const int first = d.row_segment_start[row] * per;
  const int count = d.row_segment_start[row + 1] * per - first;
  if (count == 1) return;  // one segment of one record: the kernel wrote the row
  if (count <= 0) {
    mla_merge::zero_item(d, row, head, threadIdx.x, out);
    return;
  }
  mla_merge::combine_item<false>(d, row, first, count, head, threadIdx.x, out);
}

template <bool kFp8>
cudaError_t prepare_one() {
  static const cudaError_t prepared = [] {
    constexpr int kFirst = kFp8 ? kFp8Vector : kBf16;
    cudaError_t e =
        cudaFuncSetAttribute(mla_decode_kernel<kFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) return e;
    e = cudaFuncSetAttribute(mla_decode_narrow_kernel<kFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kNarrowSmemBytes);
    if (e != cudaSuccess || !kFp8) return e;
    e = cudaFuncSetAttribute(mla_decode_kernel<kFp8FlashMla>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(mla_decode_narrow_kernel<kFp8FlashMla>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kNarrowSmemBytes);
  }();
  return prepared;
}

}  // namespace

cudaError_t prepare_mla_decode_kernels() {
  cudaError_t e = prepare_one<false>();
  if (e == cudaSuccess) e = prepare_one<true>();
  if (e == cudaSuccess) e = prepare_mla_decode_tma_kernel();
  return e == cudaSuccess ? prepare_mla_decode_tma_fp8_kernel() : e;
}

cudaError_t launch_mla_decode(const MlaDecodeDescriptor& d, const void* q, void* out, cudaStream_t stream) {
  const bool fp8 = d.latent_element == KvElement::kFP8E4M3;
  if (!fp8 && d.latent_element != KvElement::kBF16) return cudaErrorInvalidValue;
  const bool flash = d.latent_layout == MlaLatentLayout::kFlashMla656;
  if (flash && !fp8) return cudaErrorInvalidValue;
  if (d.latent_layout == MlaLatentLayout::kBf16SwizzledPages && (fp8 || d.block_size % 8 != 0))
    return cudaErrorInvalidValue;
  if (fp8 && !flash && d.latent_scale == nullptr) return cudaErrorInvalidValue;
  // With the merge paired (cluster pairs trade records in shared memory) no record reaches the workspace.
  const bool merge = (d.max_splits > 1 && !d.paired_merge) || d.partials_per_segment > 1;
  if (d.partials_per_segment != mla_decode_partials_per_segment(d.kernel)) return cudaErrorInvalidValue;
  if (merge && d.workspace == nullptr) return cudaErrorInvalidValue;
  if (d.fused_merge && (!mla_decode_can_fuse_merge(d.kernel) || d.merge_counters == nullptr))
    return cudaErrorInvalidValue;
  if (d.paired_merge && (d.fused_merge || !mla_decode_can_pair_merge(d.kernel) || d.num_ctas % 2 != 0))
    return cudaErrorInvalidValue;
  const cudaError_t prepared = fp8 ? prepare_one<true>() : prepare_one<false>();
  if (prepared != cudaSuccess) return prepared;
  if (d.num_ctas == 0) return cudaSuccess;
  const dim3 grid((d.num_heads + kHeads - 1) / kHeads, d.num_ctas);
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  if (d.kernel == MlaDecodeKernel::kTmaFp8) {
    const cudaError_t e = launch_mla_decode_tma_fp8_main(d, q, out, stream);
    if (e != cudaSuccess) return e;
  } else if (is_tma_kernel(d.kernel)) {
    // The plan chose it (its domain checked there): a failure here (no tensor
    // map for this pool) is the caller's error, not a silent fallback.
    const cudaError_t e = launch_mla_decode_tma_main(d, q, out, stream);
    if (e != cudaSuccess) return e;
  } else if (d.num_heads <= kNarrowHeads) {
    if (flash) mla_decode_narrow_kernel<kFp8FlashMla><<<grid, kThreads, kNarrowSmemBytes, stream>>>(d, qb, ob);
    else if (fp8) mla_decode_narrow_kernel<kFp8Vector><<<grid, kThreads, kNarrowSmemBytes, stream>>>(d, qb, ob);
    else mla_decode_narrow_kernel<kBf16><<<grid, kThreads, kNarrowSmemBytes, stream>>>(d, qb, ob);
  } else if (flash) {
    mla_decode_kernel<kFp8FlashMla><<<grid, kThreads, kSmemBytes, stream>>>(d, qb, ob);
  } else if (fp8) {
    mla_decode_kernel<kFp8Vector><<<grid, kThreads, kSmemBytes, stream>>>(d, qb, ob);
  } else {
    mla_decode_kernel<kBf16><<<grid, kThreads, kSmemBytes, stream>>>(d, qb, ob);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !merge || d.fused_merge || d.paired_merge) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(d.num_rows, d.num_heads);
  config.blockDim = dim3(128);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = d.programmatic_merge ? 1 : 0;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, mla_decode_merge_kernel, d, ob);
}

}  // namespace pagoda::kernels::cuda
