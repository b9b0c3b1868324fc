// Prompt scoring on the GPU (backend/cuda/sampling.h, score_rows) against the
// CPU's engine::score_token on the same rows: the rank and the top tokens
// exactly (ties by id), the logprobs within 1e-5, at vocabularies of 128,256
// (the Llama-3 one), 1,000, 37 (not a multiple of 4: scalar loads) and 5 (top
// k above the vocabulary), with heavy ties, -inf logits and NaN logits (which
// count as -inf: compared against the CPU on the cleaned row).

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/sampling.h"
#include "pagoda/engine/sampler.h"

namespace pagoda::cuda {
namespace {

using testing::to_device;
using testing::to_host;

struct Case {
  std::vector<float> row;
  int32_t token = 0;
  int32_t top_k = 0;
};

std::vector<GpuRowScore> score_on_gpu(const std::vector<Case>& cases, int32_t vocab) {
  std::vector<float> logits;
  std::vector<GpuScoreRequest> requests;
  // Rows in reverse order of the requests: a request names its row, not its index.
  for (size_t i = cases.size(); i-- > 0;) logits.insert(logits.end(), cases[i].row.begin(), cases[i].row.end());
  for (size_t i = 0; i < cases.size(); ++i)
    requests.push_back({static_cast<int32_t>(cases.size() - 1 - i), cases[i].token, cases[i].top_k});
  DeviceBuffer d_logits = to_device(logits);
  DeviceBuffer d_requests = to_device(requests);
  auto d_scores = DeviceBuffer::allocate(cases.size() * sizeof(GpuRowScore));
  EXPECT_TRUE(d_scores.ok());
  EXPECT_EQ(score_rows(d_logits.as<float>(), vocab, d_requests.as<GpuScoreRequest>(),
                       static_cast<int32_t>(cases.size()), d_scores->as<GpuRowScore>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return to_host<GpuRowScore>(*d_scores, cases.size());
}

// Within 1e-5, or the same infinity (a -inf logit among the top k scores -inf on both).
void expect_logprob(float got, float want) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want);
  } else {
    EXPECT_NEAR(got, want, 1e-5);
  }
}

void expect_cpu_scores(const std::vector<Case>& cases, int32_t vocab) {
  const std::vector<GpuRowScore> got = score_on_gpu(cases, vocab);
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<float> cleaned = cases[i].row;
    for (float& v : cleaned) v = std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
    const engine::SampledToken want = engine::score_token(cleaned, cases[i].token, cases[i].top_k);
    const GpuRowScore& g = got[i];
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " case " << i << " token " << cases[i].token
                                      << " top " << cases[i].top_k);
    expect_logprob(g.logprob, want.logprob);
    EXPECT_EQ(g.rank, want.rank);
    ASSERT_EQ(g.top_count, static_cast<int32_t>(want.top_logprobs.size()));
    for (int32_t t = 0; t < g.top_count; ++t) {
      EXPECT_EQ(g.top_tokens[t], want.top_logprobs[static_cast<size_t>(t)].token) << "place " << t;
      SCOPED_TRACE(::testing::Message() << "place " << t);
      expect_logprob(g.top_logprobs[t], want.top_logprobs[static_cast<size_t>(t)].logprob);
    }
  }
}

// Rows of one vocabulary: smooth random logits, heavily tied ones (multiples of 0.5 in a narrow range),
// a row with -inf and NaN holes, and a row whose token is the unique best; top k from 0 to 20.
std::vector<Case> cases_for(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<Case> out;
  const int32_t ks[] = {0, 1, 5, 20};
  for (int32_t k : ks) {
    Case smooth;
    smooth.row.resize(static_cast<size_t>(vocab));
    for (float& v : smooth.row) v = normal(rng);
    smooth.token = id(rng);
    smooth.top_k = k;
    out.push_back(smooth);

    Case tied;
    tied.row.resize(static_cast<size_t>(vocab));
    for (float& v : tied.row) v = 0.5f * static_cast<float>(static_cast<int>(std::fabs(normal(rng))));
    tied.token = id(rng);
    tied.top_k = k;
    out.push_back(tied);

    Case holes = smooth;
    for (int32_t j = 0; j < vocab; j += 3) holes.row[static_cast<size_t>(j)] = -std::numeric_limits<float>::infinity();
    for (int32_t j = 1; j < vocab; j += 7) holes.row[static_cast<size_t>(j)] = std::numeric_limits<float>::quiet_NaN();
    holes.token = 2 % vocab;  // a finite logit (j % 3 == 2, j % 7 != 1 for j = 2)
    out.push_back(holes);

    Case best = smooth;
    best.token = id(rng);
    best.row[static_cast<size_t>(best.token)] = 40.0f;
    out.push_back(best);
  }
  return out;
}

TEST(GpuPromptScoring, MatchesTheCpuScoreAtTheLlama3Vocabulary) {
  PAGODA_SKIP_WITHOUT_GPU();
  expect_cpu_scores(cases_for(128256, 1), 128256);
}

TEST(GpuPromptScoring, MatchesTheCpuScoreAtSmallAndOddVocabularies) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (int32_t vocab : {1000, 37, 5}) expect_cpu_scores(cases_for(vocab, static_cast<uint32_t>(vocab)), vocab);
}

TEST(GpuPromptScoring, AnAllTiedRowRanksEveryTokenAndKeepsTheLowestIds) {
  PAGODA_SKIP_WITHOUT_GPU();
  Case flat;
  flat.row.assign(4099, 1.25f);
  flat.token = 4000;
  flat.top_k = 20;
  const GpuRowScore g = score_on_gpu({flat}, 4099)[0];
  EXPECT_EQ(g.rank, 4099);
  EXPECT_NEAR(g.logprob, -std::log(4099.0f), 1e-5);
  ASSERT_EQ(g.top_count, 20);
  for (int32_t t = 0; t < 20; ++t) EXPECT_EQ(g.top_tokens[t], t);
}

}  // namespace
}  // namespace pagoda::cuda
