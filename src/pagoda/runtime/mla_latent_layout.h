#pragma once
// How a bf16 MLA latent pool lays out the rows of a block (KvPoolShape::
// latent_pages; docs/MLA_SWIZZLED_PAGES.md). A block of `block_size` tokens
// takes block_size * head_dim * 2 bytes at the same place in both layouts:
//
//   token-major:   row r of block b at (b * block_size + r) * row_bytes, its 16-byte chunk c
//                  at + 16 c (row_bytes = 2 * head_dim);
//   swizzled128:   the block as head_dim / 64 column blocks of block_size rows x 128 bytes, the
//                  16-byte chunks of a row XOR-swizzled by the row (the 128-byte swizzle of TMA
//                  and wgmma): chunk c of row r at
//                  b * block_size * row_bytes + (c / 8) * block_size * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16,
//
// so that one column block of a page is one contiguous copy that lands in
// shared memory in the layout the tensor cores read (the planned bulk-copy
// decode kernel). A page stays one contiguous region, so whatever moves whole
// blocks (copy-on-write, the host tier, zeroing, disk and redis payloads) is
// the same for both; what reads or writes rows must know the layout.
// Swizzled pages apply to bf16 pools with head_dim a multiple of 64 and
// block_size a multiple of 8 (mla_swizzled_pages_apply); fp8, int8 and int4
// latent pools, and the CPU's, are token-major.
//
// Header-only; the offset is host + device. Thread safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "pagoda/runtime/kv_quant.h"  // PAGODA_HOST_DEVICE

namespace pagoda::runtime {

enum class MlaLatentPages : int32_t { kTokenMajor = 0, kSwizzled128 = 1 };

inline std::string_view mla_latent_pages_name(MlaLatentPages pages) {
  return pages == MlaLatentPages::kSwizzled128 ? "swizzled128" : "token-major";
}

// Byte offset, in a layer's latent pool, of 16-byte chunk `chunk` (8 bf16 values) of `slot`'s row
// (slot = block * block_size + row). Swizzled pages need block_size % 8 == 0 and head_dim % 64 == 0.
PAGODA_HOST_DEVICE int64_t mla_latent_chunk_offset(MlaLatentPages pages, int64_t slot, int32_t block_size,
                                                   int32_t head_dim, int32_t chunk) {
  const int64_t row_bytes = 2 * static_cast<int64_t>(head_dim);
  if (pages == MlaLatentPages::kTokenMajor) return slot * row_bytes + 16 * static_cast<int64_t>(chunk);
  const int64_t block = slot / block_size;
  const int32_t row = static_cast<int32_t>(slot - block * block_size);
  return block * block_size * row_bytes + static_cast<int64_t>(chunk >> 3) * block_size * 128 +
         static_cast<int64_t>(row) * 128 + static_cast<int64_t>(((chunk & 7) ^ (row & 7)) << 4);
}

// Whether a latent pool of these values, element type and block size can take swizzled pages.
inline bool mla_swizzled_pages_apply(int32_t head_dim, bool bf16, int32_t block_size) {
  return bf16 && head_dim > 0 && head_dim % 64 == 0 && block_size > 0 && block_size % 8 == 0;
}

// The layout a pool takes unless asked for one: swizzled pages where the decode kernel that reads them whole
// (the bulk-copy ping-pong kernel: at most 16 query heads, pages of a multiple of 64) applies and leads the
// token-major pool's tensor-map kernel (docs/BENCHMARKS.md: +4-5% on an H200, level to +1% on an H100, the
// V2-Lite engine level); token-major elsewhere (pages of 8 to 56 take cp.async on either layout).
inline MlaLatentPages mla_automatic_latent_pages(int32_t head_dim, bool bf16, int32_t block_size,
                                                int32_t num_q_heads) {
  const bool bulk = mla_swizzled_pages_apply(head_dim, bf16, block_size) && block_size % 64 == 0 &&
                    num_q_heads > 0 && num_q_heads <= 16;
  return bulk ? MlaLatentPages::kSwizzled128 : MlaLatentPages::kTokenMajor;
}

// Host re-layout of `num_blocks` blocks of bf16 latent rows from one layout to the other (tests, benches,
// a pool written one way and read the other). `src` and `dst` do not overlap; head_dim % 8 == 0.
inline void mla_latent_relayout(const std::byte* src, std::byte* dst, int32_t num_blocks, int32_t block_size,
                                int32_t head_dim, MlaLatentPages from, MlaLatentPages to) {
  const int32_t chunks = head_dim / 8;
  const int64_t slots = static_cast<int64_t>(num_blocks) * block_size;
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t c = 0; c < chunks; ++c)
      std::memcpy(dst + mla_latent_chunk_offset(to, s, block_size, head_dim, c),
                  src + mla_latent_chunk_offset(from, s, block_size, head_dim, c), 16);
}

}  // namespace pagoda::runtime
