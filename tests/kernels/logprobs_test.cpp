#include "pagoda/backend/cpu/kernels/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/random_data.h"

namespace pagoda::kernels {
namespace {

TEST(LogprobsTest, LogSoftmaxMatchesDefinition) {
  const auto logits = testing::random_values(1000, 5, -30.0f, 30.0f);
  std::vector<float> out(logits.size());
  log_softmax(logits.data(), out.data(), logits.size());
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(out[i], logits[i] - std::log(z), 1e-4);
    total += std::exp(double(out[i]));
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
}

TEST(LogprobsTest, LogSoftmaxStableForHugeLogits) {
  std::vector<float> logits = {1e30f, 1e30f, -1e30f};
  log_softmax(logits.data(), logits.data(), logits.size());
  EXPECT_NEAR(logits[0], -std::log(2.0f), 1e-6);
  EXPECT_TRUE(std::isfinite(logits[1]));
}

TEST(LogprobsTest, TopKOrderAndTies) {
  const std::vector<float> row = {0.1f, 3.0f, -2.0f, 3.0f, 2.5f};
  const auto top = top_k(row.data(), row.size(), 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);  // tie with id 3: lower id first
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 4);
  EXPECT_FLOAT_EQ(top[2].second, 2.5f);
  EXPECT_EQ(top_k(row.data(), row.size(), 10).size(), 5u);
  EXPECT_EQ(argmax(row.data(), row.size()), 1);
}

}  // namespace
}  // namespace pagoda::kernels
