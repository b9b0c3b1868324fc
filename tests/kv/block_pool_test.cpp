#include "pagoda/kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "kv_test_util.h"

namespace pagoda::kv {
namespace {

TEST(BlockPool, AllocatesEveryBlockOnceThenRunsDry) {
  BlockPool pool(8);
  std::set<BlockId> seen;
  for (int i = 0; i < 8; ++i) {
    const BlockId b = pool.allocate();
    ASSERT_NE(b, kNoBlock);
    EXPECT_TRUE(seen.insert(b).second) << "block " << b << " handed out twice";
  }
  EXPECT_EQ(pool.allocate(), kNoBlock);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, FreedBlockComesBackWithCleanMetadata) {
  BlockPool pool(2);
  const BlockId b = pool.allocate();
  pool.meta(b).key_hash = 42;
  pool.meta(b).reuse_count = 7;
  pool.meta(b).key_hash = 0;  // a caller uncaches before freeing
  pool.free(b);
  PAGODA_EXPECT_OK(pool.verify_integrity());
  const BlockId again = pool.allocate();
  EXPECT_EQ(again, b);  // LIFO: the warm block first
  EXPECT_EQ(pool.meta(again).reuse_count, 0u);
  EXPECT_FALSE(pool.meta(again).is_cached());
}

TEST(BlockPool, VerifyIntegrityCatchesAReferencedFreeBlock) {
  BlockPool pool(4);
  const BlockId b = pool.allocate();
  pool.free(b);
  pool.meta(b).ref_count = 1;  // corrupt on purpose
  EXPECT_FALSE(pool.verify_integrity().ok());
}

}  // namespace
}  // namespace pagoda::kv
