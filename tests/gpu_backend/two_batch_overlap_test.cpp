// Two-batch overlap (two_batch_overlap.h) inside the whole-model GPU forward (label gpu): one random
// checkpoint, two CudaModels from the same seed, one with PAGODA_TWO_BATCH_OVERLAP=128 (graph decode
// steps of bucket >= 128 run as two half-batches on two streams) and one without. Over decode steps at
// buckets 160 (two lanes, the second with padding rows), 128 (two lanes of 64) and 112 (one lane on
// both): the logits are the same bits where the lanes' GEMMs run the whole step's arithmetic (bf16
// weights always; fp8 weights until lanes of 64 rows switch the fp8 GEMM's scale mode, then within a
// bound), the greedy tokens agree wherever the top-1 margin is clear, and the overlap model counts its
// two-lane steps (so the comparison is not vacuous). bf16 and fp8 weights, bf16 and fp8 KV: the fused
// fp8 input quantization writes each lane's part of the shared fp8 input buffer, where two lanes at
// projections of different widths once overlapped (a race this test caught).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/model/model_config.h"

namespace pagoda::cuda {
namespace {

using testing::append_sequence;
using testing::relative_max_error;

constexpr int32_t kVocab = 1024;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kMaxSeqs = 160;
constexpr int32_t kBlocksPerSeq = 8;  // 128 tokens: prompts <= 48 + 40 decode steps
constexpr int32_t kNumBlocks = kMaxSeqs * kBlocksPerSeq + 8;

ModelConfig small_llama() {
  const nlohmann::json json = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", kVocab},
                               {"hidden_size", 512}, {"intermediate_size", 1024}, {"num_hidden_layers", 3},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 128},
                               {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-5},
                               {"rope_theta", 500000.0}, {"tie_word_embeddings", false},
                               {"torch_dtype", "bfloat16"}};
  auto config = parse_model_config(json, "two_batch_overlap_test");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return *config;
}

CudaModelOptions options(DType kv, bool fp8_weights) {
  CudaModelOptions o;
  o.kv_key_dtype = o.kv_value_dtype = kv;
  o.fp8_weights = fp8_weights;
  o.max_num_tokens = 2048;
  o.max_num_seqs = kMaxSeqs;
  o.max_model_len = kBlocksPerSeq * kBlockSize;
  o.block_size = kBlockSize;
  o.use_cuda_graphs = true;
  o.fast_attention = true;
  o.show_progress = false;
  return o;
}


std::vector<int32_t> table_of(int32_t seq) {
  std::vector<int32_t> t(kBlocksPerSeq);
  // Interleaved across sequences, so neighbouring rows read scattered blocks.
  for (int32_t j = 0; j < kBlocksPerSeq; ++j) t[static_cast<size_t>(j)] = j * kMaxSeqs + seq;
  return t;
}

struct Case {
  const char* name;
  DType kv;
  bool fp8_weights;
  double bound;  // relative max logit error, two lanes vs one, once lanes of 64 rows have run
};

class TwoBatchOverlapModel : public ::testing::TestWithParam<Case> {};

