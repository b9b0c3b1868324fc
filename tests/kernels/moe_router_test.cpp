// The DeepSeek MoE router against hand-worked cases: V2 softmax greedy and
// group-limited, V3 sigmoid with the correction bias (which picks experts but
// never weighs them), group ranking by the top-two sum, norm_topk_prob and the
// routed scaling factor.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pagoda/backend/cpu/kernels/moe_router.h"

namespace pagoda::kernels {
namespace {

struct Routed {
  std::vector<int32_t> indices;
  std::vector<float> weights;
};

Routed route(const std::vector<float>& logits, const MoeConfig& c, const std::vector<float>& bias = {}) {
  const size_t tokens = logits.size() / static_cast<size_t>(c.num_experts);
  Routed r;
  r.indices.resize(tokens * static_cast<size_t>(c.experts_per_token));
  r.weights.resize(r.indices.size());
  moe_route(logits.data(), tokens, c, bias.empty() ? nullptr : bias.data(), r.indices.data(), r.weights.data());
  return r;
}

std::vector<float> softmax(const std::vector<float>& x) {
  double sum = 0;
  for (float v : x) sum += std::exp(v);
  std::vector<float> out;
  for (float v : x) out.push_back(static_cast<float>(std::exp(v) / sum));
  return out;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

MoeConfig v2(int32_t experts, int32_t k) {
  MoeConfig c;
  c.num_experts = experts;
  c.experts_per_token = k;
  c.scoring = MoeScoring::kSoftmax;
  return c;
}

TEST(MoeRouterTest, V2GreedyPicksTheLargestSoftmaxScoresUnnormalizedAndScaled) {
  MoeConfig c = v2(6, 2);
  c.routed_scaling_factor = 16.0f;
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f};
  const Routed r = route(logits, c);
  const auto p = softmax(logits);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{1, 5}));
  EXPECT_NEAR(r.weights[0], p[1] * 16.0f, 1e-5);
  EXPECT_NEAR(r.weights[1], p[5] * 16.0f, 1e-5);
}

TEST(MoeRouterTest, V2GroupLimitedRanksGroupsByTheirBestScore) {
  MoeConfig c = v2(8, 2);
  c.group_score = MoeGroupScore::kMax;
  c.num_groups = 4;
  c.topk_groups = 1;
  // Groups {0,1} {2,3} {4,5} {6,7}: group 2 holds the single best expert (5); the
  // second-best expert overall (0) is in another group and must not be picked.
  const std::vector<float> logits = {2.5f, 2.4f, 0.0f, 0.0f, -3.0f, 3.0f, 1.0f, 1.0f};
  const Routed r = route(logits, c);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{5, 4}));
  const auto p = softmax(logits);
  EXPECT_NEAR(r.weights[1], p[4], 1e-6);
}

TEST(MoeRouterTest, V3BiasChoosesTheExpertsButTheSigmoidScoreWeighsThem) {
  MoeConfig c;
  c.num_experts = 4;
  c.experts_per_token = 2;
  c.scoring = MoeScoring::kSigmoid;
  c.score_correction_bias = true;
  c.group_score = MoeGroupScore::kTopTwoSum;
  c.num_groups = 1;
  c.topk_groups = 1;
  c.routed_scaling_factor = 2.5f;
  const std::vector<float> logits = {1.0f, 0.9f, -2.0f, 0.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 2.0f, 0.0f};  // lifts expert 2 to the top
  const Routed r = route(logits, c, bias);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{2, 0}));
  EXPECT_NEAR(r.weights[0], sigmoid(-2.0f) * 2.5f, 1e-6);
  EXPECT_NEAR(r.weights[1], sigmoid(1.0f) * 2.5f, 1e-6);

  c.norm_topk_prob = true;
  const Routed n = route(logits, c, bias);
  const float sum = sigmoid(-2.0f) + sigmoid(1.0f);
  EXPECT_NEAR(n.weights[0], sigmoid(-2.0f) / sum * 2.5f, 1e-6);
  EXPECT_NEAR(n.weights[0] + n.weights[1], 2.5f, 1e-5);
}

TEST(MoeRouterTest, V3GroupsRankByTheSumOfTheirTwoBestChoices) {
  MoeConfig c;
  c.num_experts = 6;
  c.experts_per_token = 2;
  c.scoring = MoeScoring::kSigmoid;
  c.group_score = MoeGroupScore::kTopTwoSum;
  c.num_groups = 2;
  c.topk_groups = 1;
  // Group 0 {0,1,2} has the single best expert (0) but group 1 {3,4,5} the better pair.
  const std::vector<float> logits = {4.0f, -4.0f, -4.0f, 2.0f, 2.0f, -4.0f};
  const Routed r = route(logits, c);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{3, 4}));  // ties: the lower index first
}

TEST(MoeRouterTest, EveryTokenIsRoutedOnItsOwn) {
  MoeConfig c = v2(4, 1);
  const std::vector<float> logits = {0, 1, 0, 0, /**/ 3, 0, 0, 0, /**/ 0, 0, 0, 5};
  const Routed r = route(logits, c);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{1, 0, 3}));
}

}  // namespace
}  // namespace pagoda::kernels

namespace pagoda::kernels {
namespace {

TEST(MoeRouterTest, NanLogitsStillGiveValidDistinctExperts) {
  MoeConfig c;
  c.num_experts = 4;
  c.experts_per_token = 2;
  c.scoring = MoeScoring::kSigmoid;
  const std::vector<float> logits = {NAN, 1.0f, NAN, 0.5f};
  std::vector<int32_t> indices(2);
  std::vector<float> weights(2);
  moe_route(logits.data(), 1, c, nullptr, indices.data(), weights.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{1, 3}));
}

}  // namespace
}  // namespace pagoda::kernels
