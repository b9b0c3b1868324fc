// The bf16 MLA latent pool's two block layouts (runtime/mla_latent_layout.h): swizzled pages keep every
// block in its own bytes and give every (row, chunk) its own 16 bytes, equal token-major at one token a
// block, round-trip through the host re-layout, put each 128-byte column block of a page in one piece
// with the wgmma 128-byte swizzle; pools and models that disagree on the layout are refused by name,
// and no pool with swizzled pages can exist before a kernel reads them.

#include <cstddef>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/runtime/batch_validation.h"
#include "pagoda/runtime/mla_latent_layout.h"

namespace pagoda::runtime {
namespace {

constexpr MlaLatentPages kToken = MlaLatentPages::kTokenMajor;
constexpr MlaLatentPages kSwizzled = MlaLatentPages::kSwizzled128;

TEST(MlaLatentLayout, SwizzledPagesAreABijectionInsideEachBlock) {
  for (const int32_t bs : {8, 16, 64, 128}) {
    const int32_t head_dim = 576, chunks = head_dim / 8, blocks = 3;
    const int64_t block_bytes = static_cast<int64_t>(bs) * head_dim * 2;
    std::set<int64_t> seen;
    for (int64_t slot = 0; slot < static_cast<int64_t>(blocks) * bs; ++slot) {
      for (int32_t c = 0; c < chunks; ++c) {
        const int64_t at = mla_latent_chunk_offset(kSwizzled, slot, bs, head_dim, c);
        ASSERT_EQ(at % 16, 0);
        ASSERT_EQ(at / block_bytes, slot / bs) << "a row stays in its own block's bytes";
        ASSERT_TRUE(seen.insert(at).second) << "bs " << bs << " slot " << slot << " chunk " << c;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), blocks * bs * chunks) << "every 16 bytes of the pool used once";
  }
}

TEST(MlaLatentLayout, AColumnBlockIsOneContiguousPieceWithTheWgmmaSwizzle) {
  // Column block cb (values [64 cb, 64 cb + 64)) of block b: bs rows of 128 bytes in a row, row r's
  // chunk c (8 values) at physical chunk c ^ (r % 8): what a 128-byte-swizzled TMA box holds.
  const int32_t bs = 64, head_dim = 576;
  const int64_t b = 5;
  for (int32_t cb = 0; cb < head_dim / 64; ++cb) {
    const int64_t start = b * bs * head_dim * 2 + static_cast<int64_t>(cb) * bs * 128;
    for (int32_t r = 0; r < bs; ++r)
      for (int32_t c = 0; c < 8; ++c)
        EXPECT_EQ(mla_latent_chunk_offset(kSwizzled, b * bs + r, bs, head_dim, cb * 8 + c),
                  start + r * 128 + ((c ^ (r % 8)) * 16));
  }
}

TEST(MlaLatentLayout, TokenMajorIsTheRowMajorPool) {
  EXPECT_EQ(mla_latent_chunk_offset(kToken, 0, 16, 576, 0), 0);
  EXPECT_EQ(mla_latent_chunk_offset(kToken, 37, 16, 576, 5), 37 * 1152 + 80);
}

TEST(MlaLatentLayout, RelayoutRoundTripsAndDiffersFromTokenMajor) {
  const int32_t bs = 16, head_dim = 576, blocks = 4;
  const size_t bytes = static_cast<size_t>(blocks) * bs * head_dim * 2;
  std::vector<std::byte> pool(bytes), swizzled(bytes), back(bytes);
  for (size_t i = 0; i < bytes; ++i) pool[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  mla_latent_relayout(pool.data(), swizzled.data(), blocks, bs, head_dim, kToken, kSwizzled);
  mla_latent_relayout(swizzled.data(), back.data(), blocks, bs, head_dim, kSwizzled, kToken);
  EXPECT_EQ(back, pool);
  EXPECT_NE(swizzled, pool) << "the layouts differ wherever a block holds more than one token";
  // Value i of token 21 (block 1, row 5) read through the swizzled layout is the token-major one.
  const int64_t slot = 21;
  for (int32_t i = 0; i < head_dim; i += 7) {
    const int64_t t = mla_latent_chunk_offset(kToken, slot, bs, head_dim, i / 8) + 2 * (i % 8);
    const int64_t s = mla_latent_chunk_offset(kSwizzled, slot, bs, head_dim, i / 8) + 2 * (i % 8);
    EXPECT_EQ(pool[static_cast<size_t>(t)], swizzled[static_cast<size_t>(s)]);
    EXPECT_EQ(pool[static_cast<size_t>(t) + 1], swizzled[static_cast<size_t>(s) + 1]);
  }
}

TEST(MlaLatentLayout, OneTokenABlockIsTheSameBytes) {
  // bs = 1 cannot take swizzled pages (bs % 8), but the formula gives token-major's bytes there.
  for (int64_t slot = 0; slot < 6; ++slot)
    for (int32_t c = 0; c < 72; ++c)
      EXPECT_EQ(mla_latent_chunk_offset(kSwizzled, slot, 1, 576, c), mla_latent_chunk_offset(kToken, slot, 1, 576, c));
}

TEST(MlaLatentLayout, SwizzledPagesApplyToBf16PoolsOf64WideRowsAndBlocksOf8) {
  EXPECT_TRUE(mla_swizzled_pages_apply(576, true, 64));
  EXPECT_TRUE(mla_swizzled_pages_apply(576, true, 16));
  EXPECT_TRUE(mla_swizzled_pages_apply(576, true, 8));
  EXPECT_FALSE(mla_swizzled_pages_apply(576, false, 64)) << "fp8 records stay token-major";
  EXPECT_FALSE(mla_swizzled_pages_apply(40, true, 16)) << "the tiny fixtures' 32 + 8";
  EXPECT_FALSE(mla_swizzled_pages_apply(576, true, 12));
  EXPECT_FALSE(mla_swizzled_pages_apply(576, true, 1));
}

TEST(MlaLatentLayout, UnaskedPoolsAreSwizzledWhereTheBulkKernelReadsThem) {
  // Pages of a multiple of 64 with at most 16 query heads (the bulk-copy decode kernel's domain): swizzled.
  for (int32_t bs : {64, 128, 256})
    for (int32_t heads : {1, 8, 16})
      EXPECT_EQ(mla_automatic_latent_pages(576, true, bs, heads), MlaLatentPages::kSwizzled128) << bs << " " << heads;
  // Smaller pages (cp.async on either layout), more heads (the wide cp.async kernel), fp8, narrow latents.
  for (int32_t bs : {8, 16, 32, 48}) EXPECT_EQ(mla_automatic_latent_pages(576, true, bs, 16), MlaLatentPages::kTokenMajor);
  EXPECT_EQ(mla_automatic_latent_pages(576, true, 64, 17), MlaLatentPages::kTokenMajor);
  EXPECT_EQ(mla_automatic_latent_pages(576, true, 64, 128), MlaLatentPages::kTokenMajor);
  EXPECT_EQ(mla_automatic_latent_pages(576, false, 64, 16), MlaLatentPages::kTokenMajor);
  EXPECT_EQ(mla_automatic_latent_pages(40, true, 64, 16), MlaLatentPages::kTokenMajor);
  EXPECT_EQ(mla_automatic_latent_pages(576, true, 64, 0), MlaLatentPages::kTokenMajor);
}

KvPoolShape latent_shape(MlaLatentPages pages) {
  KvPoolShape s;
  s.num_layers = 2;
  s.num_blocks = 8;
  s.block_size = 16;
  s.num_kv_heads = 1;
  s.head_dim = 576;
  s.key_dtype = s.value_dtype = DType::kBF16;
  s.latent = true;
  s.latent_rope_dim = 64;
  s.latent_pages = pages;
  return s;
}

TEST(MlaLatentLayout, APoolOfTheOtherLayoutIsRefusedByName) {
  const Status s = check_pool_matches(latent_shape(kToken), latent_shape(kSwizzled));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token-major pages"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("swizzled128 pages"), std::string::npos) << s.message();
  EXPECT_TRUE(check_pool_matches(latent_shape(kSwizzled), latent_shape(kSwizzled)).ok());
  EXPECT_EQ(latent_shape(kSwizzled).bytes_per_token(), latent_shape(kToken).bytes_per_token());
}

TEST(MlaLatentLayout, TheCpuPoolIsTokenMajorOnly) {
  auto pool = CpuKvPool::create(latent_shape(kSwizzled));
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("swizzled128"), std::string::npos) << pool.status().message();
  EXPECT_TRUE(CpuKvPool::create(latent_shape(kToken)).ok());
}

}  // namespace
}  // namespace pagoda::runtime