TEST_P(TwoBatchOverlapModel, MatchesTheOneLaneModelAcrossBuckets) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  const Case& c = GetParam();
  const ModelConfig config = small_llama();
  ::setenv("PAGODA_TWO_BATCH_OVERLAP", "0", 1);
  auto plain = CudaModel::create_random(config, 21, options(c.kv, c.fp8_weights));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  ::setenv("PAGODA_TWO_BATCH_OVERLAP", "128", 1);
  auto overlap = CudaModel::create_random(config, 21, options(c.kv, c.fp8_weights));
  ::unsetenv("PAGODA_TWO_BATCH_OVERLAP");
  ASSERT_TRUE(overlap.ok()) << overlap.status().to_string();
  auto plain_pool = CudaKvPool::create((*plain)->kv_pool_shape(kNumBlocks));
  auto overlap_pool = CudaKvPool::create((*overlap)->kv_pool_shape(kNumBlocks));
  ASSERT_TRUE(plain_pool.ok() && overlap_pool.ok());

  // Prompts of 8-47 tokens for 150 sequences, prefilled in batches of at most 2,048 tokens.
  const int32_t n = 150;
  std::vector<int32_t> length(n), next(n);
  std::vector<float> lp, lo;
  for (int32_t first = 0; first < n;) {
    ForwardBatch prefill;
    int32_t s = first;
    for (; s < n; ++s) {
      length[static_cast<size_t>(s)] = 8 + (s * 7) % 40;
      if (prefill.num_tokens() + length[static_cast<size_t>(s)] > 2048) break;
      std::vector<int32_t> prompt(static_cast<size_t>(length[static_cast<size_t>(s)]));
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((s * 131 + i * 17) % kVocab);
      append_sequence(prefill, prompt, 0, table_of(s), false);
    }
    ASSERT_TRUE((*plain)->forward(prefill, **plain_pool, lp).ok());
    ASSERT_TRUE((*overlap)->forward(prefill, **overlap_pool, lo).ok());
    for (int32_t r = first; r < s; ++r) {
      const float* row = lp.data() + static_cast<size_t>(r - first) * kVocab;
      next[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
    }
    first = s;
  }

  // Decode steps: 150 and 129 sequences (bucket 160), 120 (bucket 128), 100 (bucket 112, one lane).
  const std::vector<int32_t> live_by_step = {150, 150, 150, 150, 129, 129, 129, 120, 120, 120, 100, 100};
  double worst = 0;
  int32_t compared = 0, agreed = 0, two_lane_steps = 0;
  for (size_t step = 0; step < live_by_step.size(); ++step) {
    const int32_t live = live_by_step[step];
    ForwardBatch decode;
    for (int32_t s = 0; s < live; ++s) {
      int32_t& len = length[static_cast<size_t>(s)];
      append_sequence(decode, {next[static_cast<size_t>(s)]}, len, table_of(s), false);
      ++len;
    }
    // Sequences past `live` have finished: their lengths stay, and later steps leave them out.
    const Status sp = (*plain)->forward(decode, **plain_pool, lp);
    const Status so = (*overlap)->forward(decode, **overlap_pool, lo);
    ASSERT_TRUE(sp.ok()) << sp.to_string();
    ASSERT_TRUE(so.ok()) << so.to_string();
    ASSERT_EQ(lp.size(), lo.size());
    two_lane_steps += live > 112 ? 1 : 0;
    const double err = relative_max_error(lo, lp);
    worst = std::max(worst, err);
    std::cout << "[ figure ] " << c.name << " step " << step << " (" << live << " sequences): " << err << "\n";
    // Bucket 160 splits into lanes of 80 rows, whose GEMMs keep the whole step's fp8 scale mode: the
    // same bits. From the first bucket-128 step on, fp8 lanes of 64 rows take the epilogue scale mode
    // (fp8_gemm.h, kEpilogueMaxRows), which rounds differently, and the KV they wrote carries it on.
    const double bound = live > 128 && step < 7 ? 0.0 : c.bound;
    EXPECT_LE(err, bound) << c.name << " step " << step << " with " << live << " sequences";
    for (int32_t r = 0; r < live; ++r) {
      const float* want = lp.data() + static_cast<size_t>(r) * kVocab;
      const float* got = lo.data() + static_cast<size_t>(r) * kVocab;
      std::vector<float> sorted(want, want + kVocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const int32_t want_token = static_cast<int32_t>(std::max_element(want, want + kVocab) - want);
      const int32_t got_token = static_cast<int32_t>(std::max_element(got, got + kVocab) - got);
      if (sorted[0] - sorted[1] > 0.02 * std::abs(sorted[0]) + 1e-3) {
        ++compared;
        agreed += want_token == got_token;
      }
      next[static_cast<size_t>(r)] = want_token;  // both models follow the one-lane model
    }
  }
  std::cout << "[ figure ] two-batch overlap " << c.name << ": worst relative logit error " << worst << ", "
            << agreed << "/" << compared << " clear-margin greedy tokens equal\n";
  EXPECT_EQ((*overlap)->two_batch_steps(), two_lane_steps);
  EXPECT_EQ((*plain)->two_batch_steps(), 0);
  EXPECT_GT(compared, 200);
  EXPECT_EQ(agreed, compared);
}

INSTANTIATE_TEST_SUITE_P(Weights, TwoBatchOverlapModel,
                         ::testing::Values(Case{"bf16", DType::kBF16, false, 0.0},
                                           Case{"bf16_fp8kv", DType::kFP8E4M3, false, 0.0},
                                           Case{"fp8_bf16kv", DType::kBF16, true, 3e-2},
                                           Case{"fp8_fp8kv", DType::kFP8E4M3, true, 3e-2}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// A bad value is a clear error at load.
TEST(TwoBatchOverlapModel, RejectsABucketBelowTheSmallest) {
  PAGODA_SKIP_WITHOUT_GPU();
  ::setenv("PAGODA_TWO_BATCH_OVERLAP", "64", 1);
  auto model = CudaModel::create_random(small_llama(), 1, options(DType::kBF16, false));
  ::unsetenv("PAGODA_TWO_BATCH_OVERLAP");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("PAGODA_TWO_BATCH_OVERLAP=64"), std::string::npos)
      << model.status().to_string();
}

}  // namespace
}  // namespace pagoda::cuda
