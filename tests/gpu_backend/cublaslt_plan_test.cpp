// The large-m autotuning's row buckets (cublaslt_plan.h): the smallest power of
// two >= m, so m = 2^j tunes the top of its bucket and the scheduler's step
// sizes (mixed steps of a little under 8K or 16K tokens) share one tuning.

#include <gtest/gtest.h>

#include "pagoda/backend/cuda/cublaslt_plan.h"

namespace pagoda::cuda {
namespace {

TEST(LtRowBucket, SmallestPowerOfTwoAtLeastM) {
  EXPECT_EQ(lt_row_bucket(1), 1);
  EXPECT_EQ(lt_row_bucket(513), 1024);
  EXPECT_EQ(lt_row_bucket(1024), 1024);
  EXPECT_EQ(lt_row_bucket(1025), 2048);
  EXPECT_EQ(lt_row_bucket(7900), 8192);
  EXPECT_EQ(lt_row_bucket(8193), 16384);
  EXPECT_EQ(lt_row_bucket(15755), 16384);
  EXPECT_EQ(lt_row_bucket(16384), 16384);
}

}  // namespace
}  // namespace pagoda::cuda
